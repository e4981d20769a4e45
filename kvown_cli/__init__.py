"""The ``kvown`` command line: one thin module per command (parse, call the library,
print). ``main`` dispatches; only the chosen command's module is imported, so the
model-check commands never import torch.

Commands: ``check``, ``list`` (``listing``), ``prove``, ``check-trace`` (``check_trace``),
``demo``, ``fuzz``, ``repro``. Exit codes: see ``kvown_cli.main``.
"""

from typing import Any

__all__ = ["COMMANDS", "main"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m kvown_cli.main` does not find its module imported already.
    if name in __all__:
        from kvown_cli import main as _main

        return getattr(_main, name)
    raise AttributeError(f"module 'kvown_cli' has no attribute {name!r}")

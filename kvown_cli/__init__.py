"""The ``kvown`` command line: one thin module per command (parse, call the library,
print). ``main`` dispatches (``kvown_cli.main.main(argv) -> exit code``, ``COMMANDS``, and
``entry()``, the executable); only the chosen command's module is imported, so the
model-check commands never import torch.

Commands: ``check``, ``list`` (``listing``), ``prove``, ``check-trace`` (``check_trace``),
``demo``, ``fuzz``, ``repro``, ``cluster``, ``mutate``, ``replay``. Exit codes: see
``kvown_cli.main``; the executable's first and last moments (a signal during the
imports, the exit without the interpreter's teardown): ``interrupt.lifetime``.
``progress``: the one progress display and table console of them all.
"""

import importlib
from typing import Any

from kvown_cli.interrupt import lifetime

if lifetime.is_executable():  # first: a signal in the imports is one line, exit 130
    lifetime.install()

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m kvown_cli.main` does not find its module imported already.
    if name in __all__:
        return importlib.import_module(f"kvown_cli.{name}")
    raise AttributeError(f"module 'kvown_cli' has no attribute {name!r}")

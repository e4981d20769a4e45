"""The ``kvown`` command line: one thin module per command (parse, call the library,
print). ``main`` dispatches; only the chosen command's module is imported, so the
model-check commands never import torch.

Commands: ``check``, ``list`` (``listing``), ``prove``, ``check-trace`` (``check_trace``),
``demo``, ``fuzz``, ``repro``.
"""

from kvown_cli.main import COMMANDS, main

__all__ = ["COMMANDS", "main"]

"""Longer views of the ``kvown`` commands that do not fit their command module: the graph
tour of ``kvown fuzz --tour`` (``fuzz_tour``: plan, tour under ``--seconds``, report)."""

import importlib
from typing import Any

__all__ = ["fuzz_tour"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # lazy: the tour imports torch
        return importlib.import_module(f"kvown_cli.reports.{name}")
    raise AttributeError(f"module 'kvown_cli.reports' has no attribute {name!r}")

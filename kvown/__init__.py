"""``python -m kvown``: the ``kvown`` command run as a module (``kvown/__main__.py``).

The command line itself is ``kvown_cli``; this package only gives it the project's name,
so ``python -m kvown check`` is ``kvown check``."""

__all__: list[str] = []

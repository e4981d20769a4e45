"""How ``kvown`` hears an interrupt: ``watch`` sees SIGINT/SIGTERM where they land, so
the bound on an interrupt's end holds while the main thread is inside a C call;
``lifetime``: the executable's first moments (a signal during the imports: one line, 130)
and its last (the exit without the interpreter's teardown). Both stdlib only."""

from kvown_cli.interrupt import lifetime, watch

__all__ = ["lifetime", "watch"]

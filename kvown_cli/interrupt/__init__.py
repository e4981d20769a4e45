"""How ``kvown`` hears an interrupt: ``watch`` sees SIGINT/SIGTERM where they land, so
the bound on an interrupt's end holds while the main thread is inside a C call."""

from kvown_cli.interrupt import watch

__all__ = ["watch"]

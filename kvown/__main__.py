"""``python -m kvown ...``: the same as the ``kvown`` executable."""

from kvown_cli.interrupt import lifetime

lifetime.install()  # before the imports: a signal in them is one line, exit 130

from kvown_cli.main import entry  # noqa: E402

if __name__ == "__main__":
    entry()

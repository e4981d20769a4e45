"""``python -m kvown ...``: the same as the ``kvown`` executable."""

from kvown_cli.main import entry

if __name__ == "__main__":
    entry()

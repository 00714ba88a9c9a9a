"""``python -m meta.run``: the door of the search (meta/search/run.py)."""
import sys

from meta.search.run import USAGE, main  # noqa: F401 (USAGE: the command's own text, read at its door)

if __name__ == "__main__":
    sys.exit(main())

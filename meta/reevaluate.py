"""``python -m meta.reevaluate run_dir=...``: the door of meta/search/after/reevaluate.py."""
import sys

from meta.search.after.reevaluate import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m meta.export run_dir=... which=best|center|best_member out=...``: the door of meta/search/after/export.py."""
import sys

from meta.search.after.export import main

if __name__ == "__main__":
    sys.exit(main())

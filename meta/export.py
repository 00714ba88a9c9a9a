"""``python -m meta.export run_dir=... which=best|center|best_member out=...``: the door of meta/after/export.py."""
import sys

from meta.after.export import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m meta.reevaluate run_dir=...``: the door of meta/after/reevaluate.py."""
import sys

from meta.after.reevaluate import main

if __name__ == "__main__":
    sys.exit(main())

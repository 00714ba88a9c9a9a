"""``python -m meta.early_cuts``: the door of the early-cut measurement (meta/pilot/early_cuts.py)."""
import sys

from meta.pilot.early_cuts import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m inner_loop.fingerprint [--check] [--write] [--keep-cache]``: the door of
inner_loop/numerics/fingerprint.py (does this machine compute as ours do?)."""
import sys

from inner_loop.numerics.fingerprint import main

if __name__ == "__main__":
    sys.exit(main())

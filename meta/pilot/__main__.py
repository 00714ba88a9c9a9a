"""``python -m meta.pilot``: see meta/pilot/cli.py."""
import sys

from meta.pilot.cli import main

sys.exit(main())

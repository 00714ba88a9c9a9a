"""``python -m meta.tune``: see meta/tune/cli.py."""
import sys

from meta.tune.cli import main

sys.exit(main())

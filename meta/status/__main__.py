"""``python -m meta.status``: see meta/status/view.py."""
import sys

from meta.status.view import main

sys.exit(main())

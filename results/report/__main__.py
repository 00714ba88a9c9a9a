"""``python -m results.report RUN_DIR``: the report of a search, a tune run or a pilot, whichever RUN_DIR holds."""
import sys

from results.report.pilot import is_pilot_request, main as pilot_main
from results.report.search.report import main

raise SystemExit(pilot_main() if is_pilot_request(sys.argv[1:]) else main())

"""``python -m results.report RUN_DIR``: the report of a search or of a tune run, whichever RUN_DIR holds."""
from results.report.search import main

raise SystemExit(main())

"""``python -m results.compare DIR...``: the command's door; the table is built in results/report/compare.py."""
from results.report.compare import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m meta.status``: what a search, a tuning or a pilot is doing (view.py), from the rows the three views
share (rows.py)."""

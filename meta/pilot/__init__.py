"""``python -m meta.pilot``: seed noise and the signal of one ES step before a search (cli.py), and its status view
(status.py)."""

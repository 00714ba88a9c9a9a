"""The vocabulary of a run's staging pins (manifest.json ``staged``), shared by whoever writes them (the entry
point's staging, inner_loop/member/staging.py) and whoever reads them (meta/search/staging.py, meta/stage.py); one owner, importing
nothing, so that the outer loop reads the pins without importing the inner loop."""

#: the manifest's key for the pins of a staged run
MANIFEST_KEY = "staged"
#: an item's ``status``: its snapshot is in the stage cache (pinned: commit, content hash, bytes)
STAGED = "staged"
#: ... not in the stage cache, or no longer holding the pinned bytes (``detail`` says which)
MISSING = "missing"
#: ... an extra evaluation's task that reads nothing from the hub (a transfer task whose data ships with a package
#: or is a local file): nothing to stage, listed so that a dry run names every transfer task
LOCAL = "local"

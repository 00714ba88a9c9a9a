"""One generation of the search: the state machine that asks, submits, waits and tells (orchestrator.py), its
shape (generation_shape.py: members, control, quorum count, early-stop capacity), the quorum clock
(generation_close.py), early stopping (early_stop.py) and the live view while it runs (live_watch.py)."""

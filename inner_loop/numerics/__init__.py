"""Pinned CPU numerics (pinned.py, docs/numerics.md) and the fingerprint that checks a machine computes as ours do
(fingerprint.py, against fingerprint.json; ``python -m inner_loop.fingerprint``)."""

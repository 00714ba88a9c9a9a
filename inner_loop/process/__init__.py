"""What a member's process is running under, read by the member, its training stages and the fingerprint alike:
the pinned CPU numerics (pinned.py), the job's end notice (notice.py) and its share of the card (gpu_share.py).
Below the member and the training stages, so neither reaches the other through them."""

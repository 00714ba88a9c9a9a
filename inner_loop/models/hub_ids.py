"""The hub ids of the models the presets load by name, in a module without torch: staging (inner_loop/member/staging.py)
reads them in a member's first, torch-free moments and on the submitting host."""
from __future__ import annotations

QWEN3_1_7B = "Qwen/Qwen3-1.7B"

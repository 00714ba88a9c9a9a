"""Generation backends side by side on one CPU member: HF generate vs transformers' continuous batching vs vLLM
colocate, on the real SmolLM2-135M-Instruct with the mbpp_qwen3 preset's settings shrunk to minutes on this CPU.

Why: generation is most of a GRPO step, and whether a faster backend pays off on this kind of machine decides
which one the rehearsal and the CPU presets use. Same model, prompts (the MBPP fixture), group size, completion
length and seed for every backend, each member a process of its own through the real member path; step time,
completion tokens/s and peak RSS, with ratios against HF generate. The measuring is bench/bench_member_gpu.py's
(this is its ``--model smollm2``, one member per backend); any of its options may follow and override these.

    .venv/bin/python bench/bench_generation.py
    .venv/bin/python bench/bench_generation.py --completion-length 128 --steps 4
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_member_gpu import main  # noqa: E402

#: the mbpp_qwen3 member shrunk for a 2-core CPU: 2 prompts x G=4, 64 completion tokens, 4 steps (3 timed)
CPU_SHAPES = ["--model", "smollm2", "--device", "cpu", "--dtype", "float32", "--steps", "4", "--group-size", "4",
              "--batch-size", "8", "--completion-length", "64", "--threads", "2", "--members", "1"]

if __name__ == "__main__":
    main(CPU_SHAPES + sys.argv[1:])

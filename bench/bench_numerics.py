"""What pinned CPU numerics cost: the same tiny-preset member run natively and pinned, side by side.

Each variant is a whole `python -m inner_loop.run experiment=tiny_arith` process (a member's own path: the pinned one
pins itself before torch loads), on a model cache warmed for both first, interleaved over several rounds so background
load hits both alike. Prints per variant the median of TRL's per-step time and of the member's wall time (training +
validation, model load included), and pinned / native ratios.

    .venv/bin/python bench/bench_numerics.py [--steps 20] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.keys import STEP_TIME_MEAN  # noqa: E402

logger = logging.getLogger("bench_numerics")
VARIANTS = ("native", "pinned")


def _member(variant: str, work_dir: Path, steps: int, cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "inner_loop.run", "experiment=tiny_arith", f"train.steps={steps}",
                           f"model.cpu_numerics={variant}", "train.report_to=[]", f"work_dir={work_dir}"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MIRROR_ES_CACHE": str(cache)})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads((work_dir / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    step, wall = {v: [] for v in VARIANTS}, {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for variant in VARIANTS:  # warm-up, built once per numerics, not timed
            _member(variant, Path(tmp) / f"warm-{variant}", 1, cache)
        for round_ in range(opts.rounds):
            for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                record = _member(variant, Path(tmp) / f"{variant}-{round_}", opts.steps, cache)
                step[variant].append(record["diagnostics"][STEP_TIME_MEAN])
                wall[variant].append(record["wall_time_s"])
                logger.info("round %d %-6s step %.3f s, member wall %.1f s, fitness %.3f", round_, variant,
                            step[variant][-1], wall[variant][-1], record["fitness"])
    med = {v: (statistics.median(step[v]), statistics.median(wall[v])) for v in VARIANTS}
    for variant in VARIANTS:
        logger.info("%-6s median step %.3f s, median member wall %.1f s", variant, *med[variant])
    logger.info("pinned / native: step time %.2fx, member wall %.2fx", med["pinned"][0] / med["native"][0],
                med["pinned"][1] / med["native"][1])


if __name__ == "__main__":
    main()

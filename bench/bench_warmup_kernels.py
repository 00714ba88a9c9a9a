"""The embedded default under each of torch's CPU kernel sets: warm-up steps, probe and step-0 validation pass@1,
and validation pass@1 after the default 60-step RL run (kl and neural_mirror), side by side.

    .venv/bin/python bench/bench_warmup_kernels.py [--capabilities default avx2 avx512]

Each capability runs in its own process (ATEN_CPU_CAPABILITY is read once, at torch import) with an empty cache.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
logger = logging.getLogger("bench_warmup_kernels")


def _inner(divergence: str) -> dict:
    load = lambda group, name: yaml.safe_load((ROOT / "conf" / group / f"{name}.yaml").read_text())  # noqa: E731
    return {"task": load("task", "arith"), "model": load("model", "tiny"), "divergence": load("divergence", divergence),
            "train": load("train", "default")}


def measure() -> dict:
    """One capability, in this process: warm-up outcome, step-0 validation, RL results."""
    import torch

    from inner_loop.evaluate import evaluate
    from inner_loop.member import prepare, train_member
    from inner_loop.models import load_policy, resolve_model_dir
    from inner_loop.warmup import read_warmup_outcome, warmed_model_dir

    torch.set_num_threads(1)
    run = prepare(_inner("kl"), seed=0)
    tcfg = run.cfg.train
    tokens = tcfg.val_max_new_tokens or tcfg.max_completion_length
    warmed = warmed_model_dir(run.cfg.model, resolve_model_dir(run.cfg.model), run.task, run.cfg.task, tokens)
    model, tokenizer = load_policy(run.cfg.model, warmed)
    outcome = read_warmup_outcome(warmed)
    row = {"kernels": torch.backends.cpu.get_cpu_capability(), "warmup_steps": outcome.steps,
           "probe": outcome.probe_pass_at_1,
           "step0": evaluate(model, tokenizer, run.task, run.validation, max_new_tokens=tokens, log=False).pass_at_1}
    for divergence in ("kl", "neural_mirror"):
        with tempfile.TemporaryDirectory() as work:
            record = train_member({"run_id": "bench", "generation": 0, "index": 0, "seed": 0, "params": [],
                                   "work_dir": work, "inner": _inner(divergence)})
        row[divergence] = record.fitness
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capabilities", nargs="+", default=["default", "avx2", "avx512"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write("RESULT " + json.dumps(measure()) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    for capability in args.capabilities:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "MIRROR_ES_CACHE": cache}
            done = subprocess.run([sys.executable, __file__, "--child"], env=env, cwd=ROOT, capture_output=True,
                                  text=True, check=True)
        rows.append(json.loads(next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))[7:]))
    logger.info("| kernels | warm-up steps | probe | step-0 val | kl after RL | neural_mirror after RL |")
    for r in rows:
        logger.info("| %s | %d | %.4f | %.3f | %.3f (%+.3f) | %.3f (%+.3f) |", r["kernels"], r["warmup_steps"], r["probe"],
                    r["step0"], r["kl"], r["kl"] - r["step0"], r["neural_mirror"], r["neural_mirror"] - r["step0"])


if __name__ == "__main__":
    main()

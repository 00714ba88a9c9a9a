"""The embedded default under each of torch's CPU kernel sets: warm-up steps, probe and step-0 validation pass@1,
validation pass@1 after the default 60-step RL run (kl and neural_mirror), and optionally after the trust-region
hosts' two-pass runs and the embedded search itself (`python -m meta.run`, per generation), side by side.

    .venv/bin/python bench/bench_warmup_kernels.py [--capabilities default avx2 avx512] [--hosts] [--search]
        [--numerics native|pinned]

Each capability runs in its own process (ATEN_CPU_CAPABILITY is read once, at torch import) with an empty cache.
``--numerics native`` (the default here) computes with the kernels asked for: what an unpinned machine of that kind
sees. ``--numerics pinned`` is the tiny preset as shipped: every run pins its own process (inner_loop/process/pinned.py), so
the rows must come out identical whatever the capability asked for.
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


NUMERICS = os.environ.get("BENCH_NUMERICS", "native")


def _inner(divergence: str) -> dict:
    load = lambda group, name: yaml.safe_load((ROOT / "conf" / group / f"{name}.yaml").read_text())  # noqa: E731
    inner = {"task": load("task", "arith"), "model": load("model", "tiny"),
             "divergence": load("divergence", divergence), "train": load("train", "default")}
    inner["model"]["cpu_numerics"] = NUMERICS
    return inner


TRUST_REGION_HOSTS = ("kl3_clip", "dppo_tv", "dppo_kl", "spo", "drpo")


def _train(inner: dict) -> float:
    from inner_loop.member.entry import train_member  # a pinned config trains in a pinned process of its own

    with tempfile.TemporaryDirectory() as work:
        record = train_member({"run_id": "bench", "generation": 0, "index": 0, "seed": 0, "params": [],
                               "work_dir": work, "inner": inner})
    if not record.ok:
        raise RuntimeError(f"bench member failed: {record.error}")
    return record.fitness


def _search() -> list[dict]:
    """The embedded default search (scripts/main.sh without set-up), in a throw-away run dir: per generation."""
    import pandas as pd

    from results.store.run_store import RunStore

    with tempfile.TemporaryDirectory() as run_dir:
        subprocess.run([sys.executable, "-m", "meta.run", f"run_dir={run_dir}/run", f"model.cpu_numerics={NUMERICS}"],
                       cwd=ROOT, check=True,
                       capture_output=True, text=True)
        table = pd.read_parquet(RunStore(Path(run_dir) / "run").generations_table_path)
    return [{"generation": int(r.generation), "mean": float(r.mean_fitness), "best": float(r.best_fitness)}
            for r in table.itertuples()]


def measure(hosts: bool, search: bool) -> dict:
    """One capability, in this process: warm-up outcome, step-0 validation, RL results."""
    import torch

    from inner_loop.training.setup import prepare
    from inner_loop.models.loading import resolve_model_dir
    from inner_loop.training.warmup import read_warmup_outcome, warmed_model_dir

    torch.set_num_threads(1)
    run = prepare(_inner("kl"), seed=0)
    tcfg = run.cfg.train
    tokens = tcfg.val_max_new_tokens or tcfg.max_completion_length
    warmed = warmed_model_dir(run.cfg.model, resolve_model_dir(run.cfg.model), run.task, run.cfg.task, tokens)
    outcome = read_warmup_outcome(warmed)
    untrained = _inner("kl")
    untrained["train"]["steps"] = 0  # the untouched model scored by a member, under the run's own numerics
    row = {"kernels": torch.backends.cpu.get_cpu_capability(), "warmup_steps": outcome.steps,
           "probe": outcome.probe_pass_at_1, "step0": _train(untrained), "numerics": outcome.numerics}
    for divergence in ("kl", "neural_mirror"):
        row[divergence] = _train(_inner(divergence))
    if hosts:  # as tests/test_inner_loop/member/test_inner_learning.py runs them: prob_l2, two optimiser passes per rollout
        for host in TRUST_REGION_HOSTS:
            inner = _inner("prob_l2")
            inner["train"].update(policy_loss=host, num_iterations=2)
            row[host] = _train(inner)
    if search:
        row["search"] = _search()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capabilities", nargs="+", default=None,
                        help="ATEN_CPU_CAPABILITY values (default: every one this CPU offers)")
    parser.add_argument("--hosts", action="store_true", help="also the five trust-region hosts (two passes)")
    parser.add_argument("--search", action="store_true", help="also the embedded search, python -m meta.run")
    parser.add_argument("--numerics", choices=("native", "pinned"), default="native",
                        help="model.cpu_numerics of every run (native: the kernels asked for; pinned: as shipped)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write("RESULT " + json.dumps(measure(args.hosts, args.search)) + "\n")
        return
    flags = [flag for flag, on in (("--hosts", args.hosts), ("--search", args.search)) if on]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from inner_loop.training.warmup import cpu_capabilities

    rows = []
    for capability in args.capabilities or cpu_capabilities():
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "MIRROR_ES_CACHE": cache,
                   "BENCH_NUMERICS": args.numerics}
            done = subprocess.run([sys.executable, __file__, "--child", *flags], env=env, cwd=ROOT, capture_output=True,
                                  text=True, check=True)
        rows.append(json.loads(next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))[7:]))
    logger.info("| kernels asked | warm-up built with | warm-up steps | probe | step-0 val | kl after RL | "
                "neural_mirror after RL |")
    for r in rows:
        logger.info("| %s | %s | %d | %.4f | %.3f | %.3f (%+.3f) | %.3f (%+.3f) |", r["kernels"], r["numerics"],
                    r["warmup_steps"], r["probe"],
                    r["step0"], r["kl"], r["kl"] - r["step0"], r["neural_mirror"], r["neural_mirror"] - r["step0"])
    if args.hosts:
        logger.info("| kernels | step-0 val | %s (prob_l2, 2 passes, after RL) |", " | ".join(TRUST_REGION_HOSTS))
        for r in rows:
            cells = " | ".join(f"{r[h]:.3f} ({r[h] - r['step0']:+.3f})" for h in TRUST_REGION_HOSTS)
            logger.info("| %s | %.3f | %s |", r["kernels"], r["step0"], cells)
    if args.search:
        logger.info("| kernels | step-0 val | embedded search: per generation mean / best fitness |")
        for r in rows:
            gens = ", ".join(f"gen {g['generation']}: {g['mean']:.3f} / {g['best']:.3f}" for g in r["search"])
            logger.info("| %s | %.3f | %s |", r["kernels"], r["step0"], gens)


if __name__ == "__main__":
    main()

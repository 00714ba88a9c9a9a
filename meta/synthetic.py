"""A synthetic objective over the 380-vector that stands in for NM-GRPO training in tests and benchmarks.

Used through ``inner.entrypoint=meta.synthetic:member``; its behaviour is steered by ``inner.options``:
  target (0.02), width (0.01): fitness = exp(-mean((x - target)^2) / (2 width^2)), in (0, 1], max at x = target,
      so 0 (the default fitness_on_failure) is the worst value, as for pass@1;
  sleep_s: sleep before answering (benchmark members);
  fail / nan_fitness / hang: lists of member indices (or "generation:index") that raise, return NaN, or sleep forever;
  fail_attempts: those injected failures only happen on attempts below this number (tests retries);
  count_calls: append a line to <work_dir>/calls.log per call (tests that no member runs twice);
  steps, step_s: "train" for `steps` steps of `step_s` seconds, checkpointing the step counter in
      <work_dir>/synthetic_ckpt.json after each step and resuming from it (tests requeue and preemption);
  env_log: write the SLURM_*/SBATCH_* variables the member sees to <work_dir>/env.json;
  noise: standard deviation of a Gaussian seed noise added to the fitness, drawn from the member's seed (a
      training run's seed-to-seed spread: same seed and params, same fitness);
  time_median_s, time_sigma (0.5), slow_fraction (0), slow_factor (5), time_tracks_fitness (0): a member's running
      time, log-normal around the median, a slow_fraction of members slow_factor times longer (a slow node, a
      requeue), and x exp(time_tracks_fitness x (fitness - 0.5)) so time can track fitness (GRPO: long completions
      take longer); drawn from (generation, index, attempt) alone, so two searches see the same times
      (bench/bench_stragglers.py).
Deliberately free of torch so that hundreds of member processes start quickly.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from results.store.atomic import atomic_write_json
from results.store.records import MemberSpec


def objective(params: Sequence[float], target: float = 0.02, width: float = 0.01) -> float:
    """The known optimum is the constant vector ``target``; higher is better."""
    if not params:
        raise ValueError("synthetic objective needs a non-empty parameter vector")
    mse = sum((float(x) - target) ** 2 for x in params) / len(params)
    return math.exp(-mse / (2.0 * width * width))


def _selected(spec: MemberSpec, entries: Sequence[Any] | None) -> bool:
    for entry in entries or ():
        if isinstance(entry, str) and ":" in entry:
            gen, _, idx = entry.partition(":")
            if int(gen) == spec.generation and int(idx) == spec.index:
                return True
        elif int(entry) == spec.index:
            return True
    return False


def member(spec: MemberSpec | Mapping[str, Any]) -> dict[str, Any]:
    """The ``inner.entrypoint`` for synthetic runs: returns a result record as a dict."""
    if not isinstance(spec, MemberSpec):
        spec = MemberSpec.from_dict(spec)
    options = dict(spec.inner.get("options") or {})
    start = time.monotonic()
    if options.get("count_calls"):
        with open(Path(spec.work_dir) / "calls.log", "a") as handle:
            handle.write(f"attempt {spec.attempt}\n")
    if options.get("env_log"):
        seen = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SBATCH_"))}
        atomic_write_json(Path(spec.work_dir) / "env.json", seen)
    if options.get("sleep_s"):
        time.sleep(float(options["sleep_s"]))
    steps_done = _train_steps(Path(spec.work_dir), int(options.get("steps", 0)), float(options.get("step_s", 0.0)))
    injected = spec.attempt < int(options.get("fail_attempts", 1 << 30))
    if injected and _selected(spec, options.get("fail")):
        raise RuntimeError(f"injected failure for member {spec.generation}:{spec.index}")
    if injected and _selected(spec, options.get("hang")):
        while True:
            time.sleep(0.05)
    fitness = objective(spec.params, float(options.get("target", 0.02)), float(options.get("width", 0.01)))
    if options.get("time_median_s"):
        time.sleep(member_time_s(spec, options, fitness))
    if options.get("noise"):
        fitness += float(options["noise"]) * random.Random(spec.seed).gauss(0.0, 1.0)
    if injected and _selected(spec, options.get("nan_fitness")):
        fitness = float("nan")
    return {
        "status": "ok",
        "fitness": fitness,
        "val_size": 1,
        "wall_time_s": time.monotonic() - start,
        "steps_done": steps_done or 1,
    }


def member_time_s(spec: MemberSpec, options: Mapping[str, Any], fitness: float) -> float:
    """The member's synthetic running time (see the module docstring); deterministic in (generation, index)."""
    rng = random.Random(f"time:{spec.generation}:{spec.index}:{spec.attempt}")
    seconds = float(options["time_median_s"]) * math.exp(float(options.get("time_sigma", 0.5)) * rng.gauss(0.0, 1.0))
    if rng.random() < float(options.get("slow_fraction", 0.0)):
        seconds *= float(options.get("slow_factor", 5.0))
    return seconds * math.exp(float(options.get("time_tracks_fitness", 0.0)) * (fitness - 0.5))


CHECKPOINT_FILE = "synthetic_ckpt.json"


def finalize(spec: MemberSpec | Mapping[str, Any]) -> None:
    """``member.finalize``: a settled member's step-counter checkpoint goes, as train_member's checkpoints do."""
    if not isinstance(spec, MemberSpec):
        spec = MemberSpec.from_dict(spec)
    (Path(spec.work_dir) / CHECKPOINT_FILE).unlink(missing_ok=True)


member.finalize = finalize  # type: ignore[attr-defined]


def _train_steps(work_dir: Path, steps: int, step_s: float) -> int:
    """Fake training with a resumable step counter: a restarted member continues where it stopped, and
    each start is recorded (step at start) so a test can see that the counter continued."""
    if steps <= 0:
        return 0
    path = work_dir / CHECKPOINT_FILE
    state = json.loads(path.read_text()) if path.exists() else {"step": 0, "starts": []}
    state["starts"].append(state["step"])
    atomic_write_json(path, state)
    while state["step"] < steps:
        time.sleep(step_s)
        state["step"] += 1
        atomic_write_json(path, state)
    return state["step"]

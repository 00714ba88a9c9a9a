"""A stand-in for a training run in tuning tests and benchmarks: ``inner.entrypoint=meta.tune.synthetic:program``
(``meta.tune.synthetic:run``, its older name, loads the same program).

It reads the settings a trial tunes and "trains" for ``train.steps`` steps of ``inner.options.step_s`` seconds:
quality q = exp(-((log10 coef - log10 best_coef)^2 + (log10 lr - log10 best_lr)^2) / (2 width^2)) (defaults: coef
0.01, lr 3e-4, width 1), plus ``bonus[divergence.name]``; the validation score after step s is
q (1 - exp(-3 s / steps)) plus the seed's noise (``noise``, a standard deviation), clipped to [0, 1]. Like a real
member it writes progress.json every step and intermediate.jsonl every ``train.eval_every`` steps before the last.
``fail_above_coef``: a run whose coef is above it raises (a diverging run); ``fail_unless``: every run raises while this path does not exist (a missing data
file, fixed by creating it); ``fail_attempts``: every run raises on its attempts below this number (a transient failure that a retry gets past); ``count_calls``: append a line per call
to <work_dir>/calls.log (tests that no run trains twice). Free of torch, so runs start quickly.
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any, Mapping

from results.store.member_files import append_intermediate, MemberProgress, write_progress
from core.member_program import MemberProgram, named_by
from core.records import MemberSpec, ResultRecord


def quality(coef: float, lr: float, options: Mapping[str, Any], divergence: str = "") -> float:
    width = float(options.get("width", 1.0))
    distance = (math.log10(coef) - math.log10(float(options.get("best_coef", 0.01)))) ** 2 + \
               (math.log10(lr) - math.log10(float(options.get("best_lr", 3e-4)))) ** 2
    bonus = float(dict(options.get("bonus") or {}).get(divergence, 0.0))
    return math.exp(-distance / (2 * width * width)) + bonus


def score(q: float, step: int, steps: int, noise: float) -> float:
    return min(1.0, max(0.0, q * (1.0 - math.exp(-3.0 * step / steps)) + noise))


class TuningStandIn(MemberProgram):
    """The tuning stand-in as a member program: a plain run with nothing to validate, stage or tidy."""

    def train(self, spec: MemberSpec | Mapping[str, Any], save_final: bool = False) -> dict[str, Any]:
        """A result record as a dict (see the module docstring); ``save_final``: no model to keep."""
        if not isinstance(spec, MemberSpec):
            spec = MemberSpec.from_dict(spec)
        inner = spec.inner
        options = dict(inner.get("options") or {})
        train, divergence = inner["train"], inner["divergence"]
        coef, lr = float(divergence["coef"]), float(train["learning_rate"])
        work_dir = Path(spec.work_dir)
        if options.get("count_calls"):
            with open(work_dir / "calls.log", "a") as log:
                log.write(f"attempt {spec.attempt}\n")
        if options.get("fail_above_coef") is not None and coef > float(options["fail_above_coef"]):
            raise RuntimeError(f"synthetic divergence: coef {coef:g} > {options['fail_above_coef']}")
        if options.get("fail_unless") and not Path(options["fail_unless"]).exists():
            raise FileNotFoundError(f"synthetic run needs {options['fail_unless']}")
        if spec.attempt < int(options.get("fail_attempts", 0)):
            raise RuntimeError(f"synthetic transient failure on attempt {spec.attempt}")
        steps, every, step_s = spec.work.steps, train.get("eval_every"), float(options.get("step_s", 0.05))
        q = quality(coef, lr, options, str(divergence.get("name", "")))
        noise = random.Random(spec.seed).gauss(0.0, float(options.get("noise", 0.0)))
        start = time.time()
        for step in range(1, steps + 1):
            time.sleep(step_s)
            now = time.time()
            write_progress(work_dir, MemberProgress(step=step, max_steps=steps, started_at=start, updated_at=now,
                                                    seconds_per_step=(now - start) / step))
            if every and step % int(every) == 0 and step < steps:
                append_intermediate(work_dir, step, score(q, step, steps, noise), 64)
        return ResultRecord(status="ok", fitness=score(q, steps, steps, noise), val_size=200, steps_done=steps,
                            wall_time_s=time.time() - start).to_dict()


program = TuningStandIn()


@named_by(program)
def run(spec: MemberSpec | Mapping[str, Any]) -> dict[str, Any]:
    """``program.train``, by the name earlier studies stored as ``inner.entrypoint`` (and tests use)."""
    return program.train(spec)

"""``meta.tune dry_run=true``: what a tuning would run and what it would cost, before anything is written."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from meta.search.resume import run_dir_label
from meta.settings.schema import TuneSchema
from meta.tune.config import study_space
from core.gpu_time import gpu_sharing


def build_plan(cfg: TuneSchema, run_dir: Path, resuming: bool) -> str:
    """The plan as text: the space, the trials and runs, what runs at once, and the GPU-hours at most."""
    runs = cfg.tune.trials * cfg.tune.seeds
    resources = dataclasses.asdict(cfg.resources)
    alone_min = float(resources.get("member_time_min") or 0.0)
    sharing = gpu_sharing(resources)  # checked when the config was composed
    minutes = sharing.member_time(alone_min)
    gpus = int(resources.get("gpus") or 0)
    hours = runs * minutes / 60.0
    lines = [
        f"meta.tune plan ({run_dir_label(run_dir, resuming, 'tuning run')}); nothing written or submitted",
        f"launcher: {cfg.launcher.name}; sampler: {cfg.tune.sampler} {cfg.tune.sampler_options or ''}; pruner: "
        f"{cfg.tune.pruner} {cfg.tune.pruner_options or ''}; storage: {cfg.tune.storage or 'journal file in the run dir'}",
        "space:",
        *(f"  {d.key}: {d.kind} " + (", ".join(map(str, d.choices)) if d.kind == "choice" else f"[{d.low:g}, {d.high:g}]")
          for d in study_space(cfg)),
        f"trials: {cfg.tune.trials} x {cfg.tune.seeds} seed(s) = {runs} training runs, at most {cfg.tune.parallel * cfg.tune.seeds} at once "
        f"({cfg.tune.parallel} trial(s) in flight); objective: mean validation pass@1",
        f"each run: ~{round(minutes, 1):g} min (resources.member_time_min"
        + (f" {alone_min:g} x slowdown {sharing.slowdown:g}" if sharing.shared else "")
        + f"), {gpus} GPU, limit inner.timeout_s={cfg.inner.timeout_s:g} s, retries {cfg.retries}",
        *_validation_lines(cfg.inner_config["train"], cfg.full_steps, runs),
        f"GPU-hours without pruning: {runs} runs x {sharing.hours_text(alone_min / 60, gpus)} = "
        f"{sharing.gpu_hours(runs, alone_min / 60, gpus):,.1f} GPU-h "
        f"(wall ~{hours / max(1, cfg.tune.parallel * cfg.tune.seeds):,.1f} h if the cluster runs {cfg.tune.parallel * cfg.tune.seeds} at "
        "once); pruning stops runs early, so this is an upper bound before retries",
        *sharing.plan_lines(cfg.tune.parallel * cfg.tune.seeds, "set of trials in flight"),
    ]
    return "\n".join(lines)


def _validation_lines(train: Mapping[str, Any], steps: int, runs: int) -> list[str]:
    """The intermediate validations the pruner reads: how many a run of ``steps`` steps scores besides its final one,
    and that its time per run (member_time_min) must include them."""
    every = train.get("eval_every")
    if not every:
        return ["intermediate validations: none (train.eval_every=null; the pruner has nothing to read)"]
    count = max(0, (steps - 1) // int(every))
    subset = train.get("eval_subset")
    return [f"intermediate validations: {count} per run (every train.eval_every={every} of train.steps={steps}, "
            f"greedy on the first {subset} validation problems) = {count * runs} in all, besides each run's final "
            "validation; resources.member_time_min must include their time"]

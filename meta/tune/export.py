"""The best trial's settings as a preset YAML of conf/experiment/ style, for ``meta.run`` and ``inner_loop.run``.

The preset is self-contained: it chooses the trial's config groups (``override /divergence: kl``) and sets the
trial's full task/model/divergence/train and resources, so ``experiment=<name>`` reproduces the trial's runs
exactly, whatever preset the tune run itself started from. Intermediate validation (``train.eval_every``, set for
the pruner) is switched off: a single run or an ES member does not need it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from meta.search.config import INNER_NODES
from meta.tune.trials import read_trial
from results.store.atomic import atomic_write_text
from results.store.study_store import RUN_VALUES_ATTR, best_complete_trial


class ExportError(RuntimeError):
    """Nothing to export (no complete trial) or the best trial's files are missing."""


def best_trial(study: Any) -> Any:
    """results.store.study_store's best complete trial; ExportError when there is none."""
    best = best_complete_trial(study)
    if best is None:
        raise ExportError(f"study {study.study_name!r} has no complete trial yet; nothing to export")
    return best


def preset_text(run_dir: str | Path, study: Any, choices: Mapping[str, str], resources: Mapping[str, Any]) -> str:
    """The preset YAML of the study's best trial (``choices``: the config group options of the tune run)."""
    best = best_trial(study)
    plan = read_trial(run_dir, best.number)
    if plan is None or not plan.specs:
        raise ExportError(f"trial {best.number} has no trial file under {run_dir}; cannot export its settings")
    inner = plan.specs[0].inner
    groups = dict(choices)
    for key, value in plan.params.items():
        if "." not in key:  # a tuned config group
            groups[key] = str(value)
    body: dict[str, Any] = {"defaults": [{f"override /{g}": groups[g]} for g in INNER_NODES if g in groups]}
    for node in INNER_NODES:
        body[node] = dict(inner[node])
    body["train"]["eval_every"] = None
    body["resources"] = dict(resources)
    values = best.user_attrs.get(RUN_VALUES_ATTR) or [best.value]
    header = [
        "# @package _global_",
        f"# Exported by python -m meta.tune from {Path(run_dir).resolve()}, study {study.study_name!r}: trial",
        f"# {best.number}, validation pass@1 {best.value:.4f} (mean of {len(values)} run(s): "
        f"{', '.join(f'{v:.4f}' for v in values)}).",
        f"# Tuned: {', '.join(plan.overrides)}",
        "# Use: save as conf/experiment/<name>.yaml, then python -m inner_loop.run experiment=<name> (one run) or",
        "# python -m meta.run experiment=<name> (an ES search). A single trial's value is a noisy measurement: retrain",
        "# it with more seeds before reporting it.",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


def export_preset(run_dir: str | Path, study: Any, choices: Mapping[str, str], resources: Mapping[str, Any],
                  out: str | Path) -> Path:
    """Write the preset to ``out``; a different file already there (a hand-written preset, an earlier export) is
    never overwritten: ExportError naming it."""
    text = preset_text(run_dir, study, choices, resources)
    path = Path(out)
    if path.exists() and path.read_text() != text:
        raise ExportError(f"export={path} already exists with other content; remove it or choose another file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path

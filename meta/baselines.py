"""The rows of the result table: the exported init and the baselines it is compared with, each as a training run.

A baseline is only fair when it is trained like the searched init (same task, model, training settings, seeds)
and with its OWN regularization strength. So a row's divergence block is composed by Hydra from the run's own
command line with ``divergence=<name>`` and every ``divergence.*`` override dropped: a preset's or the user's
neural-map coefficient never reaches the KL row (its coefficient comes from ``coef_by_divergence.<name>`` when a
preset or the command line sets it, else from conf/divergence/<name>.yaml; the row records which).

Rows (``reevaluate.baselines`` picks the baselines; the exported init is always the first row):
  exported   NM-GRPO-ES: the init chosen on the selection seeds
  center     the search's starting centre (``init``), the map every member was a perturbation of
  nm_random  NM-GRPO: the authors' random map, parameters U(0, 0.01) drawn with seed 42, whatever the transform
  kl         GRPO-style KL regularization (conf/divergence/kl.yaml)
  prob_l2    ProbL2, L2 in probability space (conf/divergence/prob_l2.yaml)
  none       plain Dr. GRPO, no regularizer
  base       the model before any RL step (train.steps = 0: scored untrained)
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from meta.config import ConfigError, SearchConfig

EXPORTED = "exported"
BASELINES = ("center", "nm_random", "kl", "prob_l2", "none", "base")
LABELS = {
    EXPORTED: "NM-GRPO-ES (exported init)",
    "center": "NM-GRPO-ES start (search centre)",
    "nm_random": "NM-GRPO (random init, seed 42)",
    "kl": "KL",
    "prob_l2": "ProbL2",
    "none": "Dr. GRPO (no regularizer)",
    "base": "base model (no RL)",
}
#: rows whose divergence is a hand-designed one, composed from its own config group
_GROUP_ROWS = ("kl", "prob_l2", "none")


@dataclass(frozen=True)
class ReportRow:
    """One row to train on the reporting seeds: what it is, its resolved divergence and where its coefficient
    comes from, the map vector (None: no map), and the full inner config each of its runs gets."""

    name: str
    label: str
    divergence: dict[str, Any]
    coef_source: str
    params: list[float] | None
    inner: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _drops(override: str, group: str) -> bool:
    key = _key(override)
    return key == group or key.startswith(group + ".")


def group_block(group: str, option: str, overrides: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Config group ``group`` set to ``option`` under the run's overrides with that group's own overrides dropped:
    (the group's resolved block, the whole resolved config)."""
    from meta.compose import compose

    kept = [o for o in overrides if not _drops(o, group)]
    raw = compose([*kept, f"{group}={option}"])
    return dict(raw[group]), raw


def coef_source(name: str, overrides: Sequence[str], raw: Mapping[str, Any]) -> str:
    """Where the ``name`` divergence's coefficient comes from (shown in the plan and the table)."""
    key = f"coef_by_divergence.{name}"
    if any(_key(o) == key for o in overrides):
        return f"{key} (command line)"
    if name in (raw.get("coef_by_divergence") or {}):
        experiment = next((o.split("=", 1)[1] for o in overrides if _key(o) == "experiment"), "tiny_arith")
        return f"{key} (experiment={experiment})"
    return f"conf/divergence/{name}.yaml"


def _search_coef_source(overrides: Sequence[str], raw: Mapping[str, Any], name: str) -> str:
    if any(_key(o) == "divergence.coef" for o in overrides):
        return "divergence.coef (command line)"
    return coef_source(name, overrides, raw)


def nm_random_vector(param_transform: str) -> list[float]:
    """The search vector of the authors' random map under ``param_transform``."""
    import torch

    from mirror_maps import AUTHORS_INIT_SEED, NeuralMirrorMap, vector_for_parameters

    params = NeuralMirrorMap.random_init(AUTHORS_INIT_SEED, param_transform="none", dtype=torch.float64).to_vector()
    return vector_for_parameters(params, param_transform).tolist()


def transfer_tasks(names: Sequence[str], overrides: Sequence[str]) -> list[dict[str, Any]]:
    """The ``extra_evaluations`` entries of a reporting run for the transfer tasks (each a conf/task/ group,
    composed under the run's overrides with its own task.* overrides dropped)."""
    entries = []
    for name in names:
        block, _ = group_block("task", name, overrides)
        entries.append({"name": f"transfer/{block.get('name', name)}", "task": block})
    return entries


def build_rows(cfg: SearchConfig, overrides: Sequence[str], exported_params: Sequence[float] | None,
               baselines: Sequence[str], transfer: Sequence[str], test: bool) -> list[ReportRow]:
    """Every row of the result table, the exported init first. ``exported_params`` None: a plan (dry run), where
    the exported init is not known yet."""
    search_block = dict(cfg.inner_config["divergence"])
    search_name = str(search_block.get("name"))
    _, search_raw = group_block("divergence", search_name, overrides)
    extra = ([{"name": "test", "task": None}] if test else []) + transfer_tasks(transfer, overrides)
    base_inner = cfg.member_inner()
    if extra:
        base_inner["extra_evaluations"] = extra
    transform = cfg.param_transform
    rows = []
    for name in (EXPORTED, *baselines):
        inner = copy.deepcopy(base_inner)
        params: list[float] | None = None
        if name in _GROUP_ROWS:
            block, raw = group_block("divergence", name, overrides)
            source = coef_source(name, overrides, raw) if name != "none" else "no regularizer"
        elif name == "base":
            block, source = group_block("divergence", "none", overrides)[0], "no training"
            inner["train"] = {**inner["train"], "steps": 0}
        elif name in (EXPORTED, "center", "nm_random"):
            block, source = search_block, _search_coef_source(overrides, search_raw, search_name)
            if name == "center":
                params = cfg.center().tolist()
            elif name == "nm_random":
                params = nm_random_vector(transform)
            elif exported_params is not None:
                params = [float(x) for x in exported_params]
        else:
            raise ConfigError(f"reevaluate.baselines: {name!r} is not a baseline; known: {', '.join(BASELINES)}")
        inner["divergence"] = copy.deepcopy(block)
        rows.append(ReportRow(name=name, label=LABELS[name], divergence=dict(block), coef_source=source,
                              params=params, inner=inner))
    return rows

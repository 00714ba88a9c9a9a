"""A finished single run scored afterwards on a task's TEST split: ``python -m inner_loop.evaluate work_dir=<run>
task=<group> [task.<key>=<value> ...]`` (the door is inner_loop/evaluate.py; inner_loop/training/evaluate.py does the scoring).

Why afterwards: a single run keeps its trained model in ``<work_dir>/final/``, so a transfer number (MBPP-trained,
scored on HumanEval) is added to a paper table without training again. This module is the finished-run side: the
checks that turn bad input into one line and exit status 2 before any model is loaded, the run's own model
settings read back from its manifest, the task composed from conf/task/ with Hydra as ``inner_loop.run`` composes
it, the model loaded from final/, and the record written beside result.json.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from inner_loop.config import ModelConfig, TrainConfig, node_config, register_schemas
from inner_loop.models.loading import load_trained, trained_model_source
from inner_loop.tasks import build_task, check_transfer
from inner_loop.tasks.base import Problem, Task
from results.store.atomic import CorruptFileError, atomic_write_json
from core.config.groups import config_groups, with_config_path
from results.store.layout import FINAL_MODEL_DIR, RESULT_FILE, evaluation_file_name
from results.store.provenance import read_run_manifest
from results.store.member_files import read_result

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
USAGE = "python -m inner_loop.evaluate work_dir=<finished run> task=<task group> [task.<key>=<value> ...]"
#: the prefixes a Hydra override of the task node may carry (+ adds a key, ++ forces, ~ deletes)
_TASK_OVERRIDE_PREFIXES = ("task.", "+task.", "++task.", "~task.")


class UsageError(ValueError):
    """Bad input to the command: reported on one line with exit status 2, before any model is loaded."""


@dataclass
class FinishedRun:
    """What scoring a finished run needs from its work dir: its model settings, its scoring settings, the model."""

    work_dir: Path
    model: ModelConfig
    train: TrainConfig
    #: ``lora_adapter`` or ``full_model``: what final/ holds
    model_source: str


@dataclass
class PlannedEvaluation:
    """A checked request: the finished run, the composed task node, the task and its test problems."""

    run: FinishedRun
    task_node: dict[str, Any]
    task: Task
    problems: list[Problem]


def parse_args(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """(work_dir, task group, task overrides) from ``key=value`` arguments; UsageError for anything else."""
    work_dir, group, overrides = None, None, []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise UsageError(f"argument {arg!r} is not key=value; usage: {USAGE}")
        if key == "work_dir":
            work_dir = value
        elif key == "task":
            group = value
        elif key.startswith(_TASK_OVERRIDE_PREFIXES):
            overrides.append(arg)
        else:
            raise UsageError(f"unknown argument {key!r}: the model and its settings are the run's own; usage: {USAGE}")
    if not work_dir or not group:
        raise UsageError(f"work_dir= and task= are both required; usage: {USAGE}")
    return work_dir, group, overrides


def finished_run(work_dir: str | Path) -> FinishedRun:
    """The finished run in ``work_dir``: an ok result.json, its model in final/, its settings from manifest.json."""
    folder = Path(work_dir)
    train_hint = f"train it with python -m inner_loop.run work_dir={folder} ..."
    if not folder.is_dir():
        raise UsageError(f"no such work_dir: {folder}")
    if not (folder / RESULT_FILE).is_file():
        raise UsageError(f"{folder} holds no {RESULT_FILE} (not a finished run); {train_hint}")
    record = read_result(folder)
    if record is None or not record.ok:
        why = "cannot be read" if record is None else f"says the run {record.status}: {record.error}"
        raise UsageError(f"{folder / RESULT_FILE} {why}; {train_hint}")
    final = folder / FINAL_MODEL_DIR
    if not final.is_dir():
        raise UsageError(f"{folder} holds no trained model in {FINAL_MODEL_DIR}/ (an ES member, or a run from an older "
                         f"version); {train_hint}")
    try:
        manifest = read_run_manifest(folder)
    except CorruptFileError as exc:
        raise UsageError(str(exc)) from exc
    config = (manifest or {}).get("config")
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise UsageError(f"{folder} has no manifest.json with the run's config: its model settings are unknown")
    try:
        model = node_config(ModelConfig, "model", config["model"])
        model.validate()
        train = node_config(TrainConfig, "train", config.get("train"))
        source = trained_model_source(model, final)
    except ValueError as exc:
        raise UsageError(f"{folder}: {exc}") from exc
    return FinishedRun(folder, model, train, source)


def compose_task(group: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The task node ``task=<group>`` plus ``task.*`` overrides compose to, exactly as ``inner_loop.run`` would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    groups = config_groups(CONF_DIR).get("task", [])
    if group not in groups:
        raise UsageError(f"unknown task group {group!r}; choose one of {groups} (conf/task/)")
    if GlobalHydra.instance().is_initialized():  # left by an earlier Hydra app in this process
        GlobalHydra.instance().clear()
    register_schemas()  # the train and divergence groups of conf/inner.yaml compose on them
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name="inner", overrides=with_config_path([f"task={group}", *overrides]))
        node = OmegaConf.to_container(cfg.task, resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise UsageError(f"task overrides {list(overrides)}: {' '.join(str(exc).split())}") from exc
    assert isinstance(node, dict)
    return node


def plan_evaluation(argv: Sequence[str]) -> PlannedEvaluation:
    """Every check of a request, cheapest first, loading the task's test data but no model; UsageError if bad."""
    work_dir, group, overrides = parse_args(argv)
    run = finished_run(work_dir)
    node = compose_task(group, overrides)
    try:
        task = build_task(node)
        check_transfer(task)
        problems = task.load("test")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if not problems:
        raise UsageError(f"task {task.name!r} has an empty test split; raise task.test_size")
    return PlannedEvaluation(run, node, task, problems)


def load_run_model(run: FinishedRun):
    """(model, tokenizer) of the run's final/, on the GPU when there is one (the run's dtype, its adapter)."""
    import torch

    torch.set_num_threads(run.train.num_threads)
    model, tokenizer, source = load_trained(run.model, run.work_dir / FINAL_MODEL_DIR)
    assert source == run.model_source
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, tokenizer


def write_evaluation(plan: PlannedEvaluation, entry: dict[str, Any]) -> Path:
    """Atomically write ``<work_dir>/evaluation_<task>_test.json``: the entry (as in a record's ``evaluations``)
    plus where it came from: the run, what its final/ held, the task node used."""
    record = {**entry, "work_dir": str(plan.run.work_dir), "model_source": plan.run.model_source,
              "task_config": plan.task_node}
    return atomic_write_json(plan.run.work_dir / evaluation_file_name(plan.task.name, "test"), record)

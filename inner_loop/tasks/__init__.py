"""Task registry: ``build_task(cfg)`` turns a ``conf/task/*.yaml`` mapping into a ready, validated Task.

Construction validates the whole config (unknown keys, types, sizes, file paths) before any data is loaded,
so a mistake fails at submission time rather than on a cluster node.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from inner_loop.tasks.base import SPLITS, Problem, SplitOverlapError, Task, check_disjoint, prompt_hash
from inner_loop.tasks.task_config import config_from_mapping


def task_classes() -> dict[str, type[Task]]:
    """Every task, by ``task.name``: the built-in ones and those installed packages declare under the
    ``mirror_es.tasks`` entry-point group (a Task subclass whose name is the entry point's; docs/extending.md)."""
    from inner_loop.tasks.arith import ArithTask
    from inner_loop.tasks.gsm8k import GSM8KTask
    from inner_loop.tasks.gsm_symbolic import GSMSymbolicTask
    from inner_loop.tasks.humaneval import HumanEvalTask
    from inner_loop.tasks.mbpp import MBPPTask
    from core.entry_points import entry_point_objects

    classes: list[type[Task]] = [ArithTask, GSM8KTask, GSMSymbolicTask, MBPPTask, HumanEvalTask]
    classes += entry_point_objects("tasks", "an inner_loop.tasks.base.Task subclass",
                                   lambda c: c.name if isinstance(c, type) and issubclass(c, Task) else None).values()
    return {cls.name: cls for cls in classes}


def __getattr__(name: str) -> Any:
    # TASK_NAMES and TASK_CONFIGS are read from the registry when asked: a third-party task's module imports
    # inner_loop.tasks.base, so the package must not load the entry points while it is being imported itself
    if name == "TASK_NAMES":
        return tuple(task_classes())
    if name == "TASK_CONFIGS":  # the config dataclass of each task: its fields are exactly conf/task/<name>.yaml's keys
        return {task: cls.config_class for task, cls in task_classes().items()}
    raise AttributeError(f"module 'inner_loop.tasks' has no attribute {name!r}")


def schema_node(cls: type[Task]) -> Any:
    """The schema conf/task/<name>.yaml composes on: the task's config class with its ``name`` (a key of the task
    node that the class itself does not take: config_from_mapping drops it)."""
    from omegaconf import OmegaConf

    config = cls.config_class
    named = dataclasses.make_dataclass(f"{config.__name__}Node", [("name", str, dataclasses.field(default=cls.name))],
                                       bases=(config,), frozen=config.__dataclass_params__.frozen)
    return OmegaConf.structured(named)


#: the tasks whose schema this process has put in Hydra's ConfigStore (each compose calls register_schemas)
_REGISTERED: dict[str, type[Task]] = {}


def register_schemas() -> None:
    """Every registered task's config class in Hydra's ConfigStore as ``task/<name>_schema`` (idempotent), which
    its YAML names first: a mistyped key or a value of the wrong type is refused while composing."""
    from hydra.core.config_store import ConfigStore

    from core.config.group_schemas import store_schemas
    store_schemas(ConfigStore.instance(), "task", task_classes(), schema_node, _REGISTERED)


def check_transfer(task: Task) -> None:
    """ValueError unless a finished run may be scored zero-shot on ``task``: its class declares ``transfer`` and a
    test split."""
    if not (task.transfer and "test" in task.splits):
        raise ValueError(f"task {task.name!r} cannot be a transfer task: it declares transfer={task.transfer} and "
                         f"splits {list(task.splits)} (a transfer task needs both transfer and a test split)")


def build_task(cfg: Mapping[str, Any]) -> Task:
    """The task named by ``cfg['name']``, configured by the remaining keys (see conf/task/<name>.yaml)."""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"task config must be a mapping with a 'name' key, got {type(cfg).__name__}")
    name = cfg.get("name")
    registry = task_classes()
    if name not in registry:
        raise ValueError(f"unknown task {name!r} (task.name); choose one of {list(registry)}")
    cls = registry[str(name)]
    return cls(config_from_mapping(cls.config_class, str(name), cfg))  # type: ignore[call-arg]


__all__ = ["SPLITS", "TASK_CONFIGS", "TASK_NAMES", "Problem", "SplitOverlapError", "Task", "build_task", "check_disjoint",
           "check_transfer", "prompt_hash", "register_schemas", "task_classes"]

"""Task registry: ``build_task(cfg)`` turns a ``conf/task/*.yaml`` mapping into a ready, validated Task.

Construction validates the whole config (unknown keys, types, sizes, file paths) before any data is loaded,
so a mistake fails at submission time rather than on a cluster node.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from inner_loop.tasks.arith import ArithConfig, ArithTask
from inner_loop.tasks.base import SPLITS, Problem, SplitOverlapError, Task, check_disjoint, prompt_hash
from inner_loop.tasks.gsm8k import GSM8KConfig, GSM8KTask
from inner_loop.tasks.gsm_symbolic import GSMSymbolicConfig, GSMSymbolicTask
from inner_loop.tasks.humaneval import HumanEvalConfig, HumanEvalTask
from inner_loop.tasks.mbpp import MBPPConfig, MBPPTask
from inner_loop.tasks.task_config import config_from_mapping

_REGISTRY: dict[str, tuple[type, Callable[[Any], Task]]] = {
    "arith": (ArithConfig, ArithTask),
    "gsm8k": (GSM8KConfig, GSM8KTask),
    "gsm_symbolic": (GSMSymbolicConfig, GSMSymbolicTask),
    "mbpp": (MBPPConfig, MBPPTask),
    "humaneval": (HumanEvalConfig, HumanEvalTask),
}

TASK_NAMES = tuple(_REGISTRY)
#: The config dataclass of each task, whose fields are exactly the keys of conf/task/<name>.yaml.
TASK_CONFIGS: dict[str, type] = {name: entry[0] for name, entry in _REGISTRY.items()}


def build_task(cfg: Mapping[str, Any]) -> Task:
    """The task named by ``cfg['name']``, configured by the remaining keys (see conf/task/<name>.yaml)."""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"task config must be a mapping with a 'name' key, got {type(cfg).__name__}")
    name = cfg.get("name")
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r} (task.name); choose one of {list(TASK_NAMES)}")
    config_cls, task_cls = _REGISTRY[name]
    return task_cls(config_from_mapping(config_cls, name, cfg))


__all__ = ["SPLITS", "TASK_CONFIGS", "TASK_NAMES", "Problem", "SplitOverlapError", "Task", "build_task", "check_disjoint",
           "prompt_hash"]

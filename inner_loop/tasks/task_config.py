"""Turning a task's config mapping (YAML / Hydra) into a typed dataclass, rejecting mistakes up front.

A typo in a key ("validaton_size") or a wrong type would otherwise surface hours later on a cluster node, or
worse, silently fall back to a default. Every error names the key as the user writes it (``task.<key>``)
and says what to do.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from core.config.plain_data import plain, refuse_unknown_keys
from core.config.typed_nodes import typed_node

if TYPE_CHECKING:
    from inner_loop.sandbox.pool import SandboxConfig

T = TypeVar("T")


def config_from_mapping(cls: type[T], task: str, cfg: Mapping[str, Any]) -> T:
    """Build dataclass ``cls`` from ``cfg`` (minus its ``name``), failing on unknown keys and wrong types: the same
    reading as the inner config's nodes (core/config/typed_nodes.py), each message led by the task's name."""
    settings = {key: value for key, value in plain(cfg).items() if key != "name"}
    return typed_node(cls, settings, "task", prefix=f"task {task!r}: ", see=f" (see conf/task/{task}.yaml)")


def require_non_negative(task: str, **sizes: int | None) -> None:
    """Split sizes and counts may be null (meaning "all") or >= 0."""
    for key, value in sizes.items():
        if value is not None and value < 0:
            raise ValueError(f"task {task!r}: task.{key} must be >= 0 (or null for all), got {value}")


def require_existing_file(task: str, key: str, path: str | None) -> None:
    """A configured local data file must exist before any work starts."""
    if path is not None and not Path(path).expanduser().is_file():
        raise ValueError(f"task {task!r}: task.{key}={path!r} does not exist; fix the path or set it to null")


def require_split_data(task: str, config: Any) -> None:
    """Checks shared by the hub-or-local-file tasks (gsm8k, mbpp): sizes, files that exist, files set in pairs."""
    require_non_negative(task, train_size=config.train_size, validation_size=config.validation_size,
                         test_size=config.test_size)
    require_existing_file(task, "train_file", config.train_file)
    require_existing_file(task, "test_file", config.test_file)
    if config.test_file is not None and config.train_file is None:
        raise ValueError(f"task {task!r}: task.test_file is set but task.train_file is not; set both or neither")


def fill_prompt_template(template: str, task_name: str, **fields: Any) -> str:
    """Fill a prompt template, turning a wrong placeholder into a config error."""
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"task {task_name!r}: task.prompt_template={template!r} cannot be filled ({exc!r}); "
            f"available fields are {sorted(fields)}"
        ) from exc


def sandbox_config(task: str, settings: Mapping[str, Any]) -> "SandboxConfig":
    """The sandbox settings of a code task (``task.sandbox``: limits, isolation, workers), checked when the task is
    built, so a typo fails before any job is submitted instead of every member running with the defaults."""
    from inner_loop.sandbox.pool import SandboxConfig

    refuse_unknown_keys(settings, (f.name for f in dataclasses.fields(SandboxConfig)), "task.sandbox",
                        prefix=f"task {task!r}: ")
    try:
        return SandboxConfig(**settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task {task!r}: task.{exc}") from None

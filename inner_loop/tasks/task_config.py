"""Turning a task's config mapping (YAML / Hydra) into a typed dataclass, rejecting mistakes up front.

A typo in a key ("validaton_size") or a wrong type would otherwise surface hours later on a cluster node, or
worse, silently fall back to a default. Every error names the key as the user writes it (``task.<key>``)
and says what to do.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

if TYPE_CHECKING:
    from inner_loop.sandbox.pool import SandboxConfig

T = TypeVar("T")


def plain(value: Any) -> Any:
    """Nested mappings / sequences (OmegaConf containers included) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


def _check_type(task: str, key: str, value: Any, hint: Any) -> Any:
    """Coerce/validate one value against the simple annotations used in task configs."""
    text = str(hint)
    optional = "None" in text
    if value is None:
        if optional:
            return None
        raise ValueError(f"task {task!r}: task.{key} must not be null")
    if text.startswith("dict"):
        if not isinstance(value, Mapping):
            raise ValueError(f"task {task!r}: task.{key} must be a mapping, got {value!r}")
        return dict(value)
    if "list[str]" in text:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"task {task!r}: task.{key} must be a list of strings, got {value!r}")
        return list(value)
    if "bool" in text:
        if not isinstance(value, bool):
            raise ValueError(f"task {task!r}: task.{key} must be true or false, got {value!r}")
        return value
    if "int" in text:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"task {task!r}: task.{key} must be an integer, got {value!r}")
        return value
    if "float" in text:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"task {task!r}: task.{key} must be a number, got {value!r}")
        return float(value)
    if "str" in text:
        if not isinstance(value, (str, Path)):
            raise ValueError(f"task {task!r}: task.{key} must be a string, got {value!r}")
        return str(value)
    return value


def config_from_mapping(cls: type[T], task: str, cfg: Mapping[str, Any]) -> T:
    """Build dataclass ``cls`` from ``cfg`` (minus its ``name``), failing on unknown keys and wrong types."""
    data = plain(cfg)
    data.pop("name", None)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(
            f"task {task!r}: unknown key(s) {['task.' + k for k in unknown]}; known keys are {sorted(fields)} "
            f"(see conf/task/{task}.yaml)"
        )
    hints = get_type_hints(cls)
    values = {key: _check_type(task, key, value, hints[key]) for key, value in data.items()}
    return cls(**values)


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

    known = {f.name for f in dataclasses.fields(SandboxConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"task {task!r}: unknown key(s) {['task.sandbox.' + k for k in unknown]}; known keys are "
                         f"{sorted(known)}")
    try:
        return SandboxConfig(**settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task {task!r}: task.{exc}") from None

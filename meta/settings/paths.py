"""Keys holding a filesystem path. A run records them absolute (resolved against the directory the user ran in), so
that a resume from another directory, and every member on every node, reads the same files."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, MutableMapping, Sequence

from core.config.dotted_keys import parent_of

#: the Hydra config tree of every command (conf/)
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

PATH_KEYS = ("run_dir", "init", "task.train_file", "task.test_file", "task.problems_file", "divergence.init",
             "model.gguf_file", "model.name_or_path", "stage.cache_dir")
# Values of these keys that are names, not paths.
_NOT_PATHS = {"init": ("uniform", "gaussian")}


def absolute_path(value: str, cwd: str | Path) -> str:
    """``value`` (``~`` expanded) made absolute against ``cwd``, normalised but with symlinks kept."""
    return os.path.normpath(os.path.join(str(cwd), os.path.expanduser(value)))


def _absolute_value(key: str, value: Any, cwd: str | Path) -> Any:
    if not isinstance(value, str) or not value or value in _NOT_PATHS.get(key, ()):
        return value
    if key == "model.name_or_path":  # a hub id ("Qwen/Qwen3-1.7B") is not a path: only local ones change
        local = value.startswith((".", "~", os.sep)) or os.path.exists(os.path.join(str(cwd), value))
        if not local:
            return value
    return absolute_path(value, cwd)


def absolute_paths(raw: MutableMapping[str, Any], cwd: str | Path) -> None:
    """Make every PATH_KEYS value of the resolved config absolute (in place)."""
    for key in PATH_KEYS:
        node, leaf = parent_of(raw, key)
        if isinstance(node, MutableMapping) and leaf in node:
            node[leaf] = _absolute_value(key, node[leaf], cwd)


def absolute_overrides(overrides: Sequence[str], cwd: str | Path) -> list[str]:
    """Command-line overrides with path values made absolute: they are recorded and replayed on resume,
    possibly from another directory, where a relative path would name another file."""
    result = []
    for override in overrides:
        key, sep, value = override.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in PATH_KEYS:
            override = f"{key}={_absolute_value(bare, value, cwd)}"
        result.append(override)
    return result

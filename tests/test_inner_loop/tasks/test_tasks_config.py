"""conf/task/*.yaml: every task has a file, every key is documented, and the files agree with the code."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from inner_loop.tasks import TASK_CONFIGS, TASK_NAMES, build_task

CONF = Path(__file__).resolve().parents[3] / "conf" / "task"


@pytest.mark.parametrize("name", TASK_NAMES)
def test_yaml_documents_every_key_and_matches_defaults(name: str) -> None:
    """conf/task/<name>.yaml composes on its task's config class (task/<name>_schema): over it, every key is there,
    nothing more, at the code's default, and each is documented where its default is written (the field's comment)."""
    import inspect

    from conf_groups import load_group

    cfg = load_group("task", name)
    assert cfg["name"] == name
    config_cls = TASK_CONFIGS[name]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    assert set(cfg) - {"name"} == set(fields)  # nothing missing, nothing extra
    defaults = config_cls()
    lines = inspect.getsource(config_cls).splitlines()
    for key in fields:
        assert cfg[key] == getattr(defaults, key), f"{name}: {key} differs from the code default"
        index = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:"))
        assert lines[index - 1].strip().startswith("#:") or lines[index - 2].strip().startswith("#:"), \
            f"{key} is undocumented"
    assert build_task(cfg).name == name


def test_omegaconf_mapping_is_accepted() -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"name": "arith", "operators": ["+", "*"], "train_size": 100})
    task = build_task(cfg)
    assert {p.meta["op"] for p in task.load("train")} == {"+", "*"}

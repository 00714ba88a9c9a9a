"""MBPP validates on the source's own validation split (hub `full`: 90 problems) unless told to carve one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import inner_loop.tasks.mbpp as mbpp
from inner_loop.tasks import build_task
from inner_loop.tasks.common.data_files import read_local_rows

FIXTURES = Path(__file__).parents[2] / "fixtures"
TRAIN, TEST, VALIDATION = (str(FIXTURES / f"mbpp_{name}.jsonl") for name in ("train", "test", "validation"))
LOCAL = {"name": "mbpp", "train_file": TRAIN, "test_file": TEST, "timeout_s": 1.0}


def _ids(problems) -> list[str]:
    return sorted(p.id for p in problems)


def test_local_validation_file_is_the_validation_split_and_nothing_is_carved():
    task = build_task({**LOCAL, "validation_file": VALIDATION})
    assert _ids(task.load("validation")) == ["mbpp-511", "mbpp-512"]
    assert _ids(task.load("train")) == [f"mbpp-{i}" for i in range(601, 606)]  # all five training problems
    assert _ids(task.load("test")) == ["mbpp-606"]


def test_hub_source_reads_the_hubs_validation_split(monkeypatch):
    files = {"train": TRAIN, "test": TEST, "validation": VALIDATION}
    asked = []

    def fake_hub(hub_id: str, config: str | None, split: str, file_keys=()):  # the local fixtures stand in for the hub
        asked.append(split)
        return read_local_rows(files[split])

    monkeypatch.setattr(mbpp, "load_hub_rows", fake_hub)
    task = build_task({"name": "mbpp", "validation_size": 1, "timeout_s": 1.0})
    assert _ids(task.load("validation")) == ["mbpp-511", "mbpp-512"]
    assert len(task.load("train")) == 5
    assert sorted(asked) == ["test", "train", "validation"]


def test_carve_keeps_the_old_split():
    task = build_task({**LOCAL, "validation_source": "carve", "validation_size": 2})
    validation, train = task.load("validation"), task.load("train")
    assert len(validation) == 2 and len(train) == 3
    assert set(_ids(validation) + _ids(train)) == {f"mbpp-{i}" for i in range(601, 606)}


def test_without_a_validation_file_auto_carves():
    task = build_task({**LOCAL, "validation_size": 1})
    assert len(task.load("validation")) == 1 and len(task.load("train")) == 4


def test_training_problems_repeating_a_validation_prompt_are_dropped(tmp_path):
    rows = read_local_rows(VALIDATION) + read_local_rows(TRAIN)[:1]  # task 601 is also in the training file
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task({**LOCAL, "validation_file": str(path)})
    assert "mbpp-601" in _ids(task.load("validation"))
    assert "mbpp-601" not in _ids(task.load("train")) and len(task.load("train")) == 4


@pytest.mark.parametrize("extra, message", [
    ({"validation_source": "hub"}, "task.validation_file"),
    ({"validation_source": "sometimes"}, "task.validation_source must be one of"),
    ({"validation_source": "carve", "validation_file": VALIDATION}, "ignores it"),
    ({"validation_file": "/no/such/file.jsonl"}, "task.validation_file="),
])
def test_bad_validation_settings_are_refused_up_front(extra, message):
    with pytest.raises(ValueError, match=message):
        build_task({**LOCAL, **extra})


def test_training_on_the_hub_validation_split_is_refused():
    with pytest.raises(ValueError, match="train_splits contains 'validation'"):
        build_task({"name": "mbpp", "train_splits": ["train", "validation"]})


def test_the_split_sizes_are_logged_once_and_say_where_validation_comes_from(caplog):
    """A dry run builds the task for every row it checks: one line, with the validation split's true size."""
    import logging

    from inner_loop.tasks.common import splits

    splits._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="inner_loop.tasks"):
        for _ in range(3):
            build_task({**LOCAL, "validation_file": VALIDATION}).load("train")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task mbpp: ")]
    assert lines == ["task mbpp: test=1, train=5, validation=2 (validation: the source's own validation split)"]

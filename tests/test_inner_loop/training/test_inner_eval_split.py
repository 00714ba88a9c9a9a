"""eval_split: a single run can be scored on the task's test split (final numbers); ES members never are."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inner_loop.config import InnerConfig
from inner_loop.member.lifecycle import train_in_process
from meta.search.config import INNER_NODES
from results.store.layout import RUN_MANIFEST_FILE
from core.records import ResultRecord
from helpers import inner_config, SMALL_UNWARMED

CONF = Path(__file__).resolve().parents[3] / "conf"


def _inner(**top) -> dict:
    inner = inner_config("none", task_keys={"validation_size": 40, "test_size": 24}, model_keys=SMALL_UNWARMED,
                         steps=1, batch_size=8, group_size=4, val_size=None, max_completion_length=4)
    inner.update(top)
    return inner


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRROR_ES_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("split, size", [("validation", 40), ("test", 24)])
def test_a_run_is_scored_on_the_split_it_names_and_its_record_says_which(cache, tmp_path, split, size):
    work = tmp_path / "run"
    record = train_in_process({"run_id": "single", "generation": 0, "index": 0, "seed": 0, "params": [],
                           "work_dir": str(work), "inner": _inner(eval_split=split)})
    assert record.status == "ok", record.error
    assert (record.eval_split, record.val_size) == (split, size)
    on_disk = json.loads((work / "result.json").read_text())
    assert on_disk["eval_split"] == split
    manifest = json.loads((work / RUN_MANIFEST_FILE).read_text())
    assert set(manifest["data_hashes"]) == {"train", split}


def test_an_unknown_eval_split_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"eval_split='train' is not one of \['validation', 'test'\]"):
        InnerConfig.from_dict(_inner(eval_split="train"))


def test_records_without_a_split_read_as_validation_and_a_bad_split_is_refused():
    assert ResultRecord.from_dict({"status": "ok", "fitness": 0.5}).eval_split == "validation"
    with pytest.raises(ValueError, match="eval_split"):
        ResultRecord(status="ok", eval_split="train")


def test_es_members_cannot_be_scored_on_test():
    """A member's inner config is built from these nodes only, so no search override can make fitness a test score."""
    assert "eval_split" not in INNER_NODES
    assert InnerConfig.from_dict({node: _inner()[node] for node in INNER_NODES}).eval_split == "validation"

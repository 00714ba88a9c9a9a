"""Without a reachable hub, a task's hub data is read from the local cache alone: no half-minute of retries per file,
and the error names every setting that can serve the data from local files (task.validation_file included). No
network is needed: the hub's endpoint is pointed at a closed local port."""
from __future__ import annotations

import logging

import datasets
import huggingface_hub.constants as hub_constants
import pytest

from inner_loop.tasks.common import data_files
from inner_loop.tasks.mbpp import MBPPConfig, MBPPTask


@pytest.fixture()
def unreachable_hub(monkeypatch) -> list[bool]:
    """The hub at a closed port; records whether each load_dataset call ran offline (it then fails, as with an
    empty cache)."""
    offline_at_load: list[bool] = []

    def load_dataset(*args, **kwargs):
        offline_at_load.append(bool(datasets.config.HF_HUB_OFFLINE and hub_constants.HF_HUB_OFFLINE))
        raise ConnectionError("Couldn't reach the dataset on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    for module, name in ((datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
                         (hub_constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, name, False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data_files._offline_unless_reachable.cache_clear()
    yield offline_at_load
    data_files._offline_unless_reachable.cache_clear()


def test_an_unreachable_hub_is_asked_once_and_then_read_offline(unreachable_hub, caplog):
    with caplog.at_level(logging.WARNING, logger="inner_loop.tasks.common.data_files"):
        for split in ("train", "test"):
            with pytest.raises(ValueError, match="task.train_file=<file>, task.test_file=<file>"):
                data_files.load_hub_rows("openai/gsm8k", "main", split)
    assert unreachable_hub == [True, True]  # datasets never went to the network
    assert caplog.text.count("cannot be reached") == 1


def test_the_mbpp_error_names_the_validation_file_too(unreachable_hub):
    with pytest.raises(ValueError) as raised:
        MBPPTask(MBPPConfig()).load("train")
    assert "task.validation_file=<file>" in str(raised.value) and unreachable_hub == [True]


def test_the_offline_setting_is_taken_as_it_is(unreachable_hub, monkeypatch, caplog):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.WARNING, logger="inner_loop.tasks.common.data_files"):
        with pytest.raises(ValueError):
            data_files.load_hub_rows("openai/gsm8k", "main", "train")
    assert "cannot be reached" not in caplog.text  # no probe: the user said offline

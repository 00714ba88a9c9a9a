"""What tests in more than one file build: one definition each, imported where used (tests/ is on sys.path in every
test session: tests/conftest.py's folder). Its fixtures (tiny_dir, drawn) reach every test: tests/conftest.py loads
this module as a plugin."""
from __future__ import annotations

import copy
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from conf_groups import load_group
from time_limits import scaled

#: the save-on-notice member's steps (tests/test_inner_loop/process/test_save_on_notice.py and its SLURM twin)
NOTICE_STEPS = 24


def notice_spec(work_dir: Path) -> dict:
    """A tiny pinned member of NOTICE_STEPS steps that saves no periodic checkpoint before its last step."""
    inner = inner_config("neural_mirror", model_keys=SMALL_WARMED, steps=NOTICE_STEPS, batch_size=16, group_size=4,
                         save_every=NOTICE_STEPS, val_size=32, max_completion_length=6)
    return member_spec(work_dir, inner, run_id="notice", seed=3)


def same_outcome(record, reference) -> tuple:
    """The numbers a noticed run must share with its uninterrupted reference, side by side."""
    return (record.fitness, record.mean_response_tokens, record.diagnostics.get("reward_mean")), \
        (reference.fitness, reference.mean_response_tokens, reference.diagnostics.get("reward_mean"))


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``path`` exists, ``proc`` has ended or ``timeout`` (scaled) has passed; the caller checks which."""
    deadline = time.monotonic() + scaled(timeout)
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


#: the tiny model at its smallest that still learns arith (conf/model/tiny.yaml's shape keys)
SMALL_SHAPE = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
#: SMALL_SHAPE untrained (no warm-up): for what a run does, not what it learns
SMALL_UNWARMED = {**SMALL_SHAPE, "warmup_max_steps": 0}
#: SMALL_SHAPE with a fixed 200-step warm-up (a band any model is inside, checked once at the cap): a model that
#: sometimes answers, not one of a particular skill
SMALL_WARMED = {**SMALL_SHAPE, "warmup_max_steps": 200, "warmup_band": [0.0, 1.0], "warmup_check_every": 200,
                "warmup_probe_size": 32, "warmup_lr": 3e-3, "warmup_batch_size": 32}
#: half SMALL_SHAPE's width, untrained: members that fail or stop before anything is learnt
NARROW_UNWARMED = {"warmup_max_steps": 0, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


def inner_config(divergence: str = "prob_l2", *, task: str = "arith", task_keys: dict[str, Any] | None = None,
                 model: str = "tiny", model_keys: dict[str, Any] | None = None, **train: Any) -> dict[str, Any]:
    """An inner config as the groups in conf/ give it (load_group: task, model, divergence, train=default), with
    ``task_keys``, ``model_keys`` and the train keys ``train`` over them (copied: a caller's nested dict stays its
    own)."""
    return {"task": {**load_group("task", task), **copy.deepcopy(task_keys or {})},
            "model": {**load_group("model", model), **copy.deepcopy(model_keys or {})},
            "divergence": load_group("divergence", divergence),
            "train": {**load_group("train", "default"), **copy.deepcopy(train)}}


def member_spec(work_dir: Path, inner: dict[str, Any], *, run_id: str = "t", seed: int = 0, index: int = 0
                ) -> dict[str, Any]:
    """The spec (as the job's JSON) of a single member of generation 0 without ES parameters: a plain training run."""
    return {"run_id": run_id, "generation": 0, "index": index, "seed": seed, "params": [], "work_dir": str(work_dir),
            "inner": inner}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The SMALL_SHAPE tiny model built in a cache of the test module's own."""
    from inner_loop.config import ModelConfig
    from inner_loop.models.tiny import tiny_model_dir

    return str(tiny_model_dir(ModelConfig(**SMALL_SHAPE), root=tmp_path_factory.mktemp("cache")))


@pytest.fixture()
def one_thread() -> Iterator[None]:
    """Torch at one thread in this test process, restored after. On a busy machine (the suite's two workers and its
    SLURM session on two cores) a second thread mostly spins waiting for the first: tiny kernels at a batch of 2000
    ran 25x slower in wall time, and one SmolLM2-135M training step took 65 CPU-s at two threads, 18 at one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The figure each plot of a search's report saves, by file name (the PNG is still written)."""
    from results.report.search import plots

    figures: dict[str, Any] = {}
    save = plots._save

    def keep(fig: Any, path: str | Path) -> Path:
        figures[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures

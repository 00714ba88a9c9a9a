"""train_in_process end to end on a small tiny model: result record, idempotence, failure status, resume after kill."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inner_loop.training.checkpoints import last_checkpoint
from inner_loop.member.lifecycle import train_in_process
from core.keys import GENERATE_TIME_MEAN, STEP_TIME_MEAN
from results.store.member_files import read_result
from helpers import inner_config, member_spec, SMALL_WARMED

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf"


def _inner(divergence: str = "prob_l2", **train) -> dict:
    return inner_config(divergence, model_keys=SMALL_WARMED, **{
        "steps": 4, "batch_size": 16, "group_size": 4, "save_every": 2, "val_size": 32, "max_completion_length": 6,
        **train})


def _spec(work_dir: Path, inner: dict, seed: int = 0) -> dict:
    return member_spec(work_dir, inner, seed=seed)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("mirror-es-cache")
    old = os.environ.get("MIRROR_ES_CACHE")
    os.environ["MIRROR_ES_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MIRROR_ES_CACHE", None)
    else:
        os.environ["MIRROR_ES_CACHE"] = old


def test_member_writes_a_complete_record_and_is_idempotent(cache, tmp_path):
    record = train_in_process(_spec(tmp_path / "m", _inner()))
    assert record.status == "ok", record.error
    assert record.steps_done == 4 and record.val_size == 32
    assert 0.0 <= record.fitness <= 1.0 and record.mean_response_tokens > 0
    for key in ("reward_mean", "zero_variance_group_frac", "clipped_completion_ratio", "regularizer_value",
                "regularizer_grad_share", "wall_time_s", "steps_done"):
        assert key in record.diagnostics and math.isfinite(record.diagnostics[key])
    # the step's generation is timed beside the step (the decode's share of it measured, not guessed)
    assert 0.0 < record.diagnostics[GENERATE_TIME_MEAN] < record.diagnostics[STEP_TIME_MEAN]
    assert read_result(tmp_path / "m") == record
    stamp = (tmp_path / "m" / "result.json").stat().st_mtime_ns
    again = train_in_process(_spec(tmp_path / "m", _inner()))
    assert again == record and (tmp_path / "m" / "result.json").stat().st_mtime_ns == stamp


def test_non_finite_loss_ends_as_failed_with_the_reason(cache, tmp_path, monkeypatch):
    import inner_loop.training.setup as run_setup
    from inner_loop.loss.regularizers import Regularizer, build_regularizer

    class Overflowing(Regularizer):
        """A divergence that overflows, as a badly scaled mirror map can."""

        def per_token(self, logps, ref_logps, logits=None, ref_logits=None):
            return super().per_token(logps, ref_logps, logits, ref_logits) * float("inf")

    def build(cfg, params=None):
        reg = build_regularizer(cfg, params)
        return Overflowing(reg.name, reg.form, reg.coef, reg.potential)

    monkeypatch.setattr(run_setup, "build_regularizer", build)
    record = train_in_process(_spec(tmp_path / "m", _inner(steps=3)))
    assert record.status == "failed" and "non-finite loss" in record.error
    assert record.fitness == 0.0 and json.loads((tmp_path / "m" / "result.json").read_text())["status"] == "failed"


_CHILD = """
import json, sys
from inner_loop.member.lifecycle import train_in_process
train_in_process(json.loads(sys.argv[1]))
"""


@pytest.mark.slow
def test_killed_member_resumes_from_its_checkpoint_and_matches(cache, tmp_path):
    """The killed member trains with the default rotation (save_total_limit 1) and keeps its last checkpoint;
    the uninterrupted reference keeps all of them (its checkpoint-4 shows that training moved the weights)."""
    inner = _inner(steps=24, save_every=4, keep_checkpoints="last")
    assert inner["train"]["save_total_limit"] == 1
    reference = train_in_process(_spec(tmp_path / "straight", {**inner, "train": {**inner["train"],
                                                                            "keep_checkpoints": "all"}}))
    assert reference.status == "ok", reference.error

    work = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(_spec(work, inner))], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and child.poll() is None:
        if (work / "checkpoints" / "checkpoint-4" / "trainer_state.json").is_file():
            time.sleep(0.2)  # let the checkpoint's last files land; a partial newer one is what a kill leaves
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    child.wait(60)
    assert read_result(work) is None, "the child finished before it could be killed; the test proved nothing"
    partial = last_checkpoint(work)
    assert partial is not None and int(partial.rsplit("-", 1)[1]) < 24
    # Rotation kept at most the newest complete checkpoint plus one being written when the kill came.
    assert len(list((work / "checkpoints").glob("checkpoint-*"))) <= 2

    resumed = train_in_process(_spec(work, inner))
    assert resumed.status == "ok", resumed.error
    assert resumed.steps_done == 24
    assert sorted(p.name for p in (work / "checkpoints").glob("checkpoint-*")) == ["checkpoint-24"]
    assert abs(resumed.fitness - reference.fitness) <= 0.07
    assert resumed.diagnostics["reward_mean"] == pytest.approx(reference.diagnostics["reward_mean"], abs=0.1)
    # The trained weights match the uninterrupted run's, and training did move them.
    from safetensors.torch import load_file

    final = {name: load_file(str(tmp_path / name / "checkpoints" / "checkpoint-24" / "model.safetensors"))
             for name in ("straight", "killed")}
    first = load_file(str(tmp_path / "straight" / "checkpoints" / "checkpoint-4" / "model.safetensors"))
    moved = max((final["straight"][k] - first[k]).abs().max().item() for k in first)
    gap = max((final["straight"][k] - final["killed"][k]).abs().max().item() for k in first)
    assert moved > 0
    assert gap <= 1e-3 * max(moved, 1e-6) + 1e-6, f"resumed weights differ by {gap} (training moved them {moved})"


def test_resume_skips_a_checkpoint_killed_mid_save(tmp_path):
    """A kill while the Trainer writes checkpoint-N leaves a folder without trainer_state.json: resume from N-1."""
    import json

    from inner_loop.training.checkpoints import CHECKPOINT_DIR, last_checkpoint

    root = tmp_path / CHECKPOINT_DIR
    for step, complete in ((4, True), (8, False)):
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w")
        (folder / "optimizer.pt").write_bytes(b"o")
        if complete:
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert last_checkpoint(tmp_path) == str(root / "checkpoint-4")
    (root / "checkpoint-8" / "trainer_state.json").write_text('{"global_st')
    assert last_checkpoint(tmp_path) == str(root / "checkpoint-4")
    (root / "checkpoint-8" / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    assert last_checkpoint(tmp_path) == str(root / "checkpoint-8")
    assert last_checkpoint(tmp_path / "nothing") is None


def test_a_member_shows_its_progress_and_logs_trls_metrics_to_tensorboard(cache, tmp_path):
    """progress.json (meta.status, the orchestrator's warnings) and an event file with TRL's train metrics, read
    back with tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from results.store.layout import TENSORBOARD_DIR
    from results.store.member_files import read_progress

    record = train_in_process(_spec(tmp_path / "m", _inner()))
    assert record.status == "ok", record.error
    progress = read_progress(tmp_path / "m")
    assert progress is not None and (progress.step, progress.max_steps) == (4, 4)
    assert progress.reward_mean is not None and progress.zero_std_fraction is not None
    assert progress.regularizer_grad_share is not None and len(progress.zero_std_recent) == 4
    assert progress.seconds_per_step is not None and progress.seconds_per_step > 0
    events = EventAccumulator(str(tmp_path / "m" / TENSORBOARD_DIR))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/reward", "train/loss", "train/frac_reward_zero_std", "train/regularizer/grad_share"} <= tags, tags
    assert [e.step for e in events.Scalars("train/reward")] == [1, 2, 3, 4]


def test_the_reporting_backends_checked_without_transformers_are_transformers_own():
    """check_report_to accepts the names of its module table without importing transformers' list: each must be
    one of the pinned transformers' integrations, or a typo of a new name would pass the up-front check."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    from inner_loop.trl_settings.trl_overrides import _REPORT_MODULES

    assert set(_REPORT_MODULES) <= set(INTEGRATION_TO_CALLBACK), set(_REPORT_MODULES) - set(INTEGRATION_TO_CALLBACK)


@pytest.mark.parametrize("report_to, fragment", [(["tensorbord"], "not a transformers reporting integration"),
                                                 (["wandb"], "needs the 'wandb' package")])
def test_a_reporting_backend_that_cannot_work_is_refused_up_front(report_to, fragment):
    import importlib.util

    from inner_loop.config import InnerConfig

    if report_to == ["wandb"] and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    with pytest.raises(ValueError, match="train.report_to") as err:
        InnerConfig.from_dict(_inner(report_to=report_to))
    assert fragment in str(err.value)

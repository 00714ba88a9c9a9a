"""train.keep_checkpoints / save_total_limit and the member's peak disk use.

The policy is checked on real tiny members (checkpoints written by the Trainer every step), and its pieces -
deletion, a deletion interrupted by a crash, peak tracking across rotation and resume - on plain folders.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from inner_loop.training.callbacks import DiskUsageCallback
from inner_loop.training.checkpoints import (CHECKPOINT_DIR, TRASH_DIR, apply_checkpoint_policy, dir_bytes,
                                             finalize_member, last_checkpoint)
from inner_loop.member.lifecycle import train_in_process
from core.records import ResultRecord
from results.store.layout import FINAL_MODEL_DIR
from results.store.member_files import read_result, write_result
from conf_groups import load_group
from helpers import inner_config, member_spec, SMALL_WARMED

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf"
STEPS = 4


def _inner(**train) -> dict:
    """The small tiny model with a fixed 200-step warm-up (shared with test_inner_member.py through the session
    cache)."""
    return inner_config("prob_l2", model_keys=SMALL_WARMED, **{
        "steps": STEPS, "batch_size": 16, "group_size": 4, "save_every": 1, "val_size": 16, "max_completion_length": 6,
        **train})


def _spec(work_dir: Path, inner: dict) -> dict:
    return member_spec(work_dir, inner)


def _checkpoints(work_dir: Path) -> list[str]:
    """Every checkpoint-* folder anywhere under the work dir (not only where the Trainer puts them)."""
    return sorted(p.name for p in work_dir.rglob("checkpoint-*") if p.is_dir())


# ----------------------------------------------------------------------------------------- real members
@pytest.fixture(scope="module")
def members(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """One finished member per policy (the default yaml's keep_checkpoints is `none`)."""
    root = tmp_path_factory.mktemp("policies")
    out = {}
    for keep in ("all", "last", "none"):
        work = root / keep
        out[keep] = (work, train_in_process(_spec(work, _inner(keep_checkpoints=keep))))
    return out


def test_default_policy_is_none():
    assert load_group("train", "default")["keep_checkpoints"] == "none"


@pytest.mark.parametrize("keep, expected", [("none", []), ("last", [f"checkpoint-{STEPS}"]),
                                            ("all", [f"checkpoint-{s}" for s in range(1, STEPS + 1)])])
def test_finished_member_keeps_what_its_policy_says(members, keep, expected):
    work, record = members[keep]
    assert record.status == "ok", record.error
    assert _checkpoints(work) == expected
    assert not (work / TRASH_DIR).exists()
    assert read_result(work) == record  # the result itself is untouched
    if keep == "last":
        assert last_checkpoint(work) == str(work / CHECKPOINT_DIR / f"checkpoint-{STEPS}")


def test_peak_disk_is_recorded_and_covers_the_checkpoints(members):
    one_checkpoint = dir_bytes(members["all"][0] / CHECKPOINT_DIR / f"checkpoint-{STEPS}")
    assert one_checkpoint > 0
    peaks = {keep: record.disk_peak_bytes for keep, (_, record) in members.items()}
    assert all(isinstance(p, int) and p > 0 for p in peaks.values()), peaks
    # save_total_limit=1: the Trainer writes checkpoint N+1 before it deletes N, so two coexist at each save.
    last_two = sum(dir_bytes(members["all"][0] / CHECKPOINT_DIR / f"checkpoint-{s}") for s in (STEPS - 1, STEPS))
    assert peaks["none"] >= last_two and peaks["last"] >= last_two, (peaks, last_two)
    # keep=all: no rotation, all checkpoints at the end, and the peak is at least what is on disk now.
    every = [dir_bytes(p) for p in (members["all"][0] / CHECKPOINT_DIR).glob("checkpoint-*")]
    assert len(every) == STEPS and peaks["all"] >= sum(every)
    assert peaks["all"] >= dir_bytes(members["all"][0]) - 4096  # minus result.json, written after the measurement
    assert json.loads((members["none"][0] / "result.json").read_text())["disk_peak_bytes"] == peaks["none"]


def test_final_model_survives_keep_none_for_single_runs(tmp_path):
    from safetensors.torch import load_file

    record = train_in_process(_spec(tmp_path / "m", _inner(steps=2)), save_final=True)
    assert record.status == "ok", record.error
    assert _checkpoints(tmp_path / "m") == []
    weights = load_file(str(tmp_path / "m" / FINAL_MODEL_DIR / "model.safetensors"))
    assert weights and (tmp_path / "m" / FINAL_MODEL_DIR / "config.json").is_file()
    assert not (tmp_path / "m" / f".{FINAL_MODEL_DIR}.tmp").exists()


def test_single_run_entry_point_asks_for_the_final_model(monkeypatch, tmp_path):
    """python -m inner_loop.run keeps final/ (ES members, called as fn(spec), do not)."""
    import inner_loop.run as run

    calls = []
    monkeypatch.setattr(run, "train_member", lambda spec, **kw: calls.append(kw) or ResultRecord(status="ok"))
    monkeypatch.setattr(sys, "argv", ["inner_loop.run", f"work_dir={tmp_path / 'w'}"])
    with pytest.raises(SystemExit) as done:
        run.main()
    assert done.value.code == 0 and calls == [{"save_final": True}]


# ----------------------------------------------------------------------------------------- plain folders
def _fake_checkpoint(root: Path, step: int, complete: bool = True, size: int = 1000) -> Path:
    folder = root / CHECKPOINT_DIR / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * size)
    (folder / "optimizer.pt").write_bytes(b"o" * size)
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_policy_last_drops_older_and_incomplete_checkpoints(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):
        _fake_checkpoint(tmp_path, step, complete)
    removed = apply_checkpoint_policy(tmp_path, "last")
    assert sorted(removed) == [f"{CHECKPOINT_DIR}/checkpoint-2", f"{CHECKPOINT_DIR}/checkpoint-6"]
    assert _checkpoints(tmp_path) == ["checkpoint-4"]
    assert apply_checkpoint_policy(tmp_path, "last") == []  # idempotent
    assert apply_checkpoint_policy(tmp_path, "all") == [] and _checkpoints(tmp_path) == ["checkpoint-4"]
    apply_checkpoint_policy(tmp_path, "none")
    assert not (tmp_path / CHECKPOINT_DIR).exists() and not (tmp_path / TRASH_DIR).exists()
    with pytest.raises(ValueError, match="train.keep_checkpoints"):
        apply_checkpoint_policy(tmp_path, "newest")


def test_cleanup_interrupted_by_a_crash_is_finished_by_the_next_call(tmp_path):
    """Result written, then killed mid-delete: the idempotent entry returns the result and finishes the job."""
    work = tmp_path / "m"
    _fake_checkpoint(work, 2)
    (work / TRASH_DIR / "0-checkpoint-1").mkdir(parents=True)  # what a kill during the delete leaves
    (work / TRASH_DIR / "0-checkpoint-1" / "optimizer.pt").write_bytes(b"o")
    record = ResultRecord(status="ok", fitness=0.5, steps_done=2, disk_peak_bytes=123)
    write_result(work, record)
    again = train_in_process(_spec(work, _inner()))
    assert again == record
    assert _checkpoints(work) == [] and not (work / TRASH_DIR).exists()


def test_failed_member_keeps_its_checkpoint_for_a_retry(tmp_path, monkeypatch):
    """A failure may be retried (the retry resumes from the checkpoint), so only the final result deletes it."""
    import inner_loop.member.lifecycle as member

    def boom(*args, **kwargs):
        raise RuntimeError("evaluation crashed")

    monkeypatch.setattr(member, "_evaluate", boom)
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner(steps=2)))
    assert record.status == "failed" and "evaluation crashed" in record.error
    assert _checkpoints(work) == ["checkpoint-2"] and record.disk_peak_bytes and record.disk_peak_bytes > 0
    # A later call (a duplicate job) finds the final result and removes the kept checkpoint ...
    assert train_in_process(_spec(work, _inner(steps=2))) == record
    assert _checkpoints(work) == []


def test_a_member_settled_as_failed_loses_its_checkpoint_when_the_search_finalizes_it(tmp_path, monkeypatch):
    """... but a settled member is never called again: the orchestrator calls the member program's ``finalize``."""
    import inner_loop.member.lifecycle as member
    from inner_loop.member.entry import program

    def boom(*args, **kwargs):
        raise RuntimeError("evaluation crashed")

    monkeypatch.setattr(member, "_evaluate", boom)
    work = tmp_path / "m"
    spec = _spec(work, _inner(steps=2))
    finalize_member(spec)  # nothing final yet: nothing happens
    assert train_in_process(spec).status == "failed" and _checkpoints(work) == ["checkpoint-2"]
    program.finalize(spec)
    assert _checkpoints(work) == [] and read_result(work).status == "failed"


def test_the_orchestrator_settles_a_member_without_importing_a_trainer(tmp_path):
    """The orchestrator calls the member program's ``finalize`` for every settled member: that must not import
    TRL or transformers (~9 CPU-s in a search's own process, more where vLLM is installed, which TRL then imports)."""
    work = tmp_path / "m"
    (work / CHECKPOINT_DIR / "checkpoint-2").mkdir(parents=True)
    spec = _spec(work, _inner(steps=2, keep_checkpoints="none"))
    write_result(work, ResultRecord(status="failed", error="boom"))
    probe = ("import json, sys\n"
             "from inner_loop.member.entry import program\n"
             "program.finalize(json.loads(sys.argv[1]))\n"
             "print(json.dumps(sorted(m for m in ('trl', 'transformers', 'vllm') if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(spec)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
    assert _checkpoints(work) == []  # and it did settle the checkpoints


def test_a_delete_that_fails_never_turns_a_finished_member_into_a_failure(tmp_path, monkeypatch):
    """An NFS server refusing to drop a busy file must not raise out of the member (the launcher would then
    write a failed record over the ok one); the leftovers go on the next call."""
    import inner_loop.training.checkpoints as checkpoints

    real = checkpoints.apply_checkpoint_policy

    def refuse(work_dir, keep):
        raise OSError(16, "Device or resource busy", ".nfs000000001")

    monkeypatch.setattr(checkpoints, "apply_checkpoint_policy", refuse)
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner(steps=2)))
    assert record.status == "ok", record.error
    assert read_result(work) == record and _checkpoints(work) == ["checkpoint-2"]
    monkeypatch.setattr(checkpoints, "apply_checkpoint_policy", real)
    assert train_in_process(_spec(work, _inner(steps=2))) == record
    assert _checkpoints(work) == []


def test_resume_from_a_checkpoint_written_before_disk_tracking(tmp_path):
    """A member checkpointed by an older version (no DiskUsageCallback entry in trainer_state.json) resumes."""
    work = tmp_path / "m"
    first = train_in_process(_spec(work, _inner(steps=2, keep_checkpoints="all")))
    assert first.status == "ok", first.error
    state_file = work / CHECKPOINT_DIR / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["stateful_callbacks"].pop("DiskUsageCallback")["attributes"]["peak_bytes"] > 0
    state_file.write_text(json.dumps(state))
    (work / "result.json").unlink()
    resumed = train_in_process(_spec(work, _inner(steps=3, keep_checkpoints="all")))
    assert resumed.status == "ok" and resumed.steps_done == 3, resumed.error
    assert _checkpoints(work) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


def test_disk_callback_counts_checkpoints_rotated_out_during_a_save(tmp_path):
    tracker = DiskUsageCallback(str(tmp_path))
    state = SimpleNamespace(stateful_callbacks={})
    (tmp_path / "result.json").write_text("x" * 10)
    tracker.on_train_begin(None, state, None)
    assert tracker.peak_bytes == 10
    first = _fake_checkpoint(tmp_path, 1, size=1000)
    tracker.on_save(None, state, None)
    one = dir_bytes(first)
    assert tracker.peak_bytes == 10 + one
    # The Trainer writes checkpoint-2, then deletes checkpoint-1, then calls on_save: both were on disk.
    _fake_checkpoint(tmp_path, 2, size=1000)
    import shutil

    shutil.rmtree(first)
    tracker.on_save(None, state, None)
    assert tracker.peak_bytes == 10 + one + dir_bytes(tmp_path / CHECKPOINT_DIR / "checkpoint-2")


def test_disk_peak_survives_a_resume_through_trainer_state(tmp_path):
    """The Trainer stores the callback's state() in each checkpoint's trainer_state.json; a resumed run reads it."""
    tracker = DiskUsageCallback(str(tmp_path))
    tracker.peak_bytes = 10**9
    stored = {"DiskUsageCallback": tracker.state()}
    resumed = DiskUsageCallback(str(tmp_path))
    resumed.on_train_begin(None, SimpleNamespace(stateful_callbacks=stored), None)
    assert resumed.peak_bytes == 10**9

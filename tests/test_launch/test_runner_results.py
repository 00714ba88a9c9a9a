"""A member's result.json is never overwritten by the orchestrator (issue 13, item 1).

On a shared filesystem a file written on another node can look absent for up to ~60 s (NFS negative-lookup
cache). These tests put such a view between the runner and the member directories (``HiddenFiles``: a new
result.json reads as absent for a while) and check that the member's own ``ok`` record survives as the final
record, and that a record the orchestrator decides on itself (failed, timeout) never replaces a result.json
that appears while it decides.
"""
from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest

import launch.runner as runner_module
from conf_groups import load_group
from launch.base import JobRef, Launcher
from launch.factory import build_launcher, runner_policy
from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.options import SlurmOptions
from launch.local.launchers import DebugLauncher
import results.store.atomic as atomic_module
from results.store.layout import RESULT_FILE
from core.records import MemberSpec, ResultRecord
from results.store.member_files import read_result, write_result, write_result_if_absent

ENTRY = "meta.synthetic:member"
CONF = Path(__file__).resolve().parents[2] / "conf" / "launcher"


def _specs(tmp_path: Path, n: int = 1) -> list[MemberSpec]:
    return [
        MemberSpec(run_id="t", generation=0, index=i, seed=0, params=[0.02] * 380,
                   work_dir=str(tmp_path / f"member_{i:03d}"), inner={"options": {"count_calls": True}})
        for i in range(n)
    ]


def _runner(launcher: Launcher, specs: list[MemberSpec], tmp_path: Path, saved: dict, **policy) -> MemberArrayRunner:
    defaults = dict(retries=0, timeout_s=30, kill_grace_s=5, result_scan_interval_s=0.05)
    return MemberArrayRunner(launcher, ENTRY, specs, {}, lambda jobs: saved.update({k: dict(v) for k, v in jobs.items()}),
                             tmp_path / "submitit", RunnerPolicy(**{**defaults, **policy}))


class HiddenFiles:
    """The runner's view of member directories through an NFS-like client cache: a result.json younger than
    ``hide_s`` reads as absent (the member process itself sees its own file, as on its own node)."""

    def __init__(self, hide_s: float) -> None:
        self.hide_s = hide_s
        self.hidden_reads = 0

    def __call__(self, work_dir: str | Path) -> ResultRecord | None:
        path = Path(work_dir) / RESULT_FILE
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return None
        if age < self.hide_s:
            self.hidden_reads += 1
            return None
        return read_result(work_dir)


class CompletedWithoutResult(DebugLauncher):
    """Debug launcher that classes a job which ended without a visible result the way SLURM's does for
    COMPLETED (status failed), or as lost (None: resubmitted) when ``lost``."""

    def __init__(self, lost: bool = False, **options) -> None:
        super().__init__(**options)
        self.lost = lost

    def ended_status(self, ref: JobRef) -> tuple[str, str] | None:
        return None if self.lost else ("failed", f"job {ref.job_id} ended COMPLETED without writing a result")


@pytest.mark.parametrize("lost", [False, True], ids=["completed", "lost"])
def test_a_result_hidden_by_the_filesystem_for_a_while_is_found_after_the_grace(tmp_path, monkeypatch, lost):
    view = HiddenFiles(hide_s=0.6)
    monkeypatch.setattr(runner_module, "read_result", view)
    specs = _specs(tmp_path)
    saved: dict = {}
    start = time.monotonic()
    records = _runner(CompletedWithoutResult(lost=lost), specs, tmp_path, saved, result_grace_s=1.0).run()
    assert view.hidden_reads > 0  # the runner did meet the stale view
    assert records[0].status == "ok", records[0].error
    on_disk = read_result(specs[0].work_dir)
    assert on_disk is not None and on_disk.status == "ok" and on_disk.fitness == records[0].fitness
    assert (Path(specs[0].work_dir) / "calls.log").read_text().splitlines() == ["attempt 0"]
    assert saved[0]["submissions"] == 1  # neither resubmitted nor retried
    assert view.hide_s <= time.monotonic() - start < 10  # it waited for the file to show


def test_a_result_hidden_past_the_grace_still_wins_over_the_orchestrators_failed_record(tmp_path, monkeypatch):
    """Grace shorter than the stale view: the orchestrator decides "failed", the file server refuses its
    create because result.json exists, and the member's record is read (retrying until visible) and kept."""
    view = HiddenFiles(hide_s=1.0)
    monkeypatch.setattr(runner_module, "read_result", view)
    monkeypatch.setattr(runner_module, "EXISTING_READ_PAUSE_S", 0.2)
    specs = _specs(tmp_path)
    records = _runner(CompletedWithoutResult(), specs, tmp_path, {}, result_grace_s=0.1).run()
    assert records[0].status == "ok", records[0].error
    assert read_result(specs[0].work_dir).status == "ok"
    assert not list(Path(specs[0].work_dir).glob("result.attempt*.json"))


class RaceLauncher(DebugLauncher):
    """The member writes its result exactly while the orchestrator decides how the job ended."""

    def ended_status(self, ref: JobRef) -> tuple[str, str] | None:
        spec = self._specs_by_job[ref.job_id]
        write_result(spec.work_dir, ResultRecord(status="ok", fitness=0.75, val_size=4, steps_done=3))
        return "failed", "ended COMPLETED without writing a result"

    def submit(self, entrypoint, specs, folder, timeout_s):
        refs = super().submit(entrypoint, specs, folder, timeout_s)
        self._specs_by_job = {ref.job_id: spec for ref, spec in zip(refs, specs)}
        self._pending.clear()  # the member never runs here: the "job" ends at once, result-less so far
        return refs


def test_the_orchestrators_failed_record_never_replaces_a_result_written_while_it_decides(tmp_path):
    specs = _specs(tmp_path)
    records = _runner(RaceLauncher(), specs, tmp_path, {}, retries=1).run()
    assert records[0].status == "ok" and records[0].fitness == 0.75
    assert read_result(specs[0].work_dir).fitness == 0.75
    assert not (Path(specs[0].work_dir) / "result.attempt0.json").exists()  # no retry of an ok member


class Running(Launcher):
    """A job that runs until cancelled; ``on_cancel`` lets the member finish at that very moment."""

    poll_interval_s = 0.02

    def __init__(self, on_cancel=None) -> None:
        super().__init__()
        self.on_cancel = on_cancel
        self.live: set[str] = set()
        self.cancelled: list[str] = []

    def submit(self, entrypoint, specs, folder, timeout_s):
        refs = [JobRef(job_id=f"job-{spec.index}", folder=str(folder), attempt=spec.attempt) for spec in specs]
        self.live.update(ref.job_id for ref in refs)
        return refs

    def is_alive(self, ref: JobRef) -> bool:
        return ref.job_id in self.live

    def cancel(self, refs) -> None:
        for ref in refs:
            self.cancelled.append(ref.job_id)
            self.live.discard(ref.job_id)
            if self.on_cancel is not None:
                self.on_cancel(ref)


def _started_long_ago(work_dir: Path, seconds: float) -> None:
    """A running member's ledger whose run started ``seconds`` ago (plus the marker's old ``time`` key)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    (work_dir / "started.json").write_text(json.dumps({
        "attempt": 0, "started_at": now - seconds, "used_before_s": 0.0, "used_s": seconds - 0.1,
        "updated_at": now - 0.1, "running": True, "time": now - seconds,
    }))


def test_the_orchestrators_timeout_never_replaces_a_result_written_as_it_cancels(tmp_path):
    specs = _specs(tmp_path)
    _started_long_ago(Path(specs[0].work_dir), 10.0)
    launcher = Running(on_cancel=lambda ref: write_result(specs[0].work_dir, ResultRecord(status="ok", fitness=0.5)))
    records = _runner(launcher, specs, tmp_path, {}, timeout_s=1.0, kill_grace_s=0.1).run()
    assert launcher.cancelled == ["job-0"]  # the runner did decide on a timeout
    assert records[0].status == "ok" and records[0].fitness == 0.5
    assert read_result(specs[0].work_dir).status == "ok"


def test_without_a_result_the_orchestrators_own_record_is_written(tmp_path):
    specs = _specs(tmp_path)
    _started_long_ago(Path(specs[0].work_dir), 10.0)
    records = _runner(Running(), specs, tmp_path, {}, timeout_s=1.0, kill_grace_s=0.1).run()
    assert records[0].status == "timeout" and "running time" in records[0].error
    assert read_result(specs[0].work_dir).status == "timeout"


def test_write_result_if_absent_creates_once_and_leaves_no_temp_files(tmp_path):
    mine = ResultRecord(status="failed", error="orchestrator")
    assert write_result_if_absent(tmp_path / "m", mine) is True
    assert read_result(tmp_path / "m") == mine
    assert write_result_if_absent(tmp_path / "m", ResultRecord(status="timeout")) is False
    assert read_result(tmp_path / "m") == mine
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [RESULT_FILE]


def test_write_result_if_absent_falls_back_to_an_exclusive_create_without_hard_links(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(atomic_module.os, "link", no_links)
    assert write_result_if_absent(tmp_path, ResultRecord(status="cancelled")) is True
    assert read_result(tmp_path).status == "cancelled"
    assert write_result_if_absent(tmp_path, ResultRecord(status="failed")) is False
    assert read_result(tmp_path).status == "cancelled"
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULT_FILE]


def test_result_grace_is_a_launcher_setting_with_filesystem_defaults():
    graces = {}
    for name in ("debug", "local", "slurm"):
        cfg = load_group("launcher", name, resolve=False)  # the YAML over its launcher's settings class
        graces[name] = runner_policy(1, 60, cfg).result_grace_s
    assert graces == {"debug": 0.0, "local": 0.0, "slurm": 90.0}
    assert SlurmOptions.from_options({}).result_grace_s == 90.0
    for bad in (-1, "soon", True):
        with pytest.raises(ValueError, match="launcher.result_grace_s"):
            runner_policy(1, 60, {"result_grace_s": bad})
        with pytest.raises(ValueError, match="launcher.result_grace_s"):
            SlurmOptions.from_options({"result_grace_s": bad})
    assert build_launcher({"cls": "launch.local.launchers:DebugLauncher", "result_grace_s": 5}) is not None

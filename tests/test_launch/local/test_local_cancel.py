"""launcher=local stops a member it cancels (a straggler closed at the quorum, a pruned trial, a failed trial's
siblings), with its member process, however the orchestrator was started: with SIGINT ignored (a search started
with `nohup ... &` from a script), by an earlier orchestrator process (a resume), from a thread."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from launch.base import JobRef
from launch.factory import build_launcher
from launch.local.controllers import controller_running
from meta.search.run import main
from core.records import MemberSpec
from results.store.member_files import read_result
from results.store.run_store import RunStore

LOCAL = {"name": "local", "cls": "launch.local.launchers:LocalLauncher", "kill_grace_s": 5}


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """This process ignores SIGINT, as one started in the background by a non-interactive shell does."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _job_processes(job_id: str) -> list[int]:
    """Live processes of the local job: its controller and every process started with its job id (the member)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (entry.name == job_id or f"SUBMITIT_LOCAL_JOB_ID={job_id}".encode() in environ):
            found.append(int(entry.name))
    return found


def _wait_gone(job_id: str, timeout: float = 30.0) -> list[int]:
    """The job's processes still alive after ``timeout``; those are killed before returning (a failing test
    leaves no hanging member behind)."""
    deadline = time.monotonic() + timeout
    while _job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _job_processes(job_id)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def _hanging_spec(tmp_path: Path) -> MemberSpec:
    work_dir = tmp_path / "member_000"
    work_dir.mkdir()
    return MemberSpec(run_id="t", generation=0, index=0, seed=0, params=[0.0] * 380, work_dir=str(work_dir),
                      inner={"options": {"hang": [0], "count_calls": True}})


def _submit_hanging_member(launcher, tmp_path: Path) -> JobRef:
    spec = _hanging_spec(tmp_path)
    (ref,) = launcher.submit("meta.synthetic:member", [spec], tmp_path / "submitit", 600.0)
    deadline = time.monotonic() + 60
    while not (Path(spec.work_dir) / "calls.log").exists():  # the member is running (and hanging)
        assert time.monotonic() < deadline, "the member did not start within 60 s"
        time.sleep(0.1)
    assert len(_job_processes(ref.job_id)) >= 2
    return ref


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_search_started_with_sigint_ignored_still_stops_its_late_member(tmp_path):
    with sigint_ignored():
        assert main([f"run_dir={tmp_path}", "new=true", "launcher=local", "inner.entrypoint=meta.synthetic:member",
                     "population=4", "generations=1", "reevaluate.top_k=0", "control_member=false", "quorum=0.75",
                     "straggler_grace=1.0", "inner.timeout_s=600", "+inner.options={hang:[2],sleep_s:0.5}"]) == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the orchestrator's own setting is left alone
    store = RunStore(tmp_path)
    assert read_result(store.member_dir(0, 2)).status == "late"
    job_id = json.loads(store.jobs_path(0).read_text())["members"]["2"]["job_id"]
    assert _wait_gone(job_id) == [], "the late member's controller or member process is still running"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_member_of_an_earlier_orchestrator_is_stopped_with_its_member_process(tmp_path):
    ref = _submit_hanging_member(build_launcher(LOCAL), tmp_path)
    build_launcher(LOCAL).cancel([ref])  # a new process's launcher: no submitit handle, only the job id
    assert _wait_gone(ref.job_id) == []
    assert not controller_running(ref.job_id)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_member_whose_controller_ignores_sigint_is_killed_with_its_member_process(tmp_path):
    """Submitted from a thread while SIGINT is ignored (the disposition cannot be changed off the main thread),
    as an orchestrator of an earlier version did from the main thread: the controller ignores SIGINT."""
    launcher = build_launcher(LOCAL)
    refs = []
    with sigint_ignored():
        worker = threading.Thread(target=lambda: refs.append(_submit_hanging_member(launcher, tmp_path)))
        worker.start()
        worker.join()
    (ref,) = refs
    ignored = int(next(line for line in Path(f"/proc/{ref.job_id}/status").read_text().splitlines()
                       if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGINT - 1)), "the test's controller was meant to ignore SIGINT"
    launcher.cancel([ref])
    assert _wait_gone(ref.job_id, timeout=10.0) == []

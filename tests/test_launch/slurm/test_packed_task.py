"""A packed task (resources.members_per_gpu, issue 38) ends each member alone, without SLURM: the task's function
runs here and starts its members as real processes (the synthetic objective). What SLURM adds (arrays, requeue,
sacct) is in tests/slurm/test_slurm_packed.py."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from launch.member import read_ledger
from launch.slurm.packed import PackedTask, run_packed, write_cancel_request
from results.store.gpu_share import read_gpu_share
from core.keys import MEMBERS_ON_GPU_ENV
from core.records import MemberSpec
from results.store.member_files import read_result

ENTRY = "meta.synthetic:member"


def _spec(root: Path, index: int, **options: Any) -> MemberSpec:
    work = root / f"member_{index:03d}"
    work.mkdir(parents=True)
    return MemberSpec(run_id="packed", generation=0, index=index, seed=index, params=[0.02] * 4, work_dir=str(work),
                      inner={"options": {"count_calls": True, **options}})


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _step(spec: MemberSpec) -> int:
    try:
        return json.loads((Path(spec.work_dir) / "synthetic_ckpt.json").read_text())["step"]
    except (FileNotFoundError, ValueError):
        return 0


def _calls(spec: MemberSpec) -> int:
    path = Path(spec.work_dir) / "calls.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_killed_member_and_a_cancelled_member_end_alone_and_their_partner_finishes(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    specs = [_spec(tmp_path, 0, steps=3, step_s=0.01, wait_for_file=str(gate)),
             _spec(tmp_path, 1, steps=10_000, step_s=0.01),
             _spec(tmp_path, 2, steps=10_000, step_s=0.01)]
    task = PackedTask(ENTRY, specs, timeout_s=300, task="77_3")

    def act() -> None:
        _wait(lambda: _step(specs[1]) > 0 and _step(specs[2]) > 0, "members 1 and 2 to train")
        ledger = read_ledger(specs[1].work_dir)
        assert ledger is not None
        import os
        os.kill(ledger.pid, signal.SIGKILL)  # the kernel's OOM killer, say
        write_cancel_request(specs[2].work_dir, "77_3")
        gate.touch()

    actor = threading.Thread(target=act, daemon=True)
    actor.start()
    records = task.run()
    actor.join(5)
    assert records[0] is not None and records[0]["status"] == "ok"
    assert records[1] is not None and records[1]["status"] == "failed"
    assert "SIGKILL" in records[1]["error"] and "77_3" in records[1]["error"]
    assert records[2] is None  # stopped on request: the orchestrator records its decision
    assert all(_calls(s) == 1 for s in specs)
    share = read_gpu_share(specs[0].work_dir)
    assert share is not None and share["task"] == "77_3" and share["shared_with"] == [1, 2]
    assert share["members_per_gpu"] == 3


def test_a_notice_stops_the_running_members_and_the_requeued_task_runs_only_those(tmp_path: Path) -> None:
    """The scheduler's USR2 (time limit coming) or SIGTERM (requeue): members still running stop; the same call run
    again (submitit's requeue) skips the finished member and resumes the other from its checkpoint."""
    specs = [_spec(tmp_path, 0, steps=2, step_s=0.01),
             _spec(tmp_path, 1, steps=60, step_s=0.02, env_log=True)]
    calls = [s.to_dict() for s in specs]
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}

    def notice() -> None:
        _wait(lambda: read_result(specs[0].work_dir) is not None and _step(specs[1]) >= 3, "member 0 done, 1 going")
        import os
        os.kill(os.getpid(), signal.SIGUSR2)

    try:
        sender = threading.Thread(target=notice, daemon=True)
        sender.start()
        with pytest.raises(SystemExit) as stopped:  # USR2 handed on: here its default, to end the process
            run_packed(ENTRY, calls, 300)
        assert stopped.value.code == 128 + signal.SIGUSR2
        stopped_at = _step(specs[1])
        assert read_result(specs[1].work_dir) is None and 3 <= stopped_at < 60
        records = run_packed(ENTRY, calls, 300)  # the requeued task
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert [_calls(s) for s in specs] == [1, 2]
    checkpoint = json.loads((Path(specs[1].work_dir) / "synthetic_ckpt.json").read_text())
    assert checkpoint["starts"] == [0, stopped_at] and records[1]["steps_done"] == 60
    # the requeued task started member 1 alone: it had the card to itself (its share is the card's, and
    # gpu_share.json names no partner, so meta.status charges it the whole GPU)
    assert read_gpu_share(specs[1].work_dir)["shared_with"] == []
    assert read_gpu_share(specs[0].work_dir)["shared_with"] == [1]  # member 0's own run was beside member 1
    assert json.loads((Path(specs[1].work_dir) / "env.json").read_text())[MEMBERS_ON_GPU_ENV] == "1"


def test_the_members_die_with_their_task(tmp_path: Path) -> None:
    """A task killed hard (its node's out-of-memory killer, SIGKILL) takes its member processes with it: none goes on
    training outside the scheduler's sight."""
    import os
    import subprocess
    import sys

    spec = _spec(tmp_path, 0, steps=10_000, step_s=0.05)
    code = ("import json, sys; from launch.slurm.packed import run_packed; "
            f"run_packed({ENTRY!r}, [json.loads(sys.argv[1])], 300)")
    task = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec.to_dict())])
    try:
        _wait(lambda: _step(spec) > 0, "the member to train")
        ledger = read_ledger(spec.work_dir)
        assert ledger is not None and ledger.pid != task.pid
        task.kill()
        task.wait(30)

        def gone() -> bool:
            try:
                os.kill(ledger.pid, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{ledger.pid}/stat").read_text().split()[2] == "Z"  # a zombie: dead, not reaped yet

        _wait(gone, "the member process to die with its task", timeout=30)
    finally:
        task.kill()

"""core/file_lock.py: one lock for run dirs, member dirs and the model cache that works with and without flock
(Lustre without flock: ENOSYS; some NFS: ENOLCK / EOPNOTSUPP) and tells a live holder on another host from a
dead one by its heartbeat."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core import file_lock
from core.file_lock import FileLock, LockHeld
from launch.member import LOCK_FILE, member_lock, run_member
from time_limits import scaled

ROOT = Path(__file__).resolve().parents[2]
OTHER_HOST = "node-elsewhere-17"

# A child process that takes a lock (optionally on a "filesystem without flock") and reports it.
HOLDER = textwrap.dedent("""
    import errno, fcntl, sys, time
    path, mode, hold_s, owner = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    if mode == "no_flock":
        def refuse(fd, op):
            raise OSError(errno.ENOSYS, "Function not implemented")
        fcntl.flock = refuse
    from core.file_lock import FileLock, LockHeld
    lock = FileLock(path, owner=owner)
    if len(sys.argv) > 5:  # racing contender: wait for the common start time, try once
        time.sleep(max(0.0, float(sys.argv[5]) - time.time()))
        try:
            lock.acquire(blocking=False)
        except LockHeld:
            print("lost", flush=True)
            sys.exit(0)
        print("won", flush=True)
    else:
        lock.acquire(blocking=False)
        print("held", flush=True)
    if hold_s < 0:
        sys.stdin.readline()  # hold until the test says so
    else:
        time.sleep(hold_s)
    lock.release()
""")


def _disable_flock(monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSYS) -> None:
    """Make every flock fail the way it does on a filesystem without flock support."""

    def refuse(fd, op):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(file_lock, "_REPORTED_NO_FLOCK", set())


@pytest.fixture(params=["flock", "no_flock"])
def mode(request, monkeypatch) -> str:
    if request.param == "no_flock":
        _disable_flock(monkeypatch)
    return request.param


def _holder(path: Path) -> dict:
    return json.loads(path.read_text())


def _write_foreign(path: Path, heartbeat_age_s: float, flock: bool = False, host: str = OTHER_HOST) -> None:
    now = time.time()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host, "pid": 4242, "since": now - 3600, "heartbeat": now - heartbeat_age_s,
                                "token": "feedbeef", "flock": flock}))


def _start_holder(path: Path, mode: str, hold_s: float = 600.0, owner: str = "orchestrator") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode, str(hold_s), owner], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line == "held", proc.stderr.read()
    return proc


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_without_flock_a_second_holder_is_refused_and_release_removes_the_file(tmp_path, monkeypatch, caplog, code):
    _disable_flock(monkeypatch, code)
    path = tmp_path / "LOCK"
    first = FileLock(path, owner="orchestrator")
    first.acquire(blocking=False)
    info = _holder(path)
    assert info["host"] == socket.gethostname() and info["pid"] == os.getpid() and info["flock"] is False
    assert info["heartbeat"] >= info["since"] > time.time() - 60 and info["token"]

    second = FileLock(path, owner="orchestrator")
    with pytest.raises(LockHeld) as refused:
        second.acquire(blocking=False)
    assert f"pid {os.getpid()} on {socket.gethostname()}" in refused.value.reason
    assert "last heartbeat" in refused.value.reason
    fallback_logs = [r for r in caplog.records if "flock is not available" in r.getMessage()]
    assert len(fallback_logs) == 1 and errno.errorcode[code] in fallback_logs[0].getMessage()

    first.release()
    assert not path.exists()
    second.acquire(blocking=False)
    assert _holder(path)["token"] != info["token"]
    second.release()
    assert not path.exists()


def test_with_flock_the_holder_info_is_written_and_the_file_flocked(tmp_path):
    path = tmp_path / "LOCK"
    with FileLock(path):
        assert _holder(path)["flock"] is True and _holder(path)["pid"] == os.getpid()
        with open(path) as probe, pytest.raises(BlockingIOError):
            fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert not path.exists()


def test_the_heartbeat_is_refreshed_while_held(tmp_path, mode):
    path = tmp_path / "LOCK"
    with FileLock(path, heartbeat_s=0.1, stale_after_s=1.0):
        first = _holder(path)["heartbeat"]
        deadline = time.monotonic() + scaled(5)
        while _holder(path)["heartbeat"] <= first + 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _holder(path)["heartbeat"] > first + 0.2


def test_a_killed_holder_process_blocks_while_alive_and_is_taken_over_once_dead(tmp_path, monkeypatch, caplog, mode):
    path = tmp_path / "run" / "LOCK"
    holder = _start_holder(path, mode)
    try:
        with pytest.raises(LockHeld) as refused:
            FileLock(path, owner="orchestrator").acquire(blocking=False)
        assert f"pid {holder.pid} on {socket.gethostname()}" in refused.value.reason
        start = time.monotonic()
        with pytest.raises(LockHeld, match="gave up after 0.5 s"):
            FileLock(path).acquire(blocking=True, timeout_s=0.5)
        assert time.monotonic() - start >= 0.5

        holder.kill()  # SIGKILL, and not reaped yet: a zombie counts as dead too
        lock = FileLock(path, owner="orchestrator")
        lock.acquire(blocking=True, timeout_s=scaled(10))
    finally:
        holder.kill()
        holder.wait()
    assert _holder(path)["pid"] == os.getpid()
    assert f"stale lock from a dead orchestrator (pid {holder.pid}" in caplog.text
    lock.release()


def test_a_holder_on_another_host_with_a_fresh_heartbeat_is_respected(tmp_path, mode):
    path = tmp_path / "LOCK"
    for holder_flock in (False, True):
        _write_foreign(path, heartbeat_age_s=5, flock=holder_flock)
        before = path.read_bytes()
        with pytest.raises(LockHeld) as refused:
            FileLock(path, owner="orchestrator").acquire(blocking=False)
        reason = refused.value.reason
        assert f"pid 4242 on {OTHER_HOST}" in reason and "last heartbeat 5 s ago" in reason and "frees in" in reason
        assert path.read_bytes() == before


def test_a_holder_on_another_host_with_a_stale_heartbeat_is_taken_over_with_a_warning(tmp_path, caplog, mode):
    path = tmp_path / "LOCK"
    _write_foreign(path, heartbeat_age_s=50, flock=True)
    with pytest.raises(LockHeld):  # 50 s is fresh under the default (4 x 30 s + 60 s)
        FileLock(path).acquire(blocking=False)
    lock = FileLock(path, owner="orchestrator", heartbeat_s=5, stale_after_s=30)
    lock.acquire(blocking=False)
    assert _holder(path)["host"] == socket.gethostname()
    warnings = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert len(warnings) == 1 and OTHER_HOST in warnings[0] and "no heartbeat from that host for 50 s" in warnings[0]
    lock.release()
    assert not path.exists()


def test_an_unreadable_lock_file_counts_as_held_until_it_is_old(tmp_path, caplog, mode):
    path = tmp_path / "LOCK"
    path.write_text('{"host": "no')  # e.g. a holder info write torn by a crash
    with pytest.raises(LockHeld, match="unreadable"):
        FileLock(path).acquire(blocking=False)
    old = time.time() - 1000
    os.utime(path, (old, old))
    with FileLock(path):
        assert _holder(path)["pid"] == os.getpid()
    assert "found a stale lock in an unreadable lock file" in caplog.text


def test_an_empty_lock_file_left_by_earlier_versions_is_taken_over_at_once_where_flock_tells(tmp_path, caplog, mode):
    """Run directories and model caches of earlier versions hold an empty LOCK (released by truncation): with
    flock it is provably unheld and must not cost a resume the 180 s stale wait; without flock nothing can tell."""
    path = tmp_path / "LOCK"
    path.write_text("")
    old = time.time() - 60  # older than a creator's create-then-write window, younger than stale_after_s
    os.utime(path, (old, old))
    if mode == "no_flock":
        with pytest.raises(LockHeld, match="unreadable"):
            FileLock(path).acquire(blocking=False)
        return
    with FileLock(path):
        assert _holder(path)["pid"] == os.getpid()
    assert "empty lock file" in caplog.text


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path, caplog, mode):
    path = tmp_path / "LOCK"
    lock = FileLock(path)
    lock.acquire()
    path.unlink()  # taken over meanwhile (as if we had been stalled past stale_after_s)
    _write_foreign(path, heartbeat_age_s=0)
    foreign = path.read_bytes()
    lock.release()
    assert path.read_bytes() == foreign and "no longer ours" in caplog.text


def test_threads_racing_for_a_stale_lock_exactly_one_wins(tmp_path, caplog, mode):
    path = tmp_path / "LOCK"
    for _ in range(15):
        caplog.clear()
        _write_foreign(path, heartbeat_age_s=10_000)
        barrier = threading.Barrier(6)
        won: list[FileLock] = []
        lost: list[LockHeld] = []

        def contend() -> None:
            lock = FileLock(path, owner="orchestrator")
            barrier.wait()
            try:
                lock.acquire(blocking=False)
                won.append(lock)
            except LockHeld as exc:
                lost.append(exc)

        threads = [threading.Thread(target=contend) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(won) == 1 and len(lost) == 5, (won, [e.reason for e in lost])
        assert _holder(path)["token"] == won[0]._token
        assert sum("taking over" in r.getMessage() for r in caplog.records) == 1
        won[0].release()
        assert not path.exists() and list(tmp_path.iterdir()) == []  # no break markers left behind


def test_a_takeover_in_progress_is_waited_for_and_a_dead_takers_marker_expires(tmp_path, caplog):
    import hashlib

    path = tmp_path / "LOCK"
    _write_foreign(path, heartbeat_age_s=10_000)
    marker = tmp_path / f".LOCK.break-{hashlib.sha256(b'token:feedbeef').hexdigest()[:16]}"
    marker.write_text("")  # another contender is taking the stale lock over right now
    with pytest.raises(LockHeld, match="another process is taking over"):
        FileLock(path).acquire(blocking=True, timeout_s=0.3)
    assert json.loads(path.read_text())["token"] == "feedbeef"
    old = time.time() - 1000
    os.utime(marker, (old, old))  # ... but it died while doing so
    with FileLock(path):
        assert _holder(path)["pid"] == os.getpid()
    assert "died while taking over" in caplog.text and list(tmp_path.iterdir()) == []


def test_processes_racing_for_a_stale_lock_exactly_one_wins(tmp_path, mode):
    path = tmp_path / "LOCK"
    for _ in range(3):
        _write_foreign(path, heartbeat_age_s=10_000)
        start_at = time.time() + 1.0  # after every interpreter has started
        procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode, "-1", "orchestrator", str(start_at)],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(4)]
        outcomes = [proc.stdout.readline().strip() for proc in procs]  # the winner holds until all have tried
        for proc in procs:
            _, err = proc.communicate("\n", timeout=scaled(60))
            assert proc.returncode == 0, err
        assert sorted(outcomes) == ["lost", "lost", "lost", "won"], outcomes
        assert not path.exists()


def test_member_lock_without_flock_waits_for_a_live_holder(tmp_path, monkeypatch):
    _disable_flock(monkeypatch)
    work_dir = tmp_path / "member_000"
    holder = _start_holder(work_dir / LOCK_FILE, "no_flock", hold_s=1.0, owner="member job")
    try:
        start = time.monotonic()
        with member_lock(work_dir):
            waited = time.monotonic() - start
            assert _holder(work_dir / LOCK_FILE)["pid"] == os.getpid()
    finally:
        holder.wait(30)
    assert 0.5 <= waited < 10, waited
    assert holder.returncode == 0 and not (work_dir / LOCK_FILE).exists()


def test_run_member_without_flock_runs_and_a_second_call_reads_the_result(tmp_path, monkeypatch):
    _disable_flock(monkeypatch)
    spec = {"run_id": "t", "generation": 0, "index": 0, "seed": 0, "params": [0.02] * 380,
            "work_dir": str(tmp_path / "member_000"), "inner": {"options": {"count_calls": True}}, "attempt": 0}
    first = run_member("meta.synthetic:member", spec, timeout_s=10)
    assert first["status"] == "ok"
    assert run_member("meta.synthetic:member", spec, timeout_s=10) == first
    assert (tmp_path / "member_000" / "calls.log").read_text().count("\n") == 1


def test_model_cache_builders_without_flock_build_once(tmp_path, monkeypatch):
    from inner_loop.models.cache import build_once

    _disable_flock(monkeypatch)
    final = tmp_path / "models" / "thing"
    builds = []

    def build(tmp: Path) -> None:
        builds.append(threading.get_ident())
        time.sleep(0.3)
        (tmp / "weights").write_text("ok")

    threads = [threading.Thread(target=build_once, args=(final, build)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(builds) == 1 and (final / "weights").read_text() == "ok"
    assert [p.name for p in final.parent.iterdir()] == ["thing"]

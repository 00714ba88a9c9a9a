"""The run lock (meta/search/lock.py) on filesystems without flock and with an orchestrator on another host."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time

import pytest

from core import file_lock
from meta.search.lock import RunLock, RunLockedError
from meta.search.run import main
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "generations=2"]


@pytest.fixture
def no_flock(monkeypatch):
    """Every flock fails with ENOSYS, as on Lustre mounted without flock."""

    def refuse(fd, op):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(file_lock, "_REPORTED_NO_FLOCK", set())


def _foreign_orchestrator(lock_path, heartbeat_age_s: float) -> None:
    now = time.time()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path.write_text(json.dumps({"host": "login-node-3", "pid": 777, "since": now - 7200,
                                     "heartbeat": now - heartbeat_age_s, "token": "abc123", "flock": True}))


def test_a_search_completes_on_a_filesystem_without_flock(tmp_path, no_flock, caplog):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH]) == 0
    store = RunStore(run_dir)
    assert store.state_generations() == [0, 1]
    members = store.read_members()
    assert (members["role"] == "member").sum() == 8 and set(members["status"]) == {"ok"}
    assert not store.lock_path.exists()  # released
    assert "flock is not available" in caplog.text


def test_a_second_orchestrator_is_refused_without_flock_and_told_who_holds_the_run(tmp_path, no_flock, caplog):
    run_dir = tmp_path / "run"
    with RunLock(RunStore(run_dir).lock_path):
        assert main([f"run_dir={run_dir}", "new=true", *SYNTH]) == 3
    assert "in use by another orchestrator" in caplog.text
    assert f"pid {os.getpid()} on {socket.gethostname()}" in caplog.text and "last heartbeat" in caplog.text
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH]) == 0


@pytest.mark.parametrize("flock_available", [True, False])
def test_an_orchestrator_on_another_host_with_a_fresh_heartbeat_keeps_the_run(tmp_path, monkeypatch, flock_available):
    if not flock_available:
        monkeypatch.setattr(fcntl, "flock", lambda fd, op: (_ for _ in ()).throw(OSError(errno.ENOLCK, "No locks")))
    lock_path = RunStore(tmp_path).lock_path
    _foreign_orchestrator(lock_path, heartbeat_age_s=10)
    with pytest.raises(RunLockedError) as refused:
        RunLock(lock_path).acquire()
    message = str(refused.value)
    assert "in use by another orchestrator" in message and "pid 777 on login-node-3" in message
    assert "last heartbeat 10 s ago" in message
    assert json.loads(lock_path.read_text())["host"] == "login-node-3"


def test_an_orchestrator_on_another_host_whose_heartbeat_stopped_is_taken_over(tmp_path, caplog):
    lock_path = RunStore(tmp_path).lock_path
    _foreign_orchestrator(lock_path, heartbeat_age_s=3600)
    with RunLock(lock_path):
        assert json.loads(lock_path.read_text())["host"] == socket.gethostname()
    assert "stale lock from a dead orchestrator (pid 777 on login-node-3" in caplog.text
    assert "no heartbeat from that host for 3600 s" in caplog.text

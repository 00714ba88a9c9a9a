"""The function every job runs: train a member spec with the program ``inner.entrypoint`` names; persist the outcome.

It makes members safe to submit more than once: a member whose result.json holds a final status is returned
without running again, and an exclusive lock on the member directory makes a duplicate job (an orphan of a
killed orchestrator plus its resubmission) wait and then read the first one's result instead of training
twice. Every Python-level outcome (exception, NaN fitness, wall-limit exceeded) becomes a result record, so
a job that leaves no result.json died from outside (killed, out of memory, node lost). Each member's result.json
is written once: by the program where it records its own outcome (the inner loop's does), else here. A job's
pickle holds the entry point's string, never a program: what it names is loaded in the job's own process.

``inner.timeout_s`` is a budget of RUNNING time for one attempt, summed over all runs of that attempt (a
SLURM job requeued on its time limit or by preemption runs again under the same id); time spent queued never
counts. Each run keeps a small ledger (started.json: time used by earlier runs, this run's start, refreshed
every ``LEDGER_INTERVAL_S`` and on exit, without fsync), arms its alarm with what is left of the budget, and
the orchestrator reads the same ledger for its hard limit. A run killed hard loses at most one interval.

This module must stay light: it runs in every member process and must not import torch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator, Mapping

from core.file_lock import FileLock
from core.member_program import MemberProgram, as_program
from results.store.layout import MEMBER_LOCK_FILE as LOCK_FILE  # re-exported under its old name
from results.store.layout import STARTED_FILE, SPEC_FILE
from results.store.atomic import atomic_write_json
from launch.seed_group import run_seed_group
from core.records import MEMBER_SEEDS_KEY, MemberSpec, ResultRecord
from results.store.member_files import read_result, write_final_result

logger = logging.getLogger(__name__)

#: seconds between ledger refreshes while a member runs (a run killed hard loses at most this much)
LEDGER_INTERVAL_S = 20.0
#: a running ledger is trusted to go on counting this long past one refresh interval since its last write;
#: beyond that its run died or froze without writing, and the gap may be time spent queued
LEDGER_SLACK_S = 10.0
ERROR_TAIL_CHARS = 4000


class MemberTimeout(BaseException):
    """Raised inside a member that ran past inner.timeout_s.

    A BaseException, like KeyboardInterrupt: programs record their own failures with ``except Exception`` (the
    inner loop's does), and the alarm must pass through them to become a `timeout`, not a `failed` member."""


def resolve_target(target: str, key: str) -> Any:
    """The object ``"package.module:attr"`` names (the one resolver of configured code: an entry point, a launcher
    class); ValueError naming ``key`` and the problem otherwise."""
    module_name, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key} {target!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key} {target!r}: cannot import module {module_name!r} ({exc})") from exc
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ValueError(f"{key} {target!r}: {module_name!r} has no attribute {attr!r}")
    return found


def load_program(entrypoint: str) -> MemberProgram:
    """The member program ``"package.module:attr"`` names (a MemberProgram, an old name of one, or a plain
    ``fn(spec)``: core/member_program.py); ValueError naming the problem otherwise."""
    return as_program(resolve_target(entrypoint, "inner.entrypoint"), entrypoint)


@contextlib.contextmanager
def member_lock(work_dir: Path) -> Iterator[None]:
    """Exclusive lock on the member directory, waiting while a live job holds it (FileLock: the flock where the
    filesystem has one, else the lock file's pid and heartbeat; a holder on another node counts as alive while
    its heartbeat is fresh, so a duplicate job on another node waits instead of training the member twice)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(work_dir / LOCK_FILE, owner="member job"):
        yield


@contextlib.contextmanager
def wall_limit(seconds: float, reason: str | None = None) -> Iterator[None]:
    """Raise MemberTimeout in the main thread after ``seconds`` (no-op off the main thread or if <= 0)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    message = reason or f"member exceeded inner.timeout_s={seconds:g}"

    def _on_alarm(signum: int, frame: Any) -> None:
        raise MemberTimeout(message)

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclasses.dataclass
class RunLedger:
    """Running time of one attempt so far, summed over its runs; what started.json holds.

    Wall-clock times (``started_at``, ``updated_at``) are for the orchestrator, which may sit on another host;
    durations are measured with the monotonic clock inside each run."""

    attempt: int
    started_at: float  # wall clock when the current (or, if not running, the last) run started
    used_before_s: float  # running time of earlier runs of this attempt
    used_s: float  # running time of this attempt as of updated_at (earlier runs included)
    updated_at: float
    running: bool  # False once the run ended on its own (finished, requeued itself, raised)
    interval_s: float = LEDGER_INTERVAL_S  # how often a running run refreshes it
    pid: int = 0
    host: str = ""

    def used_at(self, now: float) -> float:
        """Running time as of ``now`` (a wall-clock time): what was recorded, plus, while the run is running,
        the time since its last refresh, but never more than one interval and ``LEDGER_SLACK_S``: a run
        that stopped refreshing died without a last write (killed hard, node lost; the job may be queued
        again by now) or froze with the GIL held. Counting from the last refresh rather than from the
        run's start also keeps clock skew between the member's host and the reader's out of the sum."""
        if not self.running:
            return self.used_s
        return self.used_s + min(max(0.0, now - self.updated_at), self.interval_s + LEDGER_SLACK_S)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunLedger":
        """Checked field by field: a ledger that does not parse is treated as absent, never half-trusted."""
        if not isinstance(data, Mapping):
            raise ValueError("ledger is not a JSON object")
        data = {"interval_s": LEDGER_INTERVAL_S, **data}
        numbers = ("started_at", "used_before_s", "used_s", "updated_at", "interval_s")
        for key in ("attempt", *numbers):
            value = data.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"ledger field {key!r} is {value!r}, expected a number")
        if not isinstance(data.get("running"), bool):
            raise ValueError(f"ledger field 'running' is {data.get('running')!r}, expected true/false")
        return cls(
            attempt=int(data["attempt"]), running=bool(data["running"]),
            pid=int(data.get("pid", 0) or 0), host=str(data.get("host", "")),
            **{key: float(data[key]) for key in numbers},
        )


def read_ledger(work_dir: str | Path) -> RunLedger | None:
    """The member's running-time ledger, or None when absent or unreadable (no run has started yet)."""
    path = Path(work_dir) / STARTED_FILE
    try:
        return RunLedger.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        # debug, not warning: the orchestrator reads every member's ledger every few seconds
        logger.debug("ignoring unreadable running-time ledger %s: %s", path, exc)
        return None


def _write_ledger(work_dir: Path, ledger: RunLedger) -> None:
    """Atomic (replace) but not fsynced: it is rewritten every interval by every running member, and losing
    the last write in a crash only costs that interval's accounting."""
    tmp = work_dir / f".{STARTED_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(ledger.to_dict()))
    os.replace(tmp, work_dir / STARTED_FILE)


@contextlib.contextmanager
def running_time_ledger(work_dir: Path, attempt: int, interval_s: float = LEDGER_INTERVAL_S) -> Iterator[float]:
    """Keep started.json up to date while the body runs; yields the running time earlier runs of this attempt
    already used (0 on a fresh attempt), so the caller can arm its alarm with what is left.

    The final write sits in ``finally``: submitit's requeue handler ends the run with SystemExit, so a run
    that requeues itself records its time exactly; only a hard kill loses up to ``interval_s``."""
    previous = read_ledger(work_dir)
    used_before = previous.used_s if previous is not None and previous.attempt == attempt else 0.0
    started_at, started = time.time(), time.monotonic()

    def record(running: bool) -> None:
        now = time.time()
        _write_ledger(work_dir, RunLedger(
            attempt=attempt, started_at=started_at, used_before_s=used_before,
            used_s=used_before + (time.monotonic() - started), updated_at=now, running=running,
            interval_s=interval_s, pid=os.getpid(), host=socket.gethostname(),
        ))

    record(True)
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(interval_s):
            try:
                record(True)
            except OSError as exc:  # a full or flaky disk must not kill the member; the next refresh retries
                logger.warning("could not refresh the running-time ledger in %s: %s", work_dir, exc)

    keeper = threading.Thread(target=refresh, name="member-running-time", daemon=True)
    keeper.start()
    try:
        yield used_before
    finally:
        stop.set()
        keeper.join(timeout=max(1.0, interval_s))
        try:
            record(False)
        except OSError as exc:  # the member's result matters more than the last interval of accounting
            logger.warning("could not close the running-time ledger in %s: %s", work_dir, exc)


def run_member(
    entrypoint: str,
    spec: Mapping[str, Any],
    timeout_s: float,
    out_of_time: tuple[type[BaseException], ...] = (),
    ledger_interval_s: float = LEDGER_INTERVAL_S,
) -> dict[str, Any]:
    """Run one member to a final ResultRecord (as a dict) in ``<work_dir>/result.json``: the record the program
    wrote there itself (the inner loop's does), else the outcome seen here, written once (``write_final_result``).

    ``timeout_s``: the attempt's running-time budget over all its runs (<= 0: none); a requeued run gets
    what is left of it. ``out_of_time``: extra exception types that mean "ran out of wall time" (status
    ``timeout``), e.g. the one submitit raises in a SLURM job that used up its requeues."""
    member = MemberSpec.from_dict(spec)
    work_dir = Path(member.work_dir)
    with member_lock(work_dir):
        finished = read_result(work_dir)
        if finished is not None:
            return finished.to_dict()
        # What this member was asked to run, next to what it produced (status tools, audits, re-runs by hand).
        atomic_write_json(work_dir / SPEC_FILE, member.to_dict())
        start = time.monotonic()
        with running_time_ledger(work_dir, member.attempt, ledger_interval_s) as used_before:
            record = _call(entrypoint, member, timeout_s, used_before, out_of_time)
        if record.wall_time_s <= 0:
            record.wall_time_s = time.monotonic() - start
        final = write_final_result(work_dir, record)
    if final.status != record.status:
        logger.warning("member %s: its program recorded %s before the run ended as %s (%s); the recorded "
                       "result stands", work_dir, final.status, record.status, _error_summary(record.error))
    return final.to_dict()


def requeue_cut_short(exc: BaseException) -> bool:
    """Whether ``exc`` is submitit's ``scontrol requeue`` killed by a signal: the requeue it asked for stops every
    process of the job, scontrol among them when it has not exited yet. The job is requeued all the same, so this
    run must end as after a requeue (no record), not as a failure that the requeued run would find final."""
    return (isinstance(exc, subprocess.CalledProcessError) and exc.returncode < 0
            and list(exc.cmd[:2]) == ["scontrol", "requeue"])


def _error_summary(text: str) -> str:
    """The last line of an error: a traceback tail's exception, or a one-line message whole."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _call(
    entrypoint: str, member: MemberSpec, timeout_s: float, used_before: float = 0.0,
    out_of_time: tuple[type[BaseException], ...] = (),
) -> ResultRecord:
    budget = f"inner.timeout_s={timeout_s:g} s of running time"
    if used_before > 0:
        budget += f", {used_before:.0f} s of it used by earlier runs of this attempt (requeues)"
    remaining = timeout_s - used_before
    if timeout_s > 0 and remaining <= 0:
        return ResultRecord(status="timeout", error=f"member used up its {budget} before this run")
    try:
        with wall_limit(remaining if timeout_s > 0 else 0, reason=f"member exceeded its {budget}"):
            program = load_program(entrypoint)
            if member.inner.get(MEMBER_SEEDS_KEY):
                return run_seed_group(program.train, member)
            return ResultRecord.coerce(program.train(member))
    except (MemberTimeout, *out_of_time) as exc:
        return ResultRecord(status="timeout", error=str(exc))
    except Exception as exc:  # any member failure becomes a record; the orchestrator decides about retries
        if requeue_cut_short(exc):
            logger.warning("member %s: the job was requeued (%s); this run ends without a record", member.work_dir,
                           exc)
            raise SystemExit(-1) from None  # what submitit's handler does once its requeue returned
        tail = traceback.format_exc()[-ERROR_TAIL_CHARS:]
        return ResultRecord(status="failed", error=tail)

"""Run model-written programs and their tests safely, for MBPP/HumanEval rewards and pass@1.

Why: code rewards execute untrusted programs thousands of times per training run on shared nodes.
Each program runs in its own process with wall/CPU, memory, file-size and process-count limits, an
empty environment and a fresh work dir; with bubblewrap also its own user/network/pid namespaces and a
read-only file system. The tests themselves never run there: the trusted grader (inner_loop.sandbox.grading)
evaluates them in this process and sends only the calls into the program through the worker, getting
plain data back, so the pass/fail decision is out of the program's reach. Nothing here raises into the
trainer for what a program does.

Public API: ``run_program``, ``run_many``, ``Job``, ``Outcome``, ``SandboxConfig``, ``SandboxPool``,
``SandboxUnavailableError``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from inner_loop.sandbox.cpu_allocation import usable_cpus
from inner_loop.sandbox.grading import Grader, Job, Session, parse_answer, status_of
from inner_loop.sandbox.isolation import (
    NOT_ISOLATED_WITHOUT_BWRAP,
    SANDBOX_ROOT,
    bwrap_command,
    drops_privileges,
    nproc_base,
    pick_interpreter,
    probe_isolation,
    run_as_kwargs,
)

logger = logging.getLogger(__name__)

STATUSES = ("passed", "failed", "timeout", "crashed", "out_of_memory")
# the zygote runs the codec's text first: both sides encode and decode plain data by the same rules
_ZYGOTE_SOURCE = (Path(__file__).with_name("codec.py").read_text() + "\n"
                  + Path(__file__).with_name("zygote.py").read_text())
_ANSWER_GRACE_S = 30.0  # zygote enforces the limit itself; this only catches a wedged zygote
_warned_fallback = False
_warn_lock = threading.Lock()


class SandboxUnavailableError(RuntimeError):
    """require_isolation is set but this machine cannot give full isolation."""


@dataclass(frozen=True)
class Outcome:
    """What happened to one program: test snippets passed out of total, status, last stderr."""

    passed: int
    total: int
    status: str
    stderr_tail: str

    @property
    def fraction_passed(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def solved(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation policy. require_isolation=True refuses to run without bubblewrap."""

    require_isolation: bool = False
    memory_mb: int = 1024
    max_processes: int = 32
    max_file_mb: int = 64
    tmp_mb: int = 64
    scratch_mb: int = 256
    workers: int = 0  # 0: two per CPU core (at least 4): part of each run waits on namespace set-up
    python: str = ""  # interpreter inside the sandbox; "": this one
    sandbox_uid: int = 65534  # used only when started as root

    def __post_init__(self) -> None:
        for key in ("memory_mb", "max_processes", "max_file_mb", "tmp_mb", "scratch_mb"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"sandbox.{key} must be a positive integer, got {value!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"sandbox.workers must be >= 0 (0 = automatic), got {self.workers!r}")
        if not isinstance(self.require_isolation, bool):
            raise ValueError("sandbox.require_isolation must be true or false, "
                             f"got {self.require_isolation!r}")
        if self.python and not os.path.isabs(self.python):
            raise ValueError(f"sandbox.python must be an absolute path, got {self.python!r}")

    def interpreter(self) -> str:
        return pick_interpreter(self.python or sys.executable, self.run_uid())

    def run_uid(self) -> int:
        return self.sandbox_uid if drops_privileges() else os.geteuid()

    def worker_count(self) -> int:
        """Two workers per CPU this process may run on: the SLURM allocation or cgroup, not the whole node (a
        1-CPU member on a 128-core node would otherwise run 256 programs on one core, and its wall-clock
        limits would turn load into failed tests and a lower fitness)."""
        return self.workers or max(4, 2 * usable_cpus())


def _validate_item(program: object, tests: object, timeout_s: object) -> None:
    if not isinstance(program, str):
        raise ValueError(f"program must be a str, got {type(program).__name__}")
    if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError("tests must be a non-empty list of str (one test snippet each)")
    if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 3600:
        raise ValueError(f"timeout_s must be in (0, 3600] seconds, got {timeout_s!r}")


def as_job(item: Job | tuple[str, list[str]]) -> Job:
    """A Job from a Job or a (program, tests) pair, checked before anything runs."""
    if isinstance(item, Job):
        _validate_item(item.program, item.tests, 1.0)
        if not isinstance(item.setup, str) or not all(isinstance(n, str) for n in item.entry_points):
            raise ValueError("Job.setup must be a str and Job.entry_points a tuple of names")
        return item
    if not isinstance(item, tuple) or len(item) != 2:
        raise ValueError("each item must be a Job or a (program, tests) pair")
    program, tests = item
    _validate_item(program, tests, 1.0)
    return Job(program, tuple(tests))


def _warn_fallback_once(reason: str) -> None:
    global _warned_fallback
    with _warn_lock:
        if _warned_fallback:
            return
        _warned_fallback = True
    logger.warning("sandbox running WITHOUT full isolation (%s); not isolated: %s. "
                   "Set require_isolation=true to refuse instead.", reason,
                   "; ".join(NOT_ISOLATED_WITHOUT_BWRAP))


class _Launcher:
    """Starts every worker process from one thread that lives as long as this process.

    Why: bwrap's --die-with-parent is PR_SET_PDEATHSIG, which the kernel fires when the *thread* that
    forked bwrap exits, not the process. Workers started from run_many's short-lived pool threads were
    SIGKILLed as soon as that batch's threads ended, so the next batch wrote to a dying worker and got
    no answer ("crashed"). A thread that never exits keeps the guard for a dead trainer only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._owner_pid = -1
        self._requests: queue.Queue = queue.Queue()

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        done: Future = Future()
        with self._lock:
            # a forked copy of the trainer has no launcher thread: give it its own
            if self._thread is None or not self._thread.is_alive() or self._owner_pid != os.getpid():
                self._requests = queue.Queue()
                self._thread = threading.Thread(target=self._serve, args=(self._requests,),
                                                name="sandbox-launcher", daemon=True)
                self._thread.start()
                self._owner_pid = os.getpid()
            self._requests.put((args, kwargs, done))
        return done.result()

    @staticmethod
    def _serve(requests: queue.Queue) -> None:
        while True:
            args, kwargs, done = requests.get()
            try:
                done.set_result(subprocess.Popen(args, **kwargs))
            except BaseException as exc:  # handed to the caller, who turns it into a crashed outcome
                done.set_exception(exc)


_launcher = _Launcher()


class _Worker:
    """One warm zygote process; runs one program at a time. Restarted if it ever dies."""

    def __init__(self, config: SandboxConfig, isolated: bool) -> None:
        self._config = config
        self._isolated = isolated
        self._proc: subprocess.Popen | None = None
        self._host_root: str | None = None
        self._buffer = b""

    def _start(self) -> None:
        cfg = self._config
        if self._isolated:
            work_root = SANDBOX_ROOT + "/runs"
            prefix = bwrap_command(cfg.interpreter(), cfg.tmp_mb, cfg.scratch_mb)
            cwd = None
        else:
            self._host_root = tempfile.mkdtemp(prefix="mirror_es_sandbox_")
            if drops_privileges():
                os.chown(self._host_root, cfg.sandbox_uid, cfg.sandbox_uid)
            work_root = os.path.join(self._host_root, "runs")
            prefix = [cfg.interpreter()]
            cwd = self._host_root
        zygote_cfg = {"isolated": self._isolated, "work_root": work_root, "memory_mb": cfg.memory_mb,
                      "max_processes": cfg.max_processes, "max_file_mb": cfg.max_file_mb}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        if not self._isolated:
            env["HOME"] = self._host_root or "/"
        self._proc = _launcher.popen(
            prefix + ["-I", "-c", _ZYGOTE_SOURCE, json.dumps(zygote_cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True, **run_as_kwargs(cfg.sandbox_uid))
        self._buffer = b""

    def _read_line(self, limit_s: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], limit_s)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _send(self, message: dict) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(message).encode() + b"\n")
        self._proc.stdin.flush()

    def _answer(self, limit_s: float) -> tuple[str, bytes]:
        """The zygote's next line: ("R", answer) or ("E", end record)."""
        line = self._read_line(limit_s)
        if line is None or line[:2] not in (b"R ", b"E "):
            raise RuntimeError("sandbox worker gave no answer")
        return line[:1].decode(), line[2:]

    def run(self, job: Job, timeout_s: float) -> Outcome:
        limit_s = timeout_s + _ANSWER_GRACE_S
        total = len(job.tests)
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            session = Session(ask=lambda message: self._ask(message, session, limit_s))
            grader = Grader(job, session)
            ahead = grader.ahead()
            self._send({"program": job.program, "timeout_s": float(timeout_s), "calls": ahead,
                        "nproc_base": nproc_base(self._isolated, self._config.run_uid())})
            kind, body = self._answer(limit_s)
            program = ""
            if kind == "E":
                session.end, session.gone = parse_answer(body) or {}, True
            else:
                report = parse_answer(body) or {}
                program = report.get("program", "") if isinstance(report.get("program"), str) else ""
            for message in ahead if program == "ok" else []:
                kind, body = self._answer(limit_s)
                if kind == "E":
                    session.end, session.gone = parse_answer(body) or {}, True
                    break
                session.keep_answer(message, parse_answer(body) or {"malformed": True})
            results = grader.run() if program == "ok" else [False] * total
            notes = grader.notes
            if session.end is None:
                self._send({"finish": True})
                while session.end is None:  # skip nothing: after "finish" only the end record comes
                    kind, body = self._answer(limit_s)
                    if kind == "E":
                        session.end = parse_answer(body) or {}
            end = session.end
            tail = "\n".join([str(end.get("stderr_tail", ""))] + notes).strip()
            status = status_of(program, results, session)
            if status == "crashed":
                tail = (tail + f"\n[sandbox] process ended with code {end.get('fate')} "
                        "before the grader finished").strip()
            return Outcome(sum(results), total, status, tail[-2000:])
        except Exception as exc:  # never raise into the trainer: a broken worker is restarted next time
            logger.warning("sandbox worker failed (%s); restarting it", exc)
            self.close()
            return Outcome(0, total, "crashed", f"[sandbox] worker failed: {exc}")
        except BaseException:  # e.g. KeyboardInterrupt mid-run: the zygote is mid-protocol, so drop it
            self.close()
            raise

    def _ask(self, message: dict, session: Session, limit_s: float) -> dict | None:
        """One call into the program; None (and the end record kept) once its run is over."""
        self._send(message)
        kind, body = self._answer(limit_s)
        if kind == "E":
            session.end = parse_answer(body) or {}
            return None
        return parse_answer(body) or {"malformed": True}

    def close(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            self._proc = None
        if self._host_root is not None:
            shutil.rmtree(self._host_root, ignore_errors=True)
            self._host_root = None


class SandboxPool:
    """A bounded set of warm workers; run_many spreads programs over them concurrently."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        iso = probe_isolation(self.config.interpreter(), self.config.run_uid())
        if not iso.available:
            if self.config.require_isolation:
                raise SandboxUnavailableError(
                    f"require_isolation=true but {iso.reason}; install bubblewrap and allow user "
                    f"namespaces, or set require_isolation=false to run with limits only")
            _warn_fallback_once(iso.reason)
        self.isolated = iso.available
        self._idle: queue.Queue[_Worker] = queue.Queue()
        for _ in range(self.config.worker_count()):
            self._idle.put(_Worker(self.config, self.isolated))
        self._all = list(self._idle.queue)

    def run(self, program: str | Job, tests: list[str] | None = None, timeout_s: float = 5.0) -> Outcome:
        """Grade one program: a Job, or a program and its test snippets."""
        job = as_job(program if isinstance(program, Job) else (program, tests))
        _validate_item(job.program, job.tests, timeout_s)
        return self._run_job(job, timeout_s)

    def _run_job(self, job: Job, timeout_s: float) -> Outcome:
        worker = self._idle.get()
        try:
            return worker.run(job, timeout_s)
        finally:
            self._idle.put(worker)

    def run_many(self, items: list[Job | tuple[str, list[str]]], timeout_s: float = 5.0) -> list[Outcome]:
        jobs = [as_job(item) for item in items]
        _validate_item("", ["x"], timeout_s)
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(len(self._all), len(jobs))) as pool:
            return list(pool.map(lambda job: self._run_job(job, timeout_s), jobs))

    def close(self) -> None:
        for worker in self._all:
            worker.close()


_pools: dict[SandboxConfig, SandboxPool] = {}
_pools_lock = threading.Lock()


def get_pool(config: SandboxConfig | None = None) -> SandboxPool:
    """The shared pool for this config (started on first use, closed at interpreter exit)."""
    config = config or SandboxConfig()
    with _pools_lock:
        if config not in _pools:
            _pools[config] = SandboxPool(config)
        return _pools[config]


def close_pools() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


atexit.register(close_pools)


def run_program(program: str | Job, tests: list[str] | None = None, timeout_s: float = 5.0,
                config: SandboxConfig | None = None) -> Outcome:
    """Run `program` in the sandbox and grade each test snippet in the trusted grader; a snippet that
    completes there counts as passed."""
    return get_pool(config).run(program, tests, timeout_s)


def run_many(items: list[Job | tuple[str, list[str]]], timeout_s: float = 5.0,
             config: SandboxConfig | None = None) -> list[Outcome]:
    """run_program for many (program, tests) pairs at once on a bounded worker pool; order kept."""
    return get_pool(config).run_many(items, timeout_s)


__all__ = ["Job", "Outcome", "SandboxConfig", "SandboxPool", "SandboxUnavailableError", "STATUSES",
           "get_pool", "close_pools", "run_program", "run_many"]

"""Warm server that runs one untrusted program per request in a fresh child and relays calls into it.

Why a server: starting a Python interpreter costs far more than forking a warm one, and code rewards
run thousands of programs per training step. The trainer starts one of these per worker (inside
bubblewrap when available) and sends JSON-line requests on stdin; answers come back on stdout.

This file is read as text and run with ``python -I -c <source> <config-json>``, after the text of
``grading_codec.py`` (the plain-data codec): it must stay standard-library only and never import the
project (the sandbox user may not even be able to read it).

Per request the process tree is: zygote -> A (own session; unshares user, net, pid and ipc
namespaces when isolated) -> B (pid 1 of the new pid namespace: when it exits the kernel kills every
process the program left behind) -> C (sets the limits, runs the program, then answers calls).
Nothing in C decides a score. Tests are evaluated by the trusted grader outside the sandbox
(``inner_loop.sandbox.grading``); C only runs the calls into the program that the grader sends and answers each
with the result as exact plain builtin data, on a private pipe with each line prefixed by a random nonce
(so text the program prints is never taken for an answer). The program can read that nonce and forge
answers, but an answer is only a value the grader compares itself: forging one is the same as returning
it. What the program cannot reach is the comparison, the expected values and the pass count.
"""

import ctypes
import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback

_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MAX_ANSWER_BYTES = MAX_MESSAGE_BYTES + 64  # one encoded value plus its envelope
_STDERR_TAIL_BYTES = 2000
_EXIT_INTERNAL = 70


def _unshare_namespaces() -> None:
    """Give the program its own user, network, pid and ipc namespaces (unprivileged via the user ns)."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _exit_code_of(status: int) -> int:
    """Pass a child's fate up one level: its exit code, or 128 + the signal that killed it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else _EXIT_INTERNAL


def _fork_and_relay(body) -> None:
    """Run body() in a child, wait for it, and exit with its fate (used for A and B)."""
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(_EXIT_INTERNAL)
    _, status = os.waitpid(pid, 0)
    os._exit(_exit_code_of(status))


def _set_limits(cfg: dict, timeout_s: float) -> None:
    cpu = max(1, math.ceil(timeout_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = cfg["max_file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    nproc = cfg["max_processes"] + cfg["nproc_base"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    mem = cfg["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def _redirect_stdio(stderr_path: str) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(err, 2)
    os.close(devnull)
    os.close(err)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")


def _run_harness(req: dict, cfg: dict, cwd: str, stderr_path: str, fds: tuple, nonce: str) -> None:
    """Process C: limits, the program, then answer the grader's calls into it until told to stop.

    C decides nothing: it sends back each call's result as plain data (or the exception's name) and the
    trusted grader outside the sandbox compares. Whatever the program does to this process can only
    change the values it answers with, which it controls anyway.
    """
    request_fd, report_fd = fds
    write, exit_now, compile_, exec_ = os.write, os._exit, compile, exec
    print_exc, dumps, loads = traceback.print_exc, json.dumps, json.loads
    encode_value, from_plain_, unsendable = encode, from_plain, Unsendable
    tag = nonce.encode() + b" "

    def report(message: str) -> None:
        try:
            write(report_fd, tag + message.encode("utf-8", "replace") + b"\n")
        except OSError:
            pass

    os.chdir(cwd)
    os.environ["HOME"] = cwd
    _redirect_stdio(stderr_path)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing us
    low, high = sorted(fds)
    os.closerange(3, low)  # nothing inherited stays open but the two channel pipes
    os.closerange(low + 1, high)
    os.closerange(high + 1, 1 << 16)
    _set_limits(cfg, req["timeout_s"])
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    program, calls = req.pop("program"), req.pop("calls", [])
    try:
        exec_(compile_(program, "<program>", "exec"), namespace)
    except MemoryError:
        print_exc()  # before the report: the zygote may end this process as soon as it has it
        report('{"program":"oom"}')
        exit_now(0)
    except Exception:
        print_exc()  # before the report: the zygote may end this process as soon as it has it
        report('{"program":"error"}')
        exit_now(0)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt: the process would have ended here
        print(f"program ended early with {type(exc).__name__}: no test ran", file=sys.stderr)
        report('{"program":"exit"}')
        exit_now(0)
    report('{"program":"ok"}')

    def answer(call: dict) -> None:
        try:
            op, name = call["op"], call["name"]
            if name not in namespace:
                print(f"NameError: name {name!r} is not defined by the program", file=sys.stderr)
                report(dumps({"raise": "NameError"}))
                return
            target = namespace[name]
            if op == "get":
                if callable(target):
                    report('{"callable":true}')
                    return
                value = target
            else:
                value = target(*from_plain_(call["args"]), **from_plain_(call["kwargs"]))
            report('{"ok":' + encode_value(value) + "}")
        except unsendable as exc:
            report(dumps({"unsendable": str(exc)[:200]}))
        except MemoryError:
            print_exc()
            report('{"oom":true}')
        except Exception as exc:
            print_exc()
            report(dumps({"raise": type(exc).__name__}))
        except BaseException as exc:
            print(f"a test call ended the process with {type(exc).__name__}", file=sys.stderr)
            report('{"exit":true}')
            exit_now(0)

    for call in calls:  # the grader's calls known before any test ran, in test order: one round trip
        answer(call)
    for line in os.fdopen(request_fd, "rb"):
        try:
            call = loads(line)
        except ValueError:
            call = {}
        answer(call)
    exit_now(0)


def _read_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _STDERR_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _remove_tree(path: str) -> None:
    """Delete the run dir even if the program chmod-ed parts of it away."""
    def fix_and_retry(func, target, _exc):
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass
    for root, dirs, _files in os.walk(path):
        for d in dirs:
            try:
                os.chmod(os.path.join(root, d), 0o700)
            except OSError:
                pass
    shutil.rmtree(path, onerror=fix_and_retry)


def _child_a(req: dict, cfg: dict, cwd: str, stderr_path: str, fds: tuple, nonce: str) -> None:
    os.setsid()
    harness = lambda: _run_harness(req, cfg, cwd, stderr_path, fds, nonce)  # noqa: E731
    if cfg["isolated"]:
        _unshare_namespaces()
        _fork_and_relay(lambda: _fork_and_relay(harness))  # B is pid 1 of the new pid namespace
    else:
        harness()


class _Link:
    """The zygote's end of one program's channel: nonce-tagged answer lines in, call lines out.

    Every wait is bounded by the run's deadline and ends early when the program's process tree exits.
    """

    def __init__(self, pid: int, request_fd: int, report_fd: int, nonce: str) -> None:
        self.pidfd = os.pidfd_open(pid)
        self.request_fd, self.report_fd = request_fd, report_fd
        self.prefix = nonce.encode() + b" "
        self.buffer = b""
        self.timed_out = False
        self.exited = False
        self.eof = False
        os.set_blocking(request_fd, False)

    def _wait(self, fds: list, deadline: float, write: bool = False) -> list:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.timed_out = True
            return []
        if write:
            ready_r, ready_w, _ = select.select([self.pidfd], fds, [], remaining)
            ready = ready_r + ready_w
        else:
            ready, _, _ = select.select([self.pidfd] + fds, [], [], remaining)
        if not ready:
            self.timed_out = True
        return ready

    def read(self, deadline: float) -> bytes | None:
        """The next answer line (without its nonce), or None: process gone, deadline, or oversized."""
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                if line.startswith(self.prefix):
                    return line[len(self.prefix):]
            if self.eof or len(self.buffer) > _MAX_ANSWER_BYTES:
                return None
            ready = self._wait([self.report_fd], deadline)
            if not ready:
                return None
            if self.report_fd in ready:
                chunk = os.read(self.report_fd, 1 << 16)
                self.buffer += chunk
                self.eof = not chunk
                continue
            self.exited = True  # only the pidfd: take what is already written, never wait again
            while len(self.buffer) <= _MAX_ANSWER_BYTES and select.select([self.report_fd], [], [], 0)[0]:
                chunk = os.read(self.report_fd, 1 << 16)
                if not chunk:
                    break
                self.buffer += chunk
            self.eof = True

    def write(self, data: bytes, deadline: float) -> bool:
        """Send one call line; False if the program is gone or the deadline passed first."""
        view = memoryview(data)
        while view:
            ready = self._wait([self.request_fd], deadline, write=True)
            if self.request_fd in ready:
                try:
                    view = view[os.write(self.request_fd, view):]
                except BlockingIOError:
                    continue
                except OSError:
                    return False
            elif self.pidfd in ready:
                self.exited = True
                return False
            else:
                return False
        return True

    def close(self) -> None:
        os.close(self.pidfd)


def _kill_leftovers(pid: int, isolated: bool) -> None:
    """Isolated: we are alone in our pid namespace, so kill everything else in it. Else: the group."""
    try:
        if isolated:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_one(req: dict, cfg: dict, inbox, send) -> None:
    """One program: start it, relay the grader's calls to it and its answers back, then clean up.

    Every line sent is one answer: ``R <answer json>`` or, once the run is over, ``E <end json>``.
    """
    timeout_s = float(req["timeout_s"])
    cfg["nproc_base"] = int(req.get("nproc_base") or 0)  # the user's tasks now, where the process limit counts them
    nonce = os.urandom(16).hex()
    os.makedirs(cfg["work_root"], exist_ok=True)  # a previous program may have deleted it
    run_dir = tempfile.mkdtemp(prefix="run_", dir=cfg["work_root"])
    cwd = os.path.join(run_dir, "work")
    os.mkdir(cwd, 0o700)
    stderr_path = os.path.join(run_dir, "stderr.txt")
    call_r, call_w = os.pipe()
    answer_r, answer_w = os.pipe()
    start = time.monotonic()
    deadline = start + timeout_s
    pid = os.fork()
    if pid == 0:
        try:
            os.close(call_w)
            os.close(answer_r)
            _child_a(req, cfg, cwd, stderr_path, (call_r, answer_w), nonce)
        finally:
            os._exit(_EXIT_INTERNAL)
    os.close(call_r)
    os.close(answer_w)
    link = _Link(pid, call_w, answer_r, nonce)
    try:
        answer = link.read(deadline)
        if answer == b'{"program":"ok"}':  # then one answer per call sent along with the program
            for _ in req.get("calls", []):
                send(b"R " + answer)
                answer = link.read(deadline)
                if answer is None:
                    break
        while answer is not None:
            send(b"R " + answer)
            line = inbox.readline()
            if not line or not line.startswith(b'{"op"'):  # "finish", or the trainer went away
                break
            if not link.write(line, deadline):
                break
            answer = link.read(deadline)
        exited = link.exited or bool(select.select([link.pidfd], [], [], 0)[0])
        _kill_leftovers(pid, False)
        _kill_leftovers(pid, cfg["isolated"])
        _, status = os.waitpid(pid, 0)
    finally:
        link.close()
        os.close(call_w)
        os.close(answer_r)
    _reap_zombies()
    ended = "timeout" if link.timed_out else ("exited" if exited else "finished")
    tail = _read_tail(stderr_path)
    if ended == "timeout":
        tail = (tail + f"\n[sandbox] time limit of {timeout_s:g} s (wall or CPU) reached").strip()
    _remove_tree(run_dir)
    end = {"ended": ended, "fate": _exit_code_of(status) if exited else 0,
           "stderr_tail": tail[-_STDERR_TAIL_BYTES:], "wall_s": time.monotonic() - start}
    send(b"E " + json.dumps(end).encode())


def main() -> None:
    cfg = json.loads(sys.argv[1])
    # RLIMIT_NPROC counts per user (per user namespace from Linux 5.14): where it counts the whole user, each request
    # carries the user's tasks at that moment ("nproc_base", counted outside the sandbox's pid namespace), and the
    # limit leaves the program max_processes beyond them.
    cfg.setdefault("nproc_base", 0)
    os.makedirs(cfg["work_root"], exist_ok=True)
    inbox, out = sys.stdin.buffer, sys.stdout.buffer

    def send(line: bytes) -> None:
        out.write(line + b"\n")
        out.flush()

    while True:
        line = inbox.readline()
        if not line:
            return
        if not line.startswith(b'{"program"'):
            continue  # a stray "finish" for a run that already ended
        req = json.loads(line)
        try:
            run_one(req, cfg, inbox, send)
        except Exception as exc:  # the zygote itself must survive anything a request does
            end = {"ended": "internal", "fate": _EXIT_INTERNAL, "wall_s": 0.0,
                   "stderr_tail": f"[sandbox] internal error: {exc!r}"}
            send(b"E " + json.dumps(end).encode())


if __name__ == "__main__":
    main()

"""Warm server that runs one untrusted program (plus its test snippets) per request in a fresh child.

Why a server: starting a Python interpreter costs far more than forking a warm one, and code rewards
run thousands of programs per training step. The trainer starts one of these per worker (inside
bubblewrap when available) and sends JSON-line requests on stdin; answers come back on stdout.

This file is read as text and run with ``python -I -c <source> <config-json>``: it must stay
standard-library only and never import the project (the sandbox user may not even be able to read it).

Per request the process tree is: zygote -> A (own session; unshares user, net, pid and ipc
namespaces when isolated) -> B (pid 1 of the new pid namespace: when it exits the kernel kills every
process the program left behind) -> C (sets the limits, runs the program and the tests).
C reports each completed test snippet on a private pipe, each line prefixed with a random nonce, so
an early exit, a forged exit code or text printed by the program never counts as a pass.
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
_MAX_REPORT_BYTES = 1 << 20
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
    nproc = cfg["nproc_limit"]
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


def _run_harness(req: dict, cfg: dict, cwd: str, stderr_path: str, report_fd: int, nonce: str) -> None:
    """Process C: limits, then the program, then each test snippet; reports only what completed."""
    write, exit_now, compile_, exec_ = os.write, os._exit, compile, exec
    print_exc = traceback.print_exc
    tag = nonce.encode()

    def report(event: str) -> None:
        try:
            write(report_fd, tag + b" " + event.encode() + b"\n")
        except OSError:
            pass

    os.chdir(cwd)
    os.environ["HOME"] = cwd
    _redirect_stdio(stderr_path)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing us
    os.closerange(3, report_fd)
    os.closerange(report_fd + 1, 1 << 16)
    _set_limits(cfg, req["timeout_s"])
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    del req["timeout_s"]
    program, tests = req.pop("program"), req.pop("tests")
    try:
        exec_(compile_(program, "<program>", "exec"), namespace)
    except MemoryError:
        report("program oom")
        print_exc()
        exit_now(0)
    except Exception:
        report("program error")
        print_exc()
        exit_now(0)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt: the process would have ended here
        report("program exit")
        print(f"program ended early with {type(exc).__name__}: no test ran", file=sys.stderr)
        exit_now(0)
    report("program ok")
    for index, snippet in enumerate(tests):
        try:
            exec_(compile_(snippet, f"<test {index}>", "exec"), namespace)
        except MemoryError:
            report(f"test {index} oom")
            print_exc()
            continue
        except Exception:
            report(f"test {index} fail")
            print_exc()
            continue
        except BaseException as exc:
            report(f"test {index} exit")
            print(f"test {index} ended the process with {type(exc).__name__}", file=sys.stderr)
            exit_now(0)
        report(f"test {index} ok")
    report("done")
    exit_now(0)


def _parse_reports(data: bytes, nonce: str, total: int) -> dict:
    """Accept only nonce-tagged lines, in protocol order; anything else is ignored."""
    passed: set = set()
    seen_tests: set = set()
    program_ok = oom = done = program_reported = False
    prefix = nonce + " "
    for raw in data.decode("utf-8", "replace").splitlines():
        if not raw.startswith(prefix):
            continue
        words = raw[len(prefix):].split()
        if words[:1] == ["program"]:
            program_reported = True
        if words == ["program", "ok"]:
            program_ok = True
        elif words == ["program", "oom"]:
            oom = True
        elif program_ok and len(words) == 3 and words[0] == "test" and words[1].isdigit():
            index = int(words[1])
            if index >= total or index in seen_tests:
                continue
            seen_tests.add(index)
            if words[2] == "ok":
                passed.add(index)
            elif words[2] == "oom":
                oom = True
        elif words == ["done"] and program_ok:
            done = True
    return {"passed": len(passed), "oom": oom, "done": done, "program_reported": program_reported}


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


def _classify(fate: int, timed_out: bool, parsed: dict, total: int) -> str:
    killed_by = fate - 128 if fate > 128 else 0
    if timed_out or killed_by in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout"
    if parsed["oom"]:
        return "out_of_memory"
    if parsed["done"]:
        return "passed" if parsed["passed"] == total else "failed"
    if fate == 0 and parsed["program_reported"]:
        return "failed"  # the harness reported why (program error / early exit) and stopped cleanly
    return "crashed"


def _child_a(req: dict, cfg: dict, cwd: str, stderr_path: str, report_fd: int, nonce: str) -> None:
    os.setsid()
    harness = lambda: _run_harness(req, cfg, cwd, stderr_path, report_fd, nonce)  # noqa: E731
    if cfg["isolated"]:
        _unshare_namespaces()
        _fork_and_relay(lambda: _fork_and_relay(harness))  # B is pid 1 of the new pid namespace
    else:
        harness()


def _wait_for(pid: int, report_fd: int, deadline: float) -> tuple:
    """Collect reports until the child exits or the deadline passes; returns (data, timed_out)."""
    pidfd = os.pidfd_open(pid)
    data = bytearray()
    reading = True
    timed_out = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([pidfd, report_fd] if reading else [pidfd], [], [], remaining)
            if report_fd in ready:
                chunk = os.read(report_fd, 65536)
                if not chunk:
                    reading = False
                elif len(data) < _MAX_REPORT_BYTES:
                    data += chunk
            if pidfd in ready:
                break
    finally:
        os.close(pidfd)
    return data, timed_out


def _drain(report_fd: int, data: bytearray) -> None:
    while len(data) < _MAX_REPORT_BYTES:
        ready, _, _ = select.select([report_fd], [], [], 0)
        if not ready:
            return
        chunk = os.read(report_fd, 65536)
        if not chunk:
            return
        data += chunk


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


def run_one(req: dict, cfg: dict) -> dict:
    total = len(req["tests"])
    timeout_s = float(req["timeout_s"])
    nonce = os.urandom(16).hex()
    os.makedirs(cfg["work_root"], exist_ok=True)  # a previous program may have deleted it
    run_dir = tempfile.mkdtemp(prefix="run_", dir=cfg["work_root"])
    cwd = os.path.join(run_dir, "work")
    os.mkdir(cwd, 0o700)
    stderr_path = os.path.join(run_dir, "stderr.txt")
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            _child_a(req, cfg, cwd, stderr_path, write_fd, nonce)
        finally:
            os._exit(_EXIT_INTERNAL)
    os.close(write_fd)
    try:
        data, timed_out = _wait_for(pid, read_fd, start + timeout_s)
        if timed_out:
            _kill_leftovers(pid, False)
        _kill_leftovers(pid, cfg["isolated"])
        _, status = os.waitpid(pid, 0)
        _drain(read_fd, data)
    finally:
        os.close(read_fd)
    _reap_zombies()
    parsed = _parse_reports(bytes(data), nonce, total)
    fate = _exit_code_of(status)
    status_name = _classify(fate, timed_out, parsed, total)
    tail = _read_tail(stderr_path)
    if status_name == "crashed":
        tail = (tail + f"\n[sandbox] process ended with code {fate} before the harness finished").strip()
    elif status_name == "timeout":
        tail = (tail + f"\n[sandbox] time limit of {timeout_s:g} s (wall or CPU) reached").strip()
    _remove_tree(run_dir)
    return {"passed": parsed["passed"], "total": total, "status": status_name,
            "stderr_tail": tail[-_STDERR_TAIL_BYTES:], "wall_s": time.monotonic() - start}


def _count_own_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


def main() -> None:
    cfg = json.loads(sys.argv[1])
    # RLIMIT_NPROC counts per user (per user namespace): without our own namespace, leave room for the
    # processes this user already has, or the limit would break every fork.
    cfg["nproc_limit"] = cfg["max_processes"] + (0 if cfg["isolated"] else _count_own_processes())
    os.makedirs(cfg["work_root"], exist_ok=True)
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            answer = run_one(req, cfg)
        except Exception as exc:  # the zygote itself must survive anything a request does
            answer = {"passed": 0, "total": len(req.get("tests", [])), "status": "crashed",
                      "stderr_tail": f"[sandbox] internal error: {exc!r}", "wall_s": 0.0}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

"""Hostile programs must be contained, score as not passing, and leave this process and machine intact.

All hostile programs run in one concurrent batch (module fixture) to keep the file fast; each test
then checks one case. Where an attack would succeed outside the sandbox, a control run with plain
`python -c` proves the case is a real attack (so the sandboxed check could fail).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from inner_loop.sandbox.pool import Outcome, SandboxConfig, SandboxPool
from sandbox_programs import fork_counter

REPO = Path(__file__).resolve().parents[3]
SECRET_NAME = "MIRROR_ES_SANDBOX_TEST_SECRET"
SECRET_VALUE = "s3cr3t-token-5f0c2b"
TIMEOUT_S = 4.0
pytestmark = pytest.mark.slow


def _nobody_processes(pool: SandboxPool) -> int:
    """Processes run as `nobody` in ``pool``'s process trees (its workers and everything under them): not the
    whole machine's, where another pool alive in this session or another test run would be counted too."""
    roots = {worker._proc.pid for worker in pool._all if worker._proc is not None}
    parent, uid = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            uid[int(entry)] = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        parent[int(entry)] = int(stat.rpartition(")")[2].split()[1])

    def in_pool(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            if pid in roots:
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    return sum(1 for pid, owner in uid.items() if owner == 65534 and in_pool(pid))


class _Listener:
    """A TCP server on 127.0.0.1 in this process that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def connected_within(self, timeout: float) -> bool:
        """Has anyone connected, waiting up to ``timeout`` s: a connection the kernel completed may still sit in
        the backlog until this thread's next accept()."""
        deadline = time.monotonic() + timeout
        while not self.connections and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.connections > 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _cases(victims: Path, port: int) -> dict[str, tuple[str, list[str]]]:
    pid = os.getpid()
    home_victim = victims / "home" / "keep.txt"
    tmp_victim = victims / "tmp_keep.txt"
    ded = textwrap.dedent
    return {
        "correct": ("def f(x):\n    return x + 1\n", ["assert f(1) == 2", "assert f(5) == 6"]),
        "infinite_loop": ("while True:\n    pass\n", ["assert True"]),
        "sleep_forever": ("import time\ntime.sleep(1000)\n", ["assert True"]),
        "fork_bomb": (ded("""
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """), ["assert True"]),
        "fork_count": (fork_counter(1000, child_sleep_s=60), ["assert n >= 1000"]),
        "alloc_50gb": ("blob = bytearray(50 * 10**9)\n", ["assert len(blob) > 0"]),
        "file_10gb": (ded("""
            chunk = b"x" * (1 << 20)
            with open("big.bin", "wb") as f:
                for _ in range(10 * 1024):
                    f.write(chunk)
            """), ["assert True"]),
        "write_outside": (ded(f"""
            import os
            wrote = []
            for path in [{str(REPO / 'sandbox_escape_probe.txt')!r}, {str(tmp_victim.with_name('new.txt'))!r},
                         os.path.join({str(Path.home())!r}, 'sandbox_escape_probe.txt'),
                         '/tmp/mirror_es_escape_probe.txt']:
                try:
                    with open(path, 'w') as f:
                        f.write('pwned')
                    wrote.append(path)
                except OSError:
                    pass
            """), [f"assert {str(REPO / 'sandbox_escape_probe.txt')!r} in wrote"]),
        "delete_outside": (ded(f"""
            import os
            removed = 0
            for path in ({str(home_victim)!r}, {str(tmp_victim)!r}):
                try:
                    os.rename(path, path + '.gone')
                    removed += 1
                except OSError:
                    pass
            """), ["assert removed > 0"]),
        # sandbox only, never as an unsandboxed control: inside, HOME is the program's own work dir
        "rmtree_home": ("import os, shutil\nshutil.rmtree(os.path.expanduser('~'))\n", ["assert False"]),
        "socket_local": (ded(f"""
            import socket
            s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
            """), ["assert True"]),
        "socket_public": (ded("""
            import socket
            s = socket.create_connection(("1.1.1.1", 53), timeout=2)
            """), ["assert True"]),
        "read_secret": (ded(f"""
            import glob, os, sys
            found = [v for v in os.environ.values() if {SECRET_VALUE!r} in v]
            for path in glob.glob('/proc/*/environ'):
                try:
                    with open(path, 'rb') as f:
                        if {SECRET_VALUE!r}.encode() in f.read():
                            found.append(path)
                except OSError:
                    pass
            print('found', found, file=sys.stderr)
            """), ["assert found"]),
        "kill_parent": (ded(f"""
            import os, signal
            for target in ({pid}, os.getppid(), 1, -1):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            def f():
                return 0
            """), ["assert f() == 1"]),
        "sys_exit": ("import sys\ndef f():\n    return 1\nsys.exit(0)\n", ["assert f() == 2"]),
        "os_exit": ("import os\ndef f():\n    return 1\nos._exit(0)\n", ["assert f() == 2"]),
        "exit_in_test": ("import sys\ndef f():\n    sys.exit(0)\n", ["f()\nassert False", "assert False"]),
        "tamper_assertion": (ded("""
            import builtins
            class AssertionError(Exception):
                pass
            builtins.AssertionError = AssertionError
            def f():
                return 1
            """), ["assert f() == 2"]),
        "tamper_harness": (ded("""
            import builtins, os, sys
            builtins.exec = lambda *a, **k: None
            builtins.compile = lambda *a, **k: None
            os.write = lambda fd, data: len(data)
            for fd in range(100):
                for line in (b"x program ok\\n", b"x test 0 ok\\n", b"x done\\n"):
                    try:
                        os.fstat(fd) and os.__dict__['write'] and __import__('posix').write(fd, line)
                    except OSError:
                        pass
            import atexit
            atexit.register(lambda: print('all tests passed'))
            os._exit(0)
            """), ["assert False"]),
        "megabytes_output": (ded("""
            import sys
            for _ in range(20):
                sys.stdout.write("o" * (1 << 20))
                sys.stderr.write("e" * (1 << 18))
            def f():
                return 3
            """), ["assert f() == 3"]),
        "recursion": ("def f(n):\n    return f(n + 1)\n", ["assert f(0)"]),
        "recursion_c_stack": (ded("""
            import sys
            sys.setrecursionlimit(10**7)
            def f(n):
                return f(n + 1) + 1
            """), ["assert f(0)"]),
    }


@pytest.fixture(scope="module")
def attack_run(tmp_path_factory):
    victims = tmp_path_factory.mktemp("victims")
    scratch = tmp_path_factory.mktemp("control_home")
    (victims / "home").mkdir()
    (victims / "home" / "keep.txt").write_text("keep")
    (victims / "tmp_keep.txt").write_text("keep")
    os.environ[SECRET_NAME] = SECRET_VALUE
    listener = _Listener()
    pool = SandboxPool(SandboxConfig(workers=4))
    cases = _cases(victims, listener.port)
    started = time.monotonic()
    outcomes = dict(zip(cases, pool.run_many(list(cases.values()), timeout_s=TIMEOUT_S)))
    elapsed = time.monotonic() - started
    yield {"pool": pool, "outcomes": outcomes, "victims": victims, "listener": listener,
           "cases": cases, "scratch": scratch, "elapsed": elapsed}
    pool.close()
    listener.close()
    os.environ.pop(SECRET_NAME, None)


def _control(program: str, tests: list[str], scratch: Path) -> subprocess.CompletedProcess:
    """Run the same code unsandboxed, to show the attack is real (only for harmless cases; HOME and
    cwd point at a scratch dir as a second guard)."""
    source = program + "\n" + "\n".join(tests) + "\n"
    env = {**os.environ, "HOME": str(scratch)}
    return subprocess.run([sys.executable, "-c", source], capture_output=True, timeout=60, env=env,
                          cwd=scratch)


def _not_passing(outcome: Outcome) -> None:
    assert outcome.status != "passed" and outcome.passed < outcome.total, outcome


def test_the_batch_runs_on_an_isolated_pool(attack_run):
    assert attack_run["pool"].isolated, "bubblewrap isolation is expected on this machine"
    assert attack_run["outcomes"]["correct"] == Outcome(2, 2, "passed", "")


def test_infinite_loop_and_sleep_time_out(attack_run):
    for name in ("infinite_loop", "sleep_forever"):
        outcome = attack_run["outcomes"][name]
        assert outcome.status == "timeout" and outcome.passed == 0, outcome
    assert attack_run["elapsed"] < 60


def test_fork_bomb_is_contained_and_cleaned_up(attack_run):
    _not_passing(attack_run["outcomes"]["fork_bomb"])
    counted = attack_run["outcomes"]["fork_count"]
    _not_passing(counted)
    forked = int(counted.stderr_tail.split("forked")[-1].split()[0])
    assert 0 < forked < 32  # max_processes=32 per program; its sleeping children must be gone too
    time.sleep(0.5)
    # per worker: bwrap (2 processes) + zygote; anything beyond that would be a surviving fork
    alive = _nobody_processes(attack_run["pool"])
    assert 4 <= alive <= 3 * 4, alive  # at least the 4 warm zygotes are counted: the count sees the pool


def test_huge_allocation_is_out_of_memory(attack_run):
    outcome = attack_run["outcomes"]["alloc_50gb"]
    assert outcome.status == "out_of_memory" and "MemoryError" in outcome.stderr_tail


def test_ten_gb_file_is_stopped_by_the_file_size_limit(attack_run):
    outcome = attack_run["outcomes"]["file_10gb"]
    _not_passing(outcome)
    assert "File too large" in outcome.stderr_tail


def test_writes_outside_the_work_dir_do_not_land(attack_run):
    _not_passing(attack_run["outcomes"]["write_outside"])
    escaped = [p for p in (REPO / "sandbox_escape_probe.txt", Path.home() / "sandbox_escape_probe.txt",
                           attack_run["victims"] / "new.txt", Path("/tmp/mirror_es_escape_probe.txt"))
               if p.exists()]
    for path in escaped:
        path.unlink()
    assert escaped == []


def test_deletes_outside_the_work_dir_do_not_happen(attack_run):
    _not_passing(attack_run["outcomes"]["delete_outside"])
    assert (attack_run["victims"] / "home" / "keep.txt").read_text() == "keep"
    assert (attack_run["victims"] / "tmp_keep.txt").read_text() == "keep"
    assert Path.home().exists() and (Path.home() / ".profile").exists()
    _not_passing(attack_run["outcomes"]["rmtree_home"])
    program, tests = attack_run["cases"]["delete_outside"]
    # unsandboxed, the files really go
    assert _control(program, tests, attack_run["scratch"]).returncode == 0
    assert not (attack_run["victims"] / "tmp_keep.txt").exists()


def test_no_network_even_to_localhost(attack_run):
    for name in ("socket_local", "socket_public"):
        outcome = attack_run["outcomes"][name]
        _not_passing(outcome)
        assert "Network is unreachable" in outcome.stderr_tail, outcome
    assert attack_run["listener"].connections == 0
    program, tests = attack_run["cases"]["socket_local"]
    # the same code connects when unsandboxed
    assert _control(program, tests, attack_run["scratch"]).returncode == 0
    assert attack_run["listener"].connected_within(10.0)


def test_parent_secret_is_not_readable(attack_run):
    outcome = attack_run["outcomes"]["read_secret"]
    _not_passing(outcome)
    assert SECRET_VALUE not in outcome.stderr_tail and "found []" in outcome.stderr_tail
    program, tests = attack_run["cases"]["read_secret"]
    # unsandboxed, the secret is found
    assert _control(program, tests, attack_run["scratch"]).returncode == 0


def test_killing_the_parent_harms_nothing(attack_run):
    _not_passing(attack_run["outcomes"]["kill_parent"])
    os.kill(os.getpid(), 0)
    assert attack_run["pool"].run("x = 1", ["assert x == 1"]) == Outcome(1, 1, "passed", "")


def test_early_exit_never_counts_as_passing(attack_run):
    for name in ("sys_exit", "os_exit", "exit_in_test"):
        outcome = attack_run["outcomes"][name]
        assert outcome.passed == 0 and outcome.status in ("failed", "crashed"), (name, outcome)
        program, tests = attack_run["cases"][name]
        if name != "exit_in_test":
            # an exit-code harness would say "pass"
            assert _control(program, tests, attack_run["scratch"]).returncode == 0


def test_tampering_with_asserts_or_harness_fails(attack_run):
    for name in ("tamper_assertion", "tamper_harness"):
        outcome = attack_run["outcomes"][name]
        assert outcome.passed == 0 and outcome.status in ("failed", "crashed"), (name, outcome)
    program, tests = attack_run["cases"]["tamper_harness"]
    assert _control(program, tests, attack_run["scratch"]).returncode == 0


def test_megabytes_of_output_are_fine_and_tail_is_short(attack_run):
    outcome = attack_run["outcomes"]["megabytes_output"]
    assert outcome.status == "passed" and outcome.passed == 1
    assert 0 < len(outcome.stderr_tail) <= 2000 and set(outcome.stderr_tail) == {"e"}


def test_deep_recursion_fails_without_harm(attack_run):
    outcome = attack_run["outcomes"]["recursion"]
    assert outcome.status == "failed" and "RecursionError" in outcome.stderr_tail
    _not_passing(attack_run["outcomes"]["recursion_c_stack"])
    assert attack_run["pool"].run("y = 2", ["assert y == 2"]).status == "passed"

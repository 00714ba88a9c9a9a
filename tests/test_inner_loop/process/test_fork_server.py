"""The fork server (inner_loop/process/fork_server.py): a pinned child forked from it is the child a fresh interpreter
would be (the same member, bit for bit; the caller's streams, environment and directory; exit statuses and signals
as Popen reports them), it dies with its caller however the caller dies, and a caller it cannot serve gets a fresh
interpreter that works the same."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import inner_loop.process.fork_server as fork_server
import inner_loop.process.pinned as numerics
import inner_loop.process.pinned_child as pinned_child
from conf_groups import load_group
from core.proc_stat import proc_stat
from core.records import MemberSpec
from inner_loop.member.entry import train_member
from inner_loop.process.offline import OFFLINE_ENV
from launch.local.launchers import HostedPrograms
from time_limits import scaled, wait_until

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not (numerics.can_pin() and fork_server.can_serve()),
                                reason="the fork server serves pinned children on Linux with AVX2 and FMA")

#: a child module: reports what it was started with, exits with the payload's code (or as it says)
CHILD = textwrap.dedent("""
    import json, os, sys, time
    payload = json.loads(sys.stdin.read())
    report = {"payload": payload, "torch_loaded_at_start": "torch" in sys.modules, "cwd": os.getcwd(),
              "marker": os.environ.get("FORK_TEST_MARKER"), "aten": os.environ.get("ATEN_CPU_CAPABILITY"),
              "name": __name__, "pid": os.getpid(),
              "hub_offline": getattr(sys.modules.get("huggingface_hub.constants"), "HF_HUB_OFFLINE", None)}
    if payload.get("numpy"):
        import numpy
        report["numpy_draw"] = float(numpy.random.random())
    if payload.get("pid_file"):
        with open(payload["pid_file"], "w") as f:
            f.write(str(os.getpid()))
    sys.stdout.write(json.dumps(report))
    sys.stdout.flush()
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    sys.exit(payload.get("exit", 0))
""")


@pytest.fixture(scope="module")
def server() -> str:
    """This session's fork server (tests/conftest.py starts one), or one of this module's own, once it listens."""
    with fork_server.serving() as path:
        assert path is not None
        wait_until(lambda: os.path.exists(path), scaled(120), "the fork server to listen")
        yield path


@pytest.fixture
def child_dir(tmp_path, monkeypatch) -> Path:
    """A directory with the child module, the working directory (a `python -m` child finds it there)."""
    (tmp_path / "fork_child.py").write_text(CHILD)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(payload: dict, **kwargs) -> tuple[int, dict]:
    code, out = pinned_child.run_pinned_child("fork_child", payload, **kwargs)
    return code, json.loads(out)


def test_a_forked_child_starts_with_the_stack_imported_and_the_callers_environment(server, child_dir, monkeypatch):
    monkeypatch.setenv("FORK_TEST_MARKER", "asked-by-this-caller")
    code, report = _run({"exit": 3, "data": list(range(5000))})
    assert report["torch_loaded_at_start"], "forked from the server, whose torch is imported"
    assert code == 3 and report["payload"]["data"] == list(range(5000))
    assert report["cwd"] == str(child_dir) and report["marker"] == "asked-by-this-caller"
    assert report["aten"] == numerics.PINNED_ENV["ATEN_CPU_CAPABILITY"] and report["name"] == "__main__"
    code, report = _run({"exit": "a message"})
    assert code == 1, "sys.exit with a message exits 1, as an interpreter does"


def test_an_offline_caller_gets_a_child_whose_imported_hub_modules_are_offline(server, child_dir, monkeypatch):
    code, report = _run({})
    assert report["torch_loaded_at_start"] and report["hub_offline"] is False
    for key, value in OFFLINE_ENV.items():  # what a local job's process sets before it starts its pinned child
        monkeypatch.setenv(key, value)
    code, report = _run({})
    assert code == 0 and report["torch_loaded_at_start"], "forked, though the offline flags differ from the server's"
    assert report["hub_offline"] is True, "huggingface_hub read the flag at import in the server; the child set it"


def test_forked_children_do_not_share_numpys_global_generator(server, child_dir):
    draws = {_run({"numpy": True})[1]["numpy_draw"] for _ in range(3)}
    assert len(draws) == 3, draws


def test_a_caller_the_server_cannot_serve_gets_a_fresh_interpreter(server, child_dir, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(child_dir / "another-hub-cache"))  # read at import by huggingface_hub
    code, report = _run({})
    assert code == 0 and not report["torch_loaded_at_start"]
    code, report = _run({}, forkable=False)  # a child that needs vLLM, which the server hides
    assert code == 0 and not report["torch_loaded_at_start"]
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv(fork_server.SERVER_ENV, str(child_dir / "no-such.sock"))
    code, report = _run({})
    assert code == 0 and not report["torch_loaded_at_start"]


def test_a_terminated_child_reports_its_signal_as_popen_does(server, child_dir):
    child = fork_server.start_forked("fork_child", numerics.pinned_child_env())
    assert child is not None
    with open(child._stdin, "wb", closefd=False) as stdin:
        stdin.write(json.dumps({"sleep": 600}).encode())
    os.close(child._stdin)
    child._stdin = -1
    assert json.loads(os.read(child._stdout, 1 << 16))["pid"] == child.pid  # running, past its report
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.1)
    child.terminate()
    assert child.wait(timeout=scaled(30)) == -signal.SIGTERM
    os.close(child._stdout)


def _alive(pid: int) -> bool:
    fields = proc_stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def test_a_forked_child_dies_with_its_caller_killed_hard(server, child_dir):
    pid_file = child_dir / "child.pid"
    caller = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path[:0] = [sys.argv[1]]; import inner_loop.process.pinned_child as p; "
         "p.run_pinned_child('fork_child', {'sleep': 600, 'pid_file': sys.argv[2]})", str(ROOT), str(pid_file)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    try:
        wait_until(lambda: pid_file.is_file() and pid_file.read_text(), scaled(120), "the child to start")
        child = int(pid_file.read_text())
        assert _alive(child)
        caller.kill()
        caller.wait()
        wait_until(lambda: not _alive(child), scaled(30), "the child of a killed caller to die")
    finally:
        caller.kill()
        caller.wait()


def test_a_local_launcher_hosts_a_fork_server_for_pinned_members_from_its_first_submission_to_its_close(
        monkeypatch, tmp_path):
    monkeypatch.delenv(fork_server.SERVER_ENV, raising=False)
    entrypoint = "inner_loop.member.entry:program"

    def spec(model: str) -> MemberSpec:
        return MemberSpec(run_id="r", generation=0, index=0, seed=0, params=[], work_dir=str(tmp_path / model),
                          inner={"model": load_group("model", model)})

    gpu_members = HostedPrograms()
    gpu_members.ensure(entrypoint, [spec("qwen3_1_7b")])  # native numerics: nothing to share
    assert fork_server.SERVER_ENV not in os.environ
    gpu_members.close()
    hosted = HostedPrograms()
    hosted.ensure(entrypoint, [spec("tiny")])
    path = os.environ[fork_server.SERVER_ENV]
    hosted.ensure(entrypoint, [spec("tiny")])
    assert os.environ[fork_server.SERVER_ENV] == path, "one server for the launcher's life"
    wait_until(lambda: os.path.exists(path), scaled(120), "the launcher's fork server to listen")
    hosted.close()
    assert fork_server.SERVER_ENV not in os.environ and not os.path.exists(path)


def _digest(work_dir: Path) -> dict[str, str]:
    """Every file a member wrote whose bytes are its result (weights, completions), by content."""
    found = {}
    for path in sorted(work_dir.rglob("*")):
        if path.is_file() and path.suffix in (".safetensors", ".jsonl"):  # not training_args.bin: it names the dir
            found[str(path.relative_to(work_dir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.mark.slow
def test_a_member_forked_from_the_server_trains_bit_for_bit_as_a_fresh_one(server, tmp_path, monkeypatch):
    inner = {"task": load_group("task", "arith"), "model": load_group("model", "tiny"),
             "divergence": load_group("divergence", "neural_mirror"), "train": load_group("train", "default")}
    inner["train"].update(steps=4)
    forked_children = []
    start_forked = fork_server.start_forked

    def spy(module, env):
        child = start_forked(module, env)
        forked_children.append(child)
        return child

    monkeypatch.setattr(fork_server, "start_forked", spy)

    def member(name: str) -> tuple[dict, dict]:
        spec = {"run_id": "fork", "generation": 0, "index": 0, "seed": 1, "params": [],
                "work_dir": str(tmp_path / name), "inner": inner}
        record = train_member(spec, save_final=True)
        assert record.status == "ok", record
        results = {"fitness": record.fitness, "mean_response_tokens": record.mean_response_tokens,
                   "steps_done": record.steps_done, "completions": record.generation.get("completions_sha256")}
        return results, _digest(tmp_path / name)

    forked = member("forked")
    assert forked_children and forked_children[-1] is not None, "the member was forked from the server"
    monkeypatch.delenv(fork_server.SERVER_ENV)
    fresh = member("fresh")
    assert forked_children[-1] is None, "the second member started a fresh interpreter"
    assert forked[1] and forked[0]["completions"], "the member saved its weights and its completions' digest"
    assert forked == fresh


def test_variables_a_vllm_import_leaves_in_the_environment_do_not_stop_the_server_serving(server, child_dir,
                                                                                           monkeypatch):
    # what vLLM's import sets in an orchestrator that validated a config with TRL (cv2 the library path)
    for key, value in {"VLLM_LOGGING_LEVEL": "ERROR", "TORCHINDUCTOR_COMPILE_THREADS": "1",
                       "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TRITON_CACHE_AUTOTUNING": "1",
                       "LD_LIBRARY_PATH": str(child_dir)}.items():
        monkeypatch.setenv(key, value)
    code, report = _run({})
    assert code == 0 and report["torch_loaded_at_start"]
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")  # read by torch at import: another interpreter's settings
    code, report = _run({})
    assert code == 0 and not report["torch_loaded_at_start"]


def test_an_extensions_directory_on_the_callers_pythonpath_is_importable_in_the_forked_child(server, child_dir,
                                                                                          monkeypatch):
    extension = child_dir / "extension"
    extension.mkdir()
    (extension / "fork_extension_task.py").write_text("NAME = 'from the extension'\n")
    (child_dir / "fork_child_ext.py").write_text(CHILD.replace(
        "sys.stdout.write(json.dumps(report))",
        "import fork_extension_task\nreport['extension'] = fork_extension_task.NAME\nsys.stdout.write(json.dumps(report))"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(extension)])))
    code, out = pinned_child.run_pinned_child("fork_child_ext", {})
    report = json.loads(out)
    assert code == 0 and report["torch_loaded_at_start"] and report["extension"] == "from the extension"
    (extension / "torch.py").write_text("")  # would shadow the torch the server imported: a fresh interpreter
    code, out = pinned_child.run_pinned_child("fork_child_ext", {})
    assert code == 0 and not json.loads(out)["torch_loaded_at_start"]


def test_a_status_that_arrived_with_the_pid_is_the_childs_exit_status(server, child_dir):
    # a child that ends at once: its pid and its status can reach the caller in one read, and the status read with
    # the pid's line must be the one reported (not lost, which reads as a child killed)
    import socket

    ours, waiters = socket.socketpair()
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    lifeline_read, lifeline_write = os.pipe()
    waiters.close()  # the waiter said everything and ended
    child = fork_server.ForkedChild(ours, 123456789, stdin_write, stdout_read, lifeline_write,
                                    unread=b'{"returncode": 5}\n')
    assert child.wait(timeout=scaled(5)) == 5
    for fd in (stdin_read, stdin_write, stdout_read, stdout_write, lifeline_read):
        os.close(fd)
    (child_dir / "fork_child_quick.py").write_text("import os\nos._exit(5)\n")
    assert [pinned_child.run_pinned_child("fork_child_quick", {})[0] for _ in range(10)] == [5] * 10

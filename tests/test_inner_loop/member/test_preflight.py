"""Pre-flight (inner_loop/member/preflight.py): on the member's node, before any data or model is read, the sandbox runs a
program that forks under its real limits, the staged files are readable and the checkpoint directory has room; a
failure names the node and the cause, ends the job without a result (so the init is not charged) and, on SLURM, sends
the member to another node (``--exclude``)."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inner_loop.member import preflight
from inner_loop.sandbox import isolation
from inner_loop.member.preflight import PreflightError, check_room, checkpoint_bytes, run_preflight
from results.store.layout import PREFLIGHT_FILE, RESULT_FILE
from results.store.node_failure import node_name
from core.records import NODE_FAILED, ResultRecord
from sandbox_programs import fork_counter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HOST = socket.gethostname()


def _inner(sandbox: dict | None = None, model: dict | None = None) -> dict:
    return {"task": {"name": "mbpp", "train_file": str(FIXTURES / "mbpp_train.jsonl"),
                     "test_file": str(FIXTURES / "mbpp_test.jsonl"), "validation_size": 1, "sandbox": sandbox or {}},
            "model": model or {"name": "tiny"}}


def test_a_sandbox_whose_programs_cannot_fork_fails_the_preflight_naming_the_node(tmp_path):
    assert not isinstance(PreflightError("x"), Exception)  # passes every `except Exception` to end the job
    with pytest.raises(PreflightError) as caught:
        run_preflight(_inner(sandbox={"max_processes": 1}), tmp_path, member=False)
    message = str(caught.value)
    assert message.startswith(f"pre-flight failed on node {HOST}: a program that forks 2 processes failed")
    assert "max_processes=1" in message and platform.release() in message


def test_a_member_records_its_failure_and_a_later_pass_clears_it(tmp_path):
    with pytest.raises(PreflightError):
        run_preflight(_inner(sandbox={"max_processes": 1}), tmp_path)
    failure = json.loads((tmp_path / PREFLIGHT_FILE).read_text())
    assert failure["host"] == HOST and "forks" in failure["cause"]
    run_preflight(_inner(), tmp_path)  # the task's own limits: the same probe passes here
    assert not (tmp_path / PREFLIGHT_FILE).exists()


def test_an_unreadable_staged_file_fails_the_preflight(tmp_path):
    model = tmp_path / "snapshot"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").symlink_to(tmp_path / "blobs" / "gone")  # a hub cache whose blob is missing
    with pytest.raises(PreflightError, match=f"on node {HOST}: the staged file .*model.safetensors is not readable"):
        run_preflight(_inner(model={"name": "hub", "name_or_path": str(model)}), tmp_path / "work", member=False)


def test_a_checkpoint_directory_without_room_fails_and_the_need_follows_the_weights(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert check_room(tmp_path / "not" / "yet", free // 2) == ""  # the nearest existing parent is asked
    assert "GiB free, a checkpoint of this run needs about" in check_room(tmp_path, free + (1 << 30))
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    (model / "tokenizer.json").write_bytes(b"\0" * 10**6)  # not weights
    full = {"model": {"name": "hub", "name_or_path": str(model)}}
    lora = {"model": {"name": "hub", "name_or_path": str(model), "lora_r": 8}}
    assert checkpoint_bytes(full, [model]) == 5000 + preflight.ROOM_MARGIN_BYTES
    assert checkpoint_bytes(lora, [model]) == 500 + preflight.ROOM_MARGIN_BYTES


def test_before_5_14_the_process_limit_counts_every_thread_of_the_user(monkeypatch):
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        own = len(os.listdir(f"/proc/{os.getpid()}/task"))
        assert isolation.user_tasks(os.getuid()) >= own >= 4
        monkeypatch.setattr(platform, "release", lambda: "4.18.0-513.el8.x86_64")
        assert isolation.nproc_base(True, os.getuid()) >= own  # the limit leaves room for the user's threads
        note = preflight.nproc_note(32)
        assert "older than 5.14" in note and "every thread of the sandbox's user" in note
        assert int(note.split(" now)")[0].split()[-1]) >= own
        monkeypatch.setattr(platform, "release", lambda: "5.14.0-362.el9.x86_64")
        assert "per user namespace" in preflight.nproc_note(32)
        assert isolation.nproc_base(True, os.getuid()) == 0  # counted per namespace: the program's alone
        assert isolation.nproc_base(False, os.getuid()) >= own  # no namespace of its own: every kernel counts all
    finally:
        stop.set()
        for thread in threads:
            thread.join()


#: a member's training process as the process limit sees it: many threads (torch's), one process
BUSY_MEMBER = """
import threading, time
stop = threading.Event()
for _ in range({threads}):
    threading.Thread(target=stop.wait, daemon=True).start()
print("busy", flush=True)
time.sleep(300)
"""
FORK_COUNT = fork_counter(200, child_sleep_s=30) + "raise SystemExit(1)\n"


def test_a_node_busy_with_the_users_members_passes_and_a_fork_bomb_is_still_stopped(monkeypatch):
    """The accounting of a kernel before 5.14 (RLIMIT_NPROC over every task of the user on the node), reproduced on any
    kernel by a sandbox without its own user namespace: two members of the same user with 40 threads each. A fixed
    limit of max_processes (or one raised by the user's process count, not its threads) broke every fork and excluded
    a healthy node; raised by the user's tasks at each run, the probe forks and a fork bomb still stops near
    max_processes."""
    from inner_loop.sandbox import pool as pool_module
    from inner_loop.sandbox.pool import SandboxConfig, SandboxPool

    monkeypatch.setattr(pool_module, "probe_isolation",
                        lambda *args: isolation.Isolation(False, "simulating the whole-user count of kernels < 5.14"))
    config = SandboxConfig(max_processes=32, workers=1)
    busy = [subprocess.Popen([config.interpreter(), "-c", BUSY_MEMBER.format(threads=40)], stdout=subprocess.PIPE,
                             text=True, **isolation.run_as_kwargs(config.sandbox_uid)) for _ in range(2)]
    try:
        for member in busy:
            assert member.stdout.readline().strip() == "busy"
        assert isolation.user_tasks(config.run_uid()) > 80 > 32  # the user's tasks alone exceed max_processes
        assert preflight.check_sandbox(config) == ""  # the pre-flight's fork probe passes: the node is kept
        pool = SandboxPool(config)
        try:
            outcome = pool.run(FORK_COUNT, ["assert True"], timeout_s=20.0)
        finally:
            pool.close()
        forked = int(outcome.stderr_tail.split("forked")[-1].split()[0])
        assert 0 < forked <= 32 + 8, outcome  # max_processes, give or take what the user's others did meanwhile
    finally:
        for member in busy:
            member.kill()
            member.wait()


def test_a_member_that_fails_its_preflight_ends_without_a_result(tmp_path, monkeypatch):
    """Through the job wrapper: no result.json (nothing charged to the init), the node and cause in its work dir."""
    from launch.member import run_member
    from meta.compose import compose
    from core.records import MemberSpec

    raw = compose(["task=mbpp", f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}",
                   f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}", "task.validation_size=1",
                   "+task.sandbox.max_processes=1", "model.cpu_numerics=native"])
    spec = MemberSpec(run_id="r", generation=0, index=0, seed=0, params=[0.0] * 380, work_dir=str(tmp_path / "m"),
                      inner={n: raw[n] for n in ("task", "model", "divergence", "train")})
    with pytest.raises(PreflightError, match=f"on node {HOST}"):
        run_member("inner_loop.member.entry:train_member", spec.to_dict(), timeout_s=0)
    assert not (tmp_path / "m" / RESULT_FILE).exists()
    assert json.loads((tmp_path / "m" / PREFLIGHT_FILE).read_text())["host"] == HOST


def test_a_pinned_child_that_failed_its_preflight_fails_its_parent_the_same_way(tmp_path, monkeypatch):
    """The tiny preset trains in a pinned child process: its pre-flight failure must not become an ordinary error
    (a failed record, charged) in the job's process."""
    import inner_loop.member.entry as member_entry

    def child_failing_preflight(module: str, payload: dict, **_: object) -> tuple[int, None]:
        work_dir = Path(payload["spec"]["work_dir"])
        work_dir.mkdir(parents=True)
        (work_dir / PREFLIGHT_FILE).write_text(json.dumps({"host": "node7", "cause": "no room"}))
        return 1, None

    monkeypatch.setattr(member_entry.pinned_child, "run_pinned_child", child_failing_preflight)
    with pytest.raises(PreflightError, match="pre-flight failed on node node7: no room"):
        member_entry._train_in_pinned_child({"work_dir": str(tmp_path / "m")}, save_final=False)


def unfit_node_member(spec: object) -> None:
    """The entry point of the runner test below: a member whose node fails its pre-flight every time."""
    work_dir = Path(spec.work_dir)  # type: ignore[attr-defined]
    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / "calls.log").open("a") as log:
        log.write("call\n")
    preflight.record_node_failure(work_dir, "no room")  # what run_preflight keeps of a failed check
    raise PreflightError(preflight.failure_message("node9", "no room"))


def test_a_member_whose_node_fails_preflight_is_resubmitted_then_given_up_without_a_crash(tmp_path):
    """Lost, not failed: resubmitted at most max_lost_resubmits times, then node_failed with the node and the reason
    (the nodes' failure, never charged to the init); the in-process debug launcher survives the BaseException."""
    from launch.factory import build_launcher
    from launch.runner import MemberArrayRunner, RunnerPolicy
    from core.records import MemberSpec

    spec = MemberSpec(run_id="t", generation=0, index=0, seed=0, params=[0.0] * 380, work_dir=str(tmp_path / "m"))
    launcher = build_launcher({"name": "debug", "cls": "launch.local.launchers:DebugLauncher"})
    policy = RunnerPolicy(retries=0, timeout_s=30, max_lost_resubmits=2)
    records = MemberArrayRunner(launcher, f"{__name__}:unfit_node_member", [spec], {}, lambda jobs: None,
                                tmp_path / "submitit", policy).run()
    assert records[0].status == NODE_FAILED and "after 3 submissions" in records[0].error
    assert "no room" in records[0].error and socket.gethostname() in records[0].error
    assert (tmp_path / "m" / "calls.log").read_text().count("call") == 3


def node_fails_for_member_1(spec: object) -> ResultRecord:
    """The entry point of the search test below: member 1's node cannot run it (no usable GPU, say); the others score
    by their index."""
    work_dir = Path(spec.work_dir)  # type: ignore[attr-defined]
    if spec.index == 1:  # type: ignore[attr-defined]
        preflight.record_node_failure(work_dir, "no usable GPU")
        raise PreflightError(preflight.failure_message(socket.gethostname(), "no usable GPU"))
    return ResultRecord(status="ok", fitness=0.1 * (1 + spec.index), val_size=10)  # type: ignore[attr-defined]


def test_a_member_no_node_could_run_is_left_out_of_the_update_not_charged(tmp_path):
    from meta.search.run import main
    from results.store.run_store import RunStore

    run_dir = tmp_path / "search"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=debug", f"inner.entrypoint={__name__}:node_fails_for_member_1",
                 "population=4", "generations=1", "control_member=false", "reevaluate.top_k=0",
                 "launcher.max_lost_resubmits=1", "fitness_on_failure=-5"]) == 0
    store = RunStore(run_dir)
    members = store.read_members().set_index("index")
    assert members.loc[1, "status"] == NODE_FAILED
    assert members["fitness_used"].isna().tolist() == [False, True, False, False]  # not told fitness_on_failure
    generation = store.read_generations().iloc[0]
    assert (generation["node_failed"], generation["failed"]) == (1, 0)
    assert generation["mean_fitness"] == pytest.approx((0.1 + 0.3 + 0.4) / 3)


def test_the_failure_names_the_node_as_slurm_does_not_the_full_host_name(tmp_path, monkeypatch):
    """Many clusters' host names are full domain names unknown to slurm.conf: ``sbatch --exclude`` refuses them
    ("Invalid node name specified"). The record keeps SLURMD_NODENAME, the name SLURM gave the node."""
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu017.cluster.example.org")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu017")
    preflight.record_node_failure(tmp_path, "no room")
    assert json.loads((tmp_path / PREFLIGHT_FILE).read_text())["host"] == "gpu017"
    assert "on node gpu017:" in preflight.preflight_failure(tmp_path)
    monkeypatch.delenv("SLURMD_NODENAME")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu018")  # one plain name: the job's node
    assert node_name() == "gpu018"
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[018-019]")  # not one name: the host's
    assert node_name() == "gpu017.cluster.example.org"


def _fake_nvidia_smi(directory: Path, mode: str) -> Path:
    """An nvidia-smi on PATH answering the compute-mode query as a node whose GPU is in ``mode`` would; it records
    its arguments (the GPU it was asked about)."""
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\necho "$@" > "{directory}/args"\necho "{mode}"\n')
    tool.chmod(0o755)
    return directory


@pytest.mark.parametrize("mode, mps, refused", [("Exclusive_Process", False, True), ("Exclusive_Process", True, False),
                                                ("Default", False, False), ("Prohibited", False, True)])
def test_two_members_on_an_exclusive_process_gpu_are_refused_before_any_trains(tmp_path, monkeypatch, mode, mps,
                                                                               refused):
    """EXCLUSIVE_PROCESS without MPS: the second member on the card could not create its CUDA context and would fail
    at build_trainer every time; the pre-flight refuses the node first, naming the key and the fix."""
    tools = _fake_nvidia_smi(tmp_path / "bin", mode)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    pipes = tmp_path / "mps"
    pipes.mkdir()
    if mps:
        (pipes / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    shared = {**_inner(), "gpus": 1, "members_per_gpu": 2}
    if refused:
        with pytest.raises(PreflightError, match=f"compute mode is {mode}.*resources.members_per_gpu=1"):
            run_preflight(shared, tmp_path / "m", probe_sandbox=False)
        assert "members_per_gpu=2" in json.loads((tmp_path / "m" / PREFLIGHT_FILE).read_text())["cause"]
    else:
        run_preflight(shared, tmp_path / "m", probe_sandbox=False)
    assert (tools / "args").read_text().split()[0] == "--id=1"  # the member's own GPU was asked about
    run_preflight({**_inner(), "gpus": 1}, tmp_path / "alone", probe_sandbox=False)  # one member per GPU: any mode
    with pytest.raises(PreflightError) if refused else contextlib.nullcontext():  # the submitting host, local members
        run_preflight(shared, tmp_path / "host", probe_sandbox=True, member=False)
    run_preflight(shared, tmp_path / "login", probe_sandbox=False, member=False)  # SLURM's login node: not its GPUs

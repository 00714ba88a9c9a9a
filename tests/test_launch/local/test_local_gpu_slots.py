"""launcher=local gives each member in flight its own GPU (issue 37, item 1), checked with GPU ids only.

The members here are gated stand-ins: each records the CUDA_VISIBLE_DEVICES it was handed and when it started,
then waits for the test to release it (a file), then ends as the test chose (ok, failed) or is cancelled while
waiting. The test drives the order through the runner's on_tick, so every step waits on a condition."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from launch.base import JobRef
from launch.local.gpu_slots import cut_slots
from launch.local.launchers import LocalLauncher
from launch.runner import MemberArrayRunner, RunnerPolicy
from results.store.gpu_share import read_gpu_share
from results.store.layout import GPU_SLOTS_FILE
from core.records import MemberSpec
from time_limits import scaled, wait_until

HERE = Path(__file__).resolve().parent  # member processes import this module
TESTS = HERE.parents[1]
ROOT = TESTS.parent
ENTRY = "test_local_gpu_slots:gated_member"
GATE_S = scaled(60.0)  # a gated member that is never released gives up after this long (the test has failed by then)


def _write_end(work: Path) -> None:
    (work / "ended.json").write_text(json.dumps({"end": time.time()}))


def gated_member(member: MemberSpec) -> dict[str, Any]:
    """Member entry point: write seen.json (CUDA_VISIBLE_DEVICES, start time), wait for ``release``, then
    succeed or raise as ``inner.options.fail`` says; ended.json is written however it ends.

    A cancel sends SIGINT twice within milliseconds (to the member, and forwarded by its controller), then SIGKILL
    after 1 s: the end is written by the first SIGINT's handler, which ignores the second, not by a ``finally``
    that the second SIGINT would interrupt."""
    work = Path(member.work_dir)

    def on_sigint(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _write_end(work)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    (work / "seen.json").write_text(json.dumps({"gpus": seen, "start": time.time(), "pid": os.getpid()}))
    try:
        deadline = time.monotonic() + GATE_S
        while not (work / "release").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("never released")
            time.sleep(0.02)
        if member.inner.get("options", {}).get("fail"):
            raise RuntimeError("this member fails on purpose")
        return {"status": "ok", "fitness": 0.5}
    finally:
        if not (work / "ended.json").exists():  # not written by a cancel's SIGINT
            _write_end(work)


def _specs(root: Path, n: int, fail: set[int] = frozenset()) -> list[MemberSpec]:
    specs = []
    for i in range(n):
        work = root / f"member_{i:03d}"
        work.mkdir(parents=True)
        specs.append(MemberSpec(run_id="slots", generation=0, index=i, seed=i, params=[0.0] * 380,
                                work_dir=str(work), inner={"options": {"fail": i in fail}}))
    return specs


def _seen(spec: MemberSpec) -> dict[str, Any] | None:
    path = Path(spec.work_dir) / "seen.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):  # not started, or being written
        return None


def _release(spec: MemberSpec) -> None:
    (Path(spec.work_dir) / "release").touch()


@pytest.fixture
def member_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Member processes import this module; the parent's CUDA_VISIBLE_DEVICES must play no part."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(TESTS), str(ROOT)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    wait_until(condition, timeout, what, interval_s=0.02)


def _run_driven(launcher: LocalLauncher, specs: list[MemberSpec], folder: Path,
                drive: Callable[[MemberArrayRunner], None]) -> dict[int, Any]:
    """The members to their final records, ``drive`` acting on them once per polling round."""
    runner = MemberArrayRunner(launcher, ENTRY, specs, {}, lambda jobs: None, folder,
                               RunnerPolicy(retries=0, timeout_s=scaled(120), result_scan_interval_s=0.05),
                               on_tick=drive)
    try:
        return runner.run()
    finally:
        launcher.close()


def test_members_in_flight_never_share_a_gpu_and_slots_come_back_after_a_failure_and_a_cancel(tmp_path, member_path):
    options = {"gpus_per_node": 1, "visible_gpus": [4, 5, 6], "kill_grace_s": 30}
    LocalLauncher.validate_options(options)
    launcher = LocalLauncher(**options)
    specs = _specs(tmp_path, 5, fail={1})
    checks: dict[str, Any] = {}

    def drive(runner: MemberArrayRunner) -> None:
        """0, 1, 2 fill the three slots; 1 fails -> 3 gets its GPU; 2 is cancelled -> 4 gets its GPU; then all go."""
        seen = {s.index: _seen(s) for s in specs}
        started = {i for i, s in seen.items() if s is not None}
        if "full" not in checks and {0, 1, 2} <= started:
            checks["full"] = sorted(started)  # nothing else can have started: every slot is taken
            _release(specs[1])
        if 3 in started and "after_failure" not in checks:
            checks["after_failure"] = (seen[3]["gpus"], seen[1]["gpus"])
            runner.stop_members([2], "cancelled", "cancelled by the test")
        if 4 in started and "after_cancel" not in checks:
            checks["after_cancel"] = (seen[4]["gpus"], seen[2]["gpus"])
        if "after_cancel" in checks:
            for i in started:
                _release(specs[i])

    final = _run_driven(launcher, specs, tmp_path / "submitit", drive)
    assert {i: r.status for i, r in final.items()} == {0: "ok", 1: "failed", 2: "cancelled", 3: "ok", 4: "ok"}
    assert checks["full"] == [0, 1, 2]
    assert checks["after_failure"][0] == checks["after_failure"][1]  # the failed member's GPU, reused
    assert checks["after_cancel"][0] == checks["after_cancel"][1]  # the cancelled member's GPU, reused
    spans = []
    for spec in specs:
        seen = _seen(spec)
        end = json.loads((Path(spec.work_dir) / "ended.json").read_text())["end"]
        spans.append((seen["start"], end, seen["gpus"]))
    assert {gpus for _, _, gpus in spans} == {"4", "5", "6"}  # every slot used, one GPU each
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "the members never ran at the same time: the test shows nothing"
    assert all(a[2] != b[2] for a, b in overlapping), overlapping
    assert max(sum(1 for s in spans if s[0] <= t[0] < s[1]) for t in spans) <= 3


def test_a_resumed_launcher_keeps_the_slots_of_running_members(tmp_path, member_path):
    options = {"gpus_per_node": 1, "visible_gpus": [0, 1], "kill_grace_s": 30}
    folder = tmp_path / "submitit"
    first = LocalLauncher(**options)
    specs = _specs(tmp_path, 3)
    refs = [ref for part in first.submit_chunks(ENTRY, specs[:2], folder, 120) for ref in part]
    _wait(lambda: all(_seen(s) for s in specs[:2]), "the first two members to start")
    held = json.loads((folder / GPU_SLOTS_FILE).read_text())
    assert sorted(map(tuple, held.values())) == [(0,), (1,)]

    again = LocalLauncher(**options)  # an orchestrator restarted while both members run
    assert again.max_in_flight == 2
    assert list(again.submit_chunks(ENTRY, specs[2:], folder, 120)) == []  # no free slot: nothing submitted
    assert again.gpus_of(refs[0]) == tuple(held[refs[0].job_id])
    _release(specs[0])
    _wait(lambda: not again.is_alive(refs[0]), "the released member's process to end")
    (ref,) = [ref for part in again.submit_chunks(ENTRY, specs[2:], folder, 120) for ref in part]
    _wait(lambda: _seen(specs[2]) is not None, "the third member to start")
    assert _seen(specs[2])["gpus"] == _seen(specs[0])["gpus"] != _seen(specs[1])["gpus"]
    for spec in specs[1:]:
        _release(spec)
    _wait(lambda: not again.alive([refs[1], ref]), "the other members to end")
    first.close()
    again.close()


def test_slots_and_members_at_once_follow_the_visible_gpus_and_array_parallelism():
    assert cut_slots([0, 1, 2, 3], 1) == [(0,), (1,), (2,), (3,)]
    assert cut_slots([0, 1, 2], 2) == [(0, 1)]
    assert LocalLauncher.members_at_once({"gpus_per_node": 1, "visible_gpus": [0, 1, 2, 3]}) == 4
    assert LocalLauncher.members_at_once({"gpus_per_node": 1, "visible_gpus": [0, 1, 2, 3], "array_parallelism": 2}) == 2
    assert LocalLauncher.members_at_once({"gpus_per_node": 0, "array_parallelism": 3}) == 3
    with pytest.raises(ValueError, match="names a GPU twice"):
        LocalLauncher.validate_options({"gpus_per_node": 1, "visible_gpus": [0, 0]})


def test_a_member_asking_for_a_gpu_on_a_machine_without_one_is_refused_before_anything_is_written(
        tmp_path, capsys, monkeypatch):
    from meta.search.run import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    run_dir = tmp_path / "run"
    synth = ["new=true", "inner.entrypoint=meta.synthetic:member", "population=2", "generations=1", "resources.gpus=1"]
    assert main([f"run_dir={run_dir}", *synth]) == 2
    assert "launcher.gpus_per_node=1 (resources.gpus) asks for a GPU per member" in capsys.readouterr().err
    assert not run_dir.exists()


def test_the_plan_says_how_many_members_run_at_once_on_their_own_gpus(tmp_path, capsys, monkeypatch):
    from meta.search.run import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this process sees no GPU (also on a GPU machine)
    synth = ["new=true", "inner.entrypoint=meta.synthetic:member", "population=8", "resources.gpus=1", "dry_run=true",
             "launcher.visible_gpus=[0,1,2,3]"]
    assert main([f"run_dir={tmp_path / 'plan'}", *synth]) == 0
    out = capsys.readouterr().out
    assert "4 processes at once" in out and "at once: 4 GPUs" in out and "one of [0, 1, 2, 3]" in out
    assert main([f"run_dir={tmp_path / 'plan'}", *synth, "launcher.array_parallelism=2"]) == 0
    assert "at once: 2 GPUs" in capsys.readouterr().out
    assert main([f"run_dir={tmp_path / 'plan'}", *synth[:-1], "launcher.visible_gpus=[]"]) == 0
    assert "WARNING: no GPU" in capsys.readouterr().out  # a real run refuses (above); the plan warns


def test_a_job_ref_from_another_folder_loads_that_folders_slots(tmp_path):
    folder = tmp_path / "submitit"
    folder.mkdir()
    (folder / GPU_SLOTS_FILE).write_text(json.dumps({"123": [1]}))
    launcher = LocalLauncher(gpus_per_node=1, visible_gpus=[0, 1])
    assert launcher.gpus_of(JobRef(job_id="123", folder=str(folder))) == (1,)


def test_with_two_members_per_gpu_each_slot_takes_a_pair_and_the_members_know_their_partner(tmp_path, member_path):
    """resources.members_per_gpu=2 (issue 38): two GPUs take four members at once, consecutive members (an
    antithetic pair) on the same GPU, never three on one; a member's end frees its place for the next one, and each
    member's gpu_share.json names its GPU and partner."""
    options = {"gpus_per_node": 1, "visible_gpus": [0, 1], "kill_grace_s": 30, "members_per_gpu": 2}
    LocalLauncher.validate_options(options)
    assert LocalLauncher.members_at_once(options) == 4
    launcher = LocalLauncher(**options)
    specs = _specs(tmp_path, 5)
    checks: dict[str, Any] = {}

    def drive(runner: MemberArrayRunner) -> None:
        seen = {s.index: _seen(s) for s in specs}
        started = {i for i, s in seen.items() if s is not None}
        if "full" not in checks and {0, 1, 2, 3} <= started:
            checks["full"] = sorted(started)
            checks["pairs"] = [(seen[0]["gpus"], seen[1]["gpus"]), (seen[2]["gpus"], seen[3]["gpus"])]
            _release(specs[2])
        if 4 in started and "next" not in checks:
            checks["next"] = (seen[4]["gpus"], seen[2]["gpus"])
            for i in started:
                _release(specs[i])

    final = _run_driven(launcher, specs, tmp_path / "submitit", drive)
    assert all(r.status == "ok" for r in final.values()) and len(final) == 5
    assert checks["full"] == [0, 1, 2, 3]
    assert checks["pairs"] == [("0", "0"), ("1", "1")]
    assert checks["next"][0] == checks["next"][1] == "1"  # member 2's place on GPU 1, beside member 3
    shares = {s.index: read_gpu_share(s.work_dir) for s in specs}
    assert shares[0]["gpus"] == "0" and shares[0]["shared_with"] == [1] and shares[1]["shared_with"] == [0]
    assert shares[3]["shared_with"] == [2, 4] and shares[4]["shared_with"] == [3]
    with pytest.raises(ValueError, match="members_per_gpu=3"):
        LocalLauncher.validate_options({**options, "members_per_gpu": 3})

"""scripts/gpu_pass.py, the pass over a short GPU allocation: a command cut at any point keeps what it measured, and
a second call measures only the rest; the budget stops it cleanly; each setting's GPU-hours are the search plan's.
The bench is a stand-in (tests/standin_bench.py) with the real one's command line and output."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin_bench.py"
#: the bench settings the pass measures, in its order (the stand-in's compiled cache is the slower: dynamic is shared)
SETTINGS = ["hf_generate x1", "hf_generate_persistent_compiled x1", "hf_generate_static_compiled x1", "hf_generate x2",
            "hf_generate x4"]


def pass_command(record: Path, work: Path, budget_min: float = 10.0) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "gpu_pass.py"), "--device", "cpu", "--only", "bench", "--bench",
            str(STANDIN), "--record", str(record), "--work", str(work), "--budget-min", str(budget_min)]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


@pytest.mark.parametrize("seed", [0, 1])
def test_a_pass_cut_anywhere_is_finished_by_a_second_call_without_measuring_anything_twice(tmp_path, seed):
    rng = random.Random(seed)
    cut_during = rng.randint(1, len(SETTINGS))  # the setting under way when the command is killed
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    env = {**os.environ, "STANDIN_CALLS": str(calls_file), "STANDIN_SLEEP": "1.0"}
    first = subprocess.Popen(pass_command(record, tmp_path / "w1"), cwd=ROOT, env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(calls(calls_file)) >= cut_during or first.poll() is not None, 120,
                 f"setting {cut_during} to start")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # what a command limit does: everything, mid-measurement
        first.communicate()
    kept = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    assert len(kept) == cut_during - 1, (cut_during, kept)  # each finished setting was recorded as it ended
    before = calls(calls_file)

    second = subprocess.run(pass_command(record, tmp_path / "w2"), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    again = calls(calls_file)[len(before):]
    assert again == SETTINGS[cut_during - 1:]  # the cut one and the rest; nothing measured is measured again
    final = {e["check"]: e for e in map(json.loads, record.read_text().splitlines())}
    assert set(final) == {"bench:dynamic:x1", "bench:persistent_compiled:x1", "bench:static_compiled:x1",
                          "bench:faster:x2", "bench:faster:x4"}
    assert {e["status"] for e in final.values()} == {"pass"}
    assert final["bench:faster:x2"]["figures"]["cache"] == "dynamic"  # the faster lone member's cache is shared
    # the summary: per setting its figures and the 180 x 15 search's GPU-hours as the dry-run plan counts them; the
    # preset's own measurements (15.0 s/step; x1.183 with two per GPU) give the figures docs/gpus.md states
    rows = {line.split()[0] + " " + line.split()[1]: line for line in second.stdout.splitlines()
            if line.startswith(("dynamic x", "persistent_compiled x", "static_compiled x"))}
    assert rows["dynamic x1"].split()[-1] == "18,890"
    assert rows["dynamic x2"].split()[-1] == "11,174"
    assert float(rows["dynamic x2"].split()[8]) == pytest.approx(1.183)  # slowdown column
    # a compiled cache ran 8 timed steps (a per-step recompile or recording shows), the dynamic one 3
    assert {k: e["figures"]["steps"] for k, e in final.items() if k.endswith(":x1")} == {
        "bench:dynamic:x1": 4, "bench:persistent_compiled:x1": 9, "bench:static_compiled:x1": 9}
    # the presets' decode cache from those figures: the stand-in's compiled caches are slower, so dynamic stays
    assert "decode_cache=persistent_compiled: 0.97x the dynamic cache's step" in second.stdout
    assert "does not meet the rule (>= 1.5x)" in second.stdout
    assert "keep train.decode_cache: dynamic" in second.stdout


def test_a_compiled_cache_measured_faster_by_the_rule_is_what_the_pass_says_to_set(tmp_path):
    """Issue 47's decision: on by default where the lone member steps >= 1.5x faster on the card, with the plan's
    step time from the measurement; the faster cache is then the one the sharing settings use."""
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    env = {**os.environ, "STANDIN_CALLS": str(calls_file), "STANDIN_PERSISTENT_STEP_S": "6.0", "STANDIN_SLEEP": "0"}
    done = subprocess.run(pass_command(record, tmp_path / "w"), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "decode_cache=persistent_compiled: 2.50x the dynamic cache's step" in done.stdout
    assert "decode_cache=static_compiled: 0.94x" in done.stdout
    assert ("-> conf/experiment/mbpp_qwen3.yaml: train.decode_cache: persistent_compiled; resources.step_time_s: 6.0"
            in done.stdout)
    assert calls(calls_file)[3:] == ["hf_generate_persistent_compiled x2", "hf_generate_persistent_compiled x4"]
    rows = {line.split()[0] + " " + line.split()[1]: line for line in done.stdout.splitlines()
            if line.startswith(("dynamic x", "persistent_compiled x"))}
    assert int(rows["persistent_compiled x1"].split()[-1].replace(",", "")) < int(
        rows["dynamic x1"].split()[-1].replace(",", "")) / 2  # 2.5x less GPU time for the search


def test_the_budget_stops_the_pass_before_a_check_it_cannot_finish(tmp_path):
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    env = {**os.environ, "STANDIN_CALLS": str(calls_file)}
    done = subprocess.run(pass_command(record, tmp_path / "w", budget_min=0.5), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]  # incomplete: call again
    assert not calls(calls_file) and not record.exists()  # nothing started, nothing recorded as measured
    assert "not started" in done.stderr and "not run" in done.stdout


def member_pids(marker: str) -> list[int]:
    """Live processes whose command line names ``marker``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


def test_a_bench_stopped_at_the_budget_takes_its_members_with_it(tmp_path):
    """The pass stops a check with SIGTERM to its process group; the bench's members run in sessions of their own
    (so a late one can be killed with its sandbox workers), so the bench must end them itself: on the GPU, a member
    left running by a cut first call would have shared the card with the second call's measurement."""
    work = tmp_path / "bench"
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "bench_member_gpu.py"), "--device", "cpu", "--members", "1", "--backends",
         "hf_generate", "--steps", "5000", "--tokenizer", "tiny", "--work-dir", str(work), "--no-isolation",
         "--layers", "2", "--hidden", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "64", "--intermediate",
         "256", "--vocab", "512", "--group-size", "2", "--batch-size", "4", "--completion-length", "8", "--dtype",
         "float32", "--threads", "1"], cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    marker = str(work / "hf_generate-x1" / "job-0.json")
    try:
        wait_for(lambda: member_pids(marker) or bench.poll() is not None, 300, "the member to start")
        assert member_pids(marker), "the bench ended before its member started"
        os.killpg(bench.pid, signal.SIGTERM)  # what scripts/gpu_pass.py sends first at its budget
        bench.wait(timeout=60)
        wait_for(lambda: not member_pids(marker), 30, "the member to end with its bench")
    finally:
        for pid in member_pids(marker):
            os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)


def test_a_compiled_decode_step_recorded_again_at_every_step_fails_its_setting(tmp_path):
    """The compiled decode step must replay its CUDA graph; one recorded again at each step (new cache addresses, a
    moved weight) costs its recording every step, which a short bench would show only as a slower step."""
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    env = {**os.environ, "STANDIN_CALLS": str(calls_file), "STANDIN_RERECORD": "1"}
    command = pass_command(record, tmp_path / "w")
    command[command.index("bench")] = "bench:persistent_compiled"
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    entry = json.loads(record.read_text().splitlines()[-1])
    assert entry["status"] == "fail" and "CUDA graph recordings over 9 generations" in entry["detail"]
    # measured anyway: its step is shown beside the verdict, which rules it out of the presets' decision
    command[command.index("bench:persistent_compiled")] = "bench:dynamic,bench:persistent_compiled"
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert ("decode_cache=persistent_compiled: failed on this machine's CPU (not a measurement), 0.97x the dynamic "
            "cache's step (15.50 s/step): not a candidate") in done.stdout
    assert "keep train.decode_cache: dynamic" in done.stdout

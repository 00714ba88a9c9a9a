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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_pass  # noqa: E402  (scripts/gpu_pass.py, for its plan and its rules)
from time_limits import scaled, wait_until  # noqa: E402

STANDIN = ROOT / "tests" / "standin_bench.py"
#: the bench settings the pass measures, in its order: the compiled cache that decides the presets first, then its
#: baseline (the stand-in's compiled cache is the slower: dynamic is shared); static_compiled is not measured
SETTINGS = ["hf_generate_persistent_compiled x1", "hf_generate x1", "hf_generate x2", "hf_generate x4"]


def pass_command(record: Path, work: Path, budget_min: float = 10.0) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "gpu_pass.py"), "--device", "cpu", "--only", "bench", "--bench",
            str(STANDIN), "--record", str(record), "--work", str(work), "--budget-min", str(budget_min)]


def calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def run_pass(tmp_path: Path, only: str, *extra: str, **standin: str) -> subprocess.CompletedProcess:
    """The pass over the checks ``only`` names, with the stand-in bench (its $STANDIN_* settings) on the CPU; its
    record is tmp_path/pass.jsonl and the stand-in's calls tmp_path/calls.txt."""
    env = {**os.environ, "STANDIN_CALLS": str(tmp_path / "calls.txt"), **standin}
    command = pass_command(tmp_path / "pass.jsonl", tmp_path / "w")
    command[command.index("bench")] = only
    return subprocess.run([*command, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=scaled(120))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_pass_cut_anywhere_is_finished_by_a_second_call_without_measuring_anything_twice(tmp_path, seed):
    rng = random.Random(seed)
    cut_during = rng.randint(1, len(SETTINGS))  # the setting under way when the command is killed
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    env = {**os.environ, "STANDIN_CALLS": str(calls_file), "STANDIN_SLEEP": "1.0"}
    first = subprocess.Popen(pass_command(record, tmp_path / "w1"), cwd=ROOT, env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: len(calls(calls_file)) >= cut_during or first.poll() is not None, 120,
                 f"setting {cut_during} to start")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # what a command limit does: everything, mid-measurement
        first.communicate()
    kept = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    assert len(kept) == cut_during - 1, (cut_during, kept)  # each finished setting was recorded as it ended
    before = calls(calls_file)

    second = subprocess.run(pass_command(record, tmp_path / "w2"), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=scaled(300))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    again = calls(calls_file)[len(before):]
    assert again == SETTINGS[cut_during - 1:]  # the cut one and the rest; nothing measured is measured again
    final = {e["check"]: e for e in map(json.loads, record.read_text().splitlines())}
    assert set(final) == {"bench:dynamic:x1", "bench:persistent_compiled:x1", "bench:faster:x2", "bench:faster:x4"}
    assert {e["status"] for e in final.values()} == {"pass"}
    assert final["bench:faster:x2"]["figures"]["cache"] == "dynamic"  # the faster lone member's cache is shared
    # the summary: per setting its figures and the 180 x 15 search's GPU-hours as the dry-run plan counts them; the
    # preset's own measurements (15.0 s/step; x1.183 with two per GPU) give the figures docs/gpus.md states
    rows = {line.split()[0] + " " + line.split()[1]: line for line in second.stdout.splitlines()
            if line.startswith(("dynamic x", "persistent_compiled x", "static_compiled x"))}
    assert rows["dynamic x1"].split()[9] == "18,890"
    assert rows["dynamic x2"].split()[9] == "11,174"
    assert float(rows["dynamic x2"].split()[8]) == pytest.approx(1.183)  # slowdown column
    # the step's generation beside it (the rest is what a faster decode cannot save), and what a member held with its
    # CUDA context
    assert float(rows["dynamic x1"].split()[10]) == pytest.approx(12.0)
    assert float(rows["dynamic x1"].split()[6]) == pytest.approx(13.0)
    # a compiled cache ran 5 timed steps (a per-step recompile or recording shows), the dynamic one 2
    assert {k: e["figures"]["steps"] for k, e in final.items() if k.endswith(":x1")} == {
        "bench:dynamic:x1": 3, "bench:persistent_compiled:x1": 6}
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
                          timeout=scaled(300))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "decode_cache=persistent_compiled: 2.50x the dynamic cache's step" in done.stdout
    assert "static_compiled" not in done.stdout  # not measured: its CUDA graphs are recorded at every step
    assert ("-> conf/experiment/mbpp_qwen3.yaml: train.decode_cache: persistent_compiled; resources.step_time_s: 6.0"
            in done.stdout)
    assert calls(calls_file)[2:] == ["hf_generate_persistent_compiled x2", "hf_generate_persistent_compiled x4"]
    rows = {line.split()[0] + " " + line.split()[1]: line for line in done.stdout.splitlines()
            if line.startswith(("dynamic x", "persistent_compiled x"))}
    assert int(rows["persistent_compiled x1"].split()[9].replace(",", "")) < int(
        rows["dynamic x1"].split()[9].replace(",", "")) / 2  # 2.5x less GPU time for the search


def test_the_budget_stops_the_pass_before_a_check_it_cannot_finish(tmp_path):
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    env = {**os.environ, "STANDIN_CALLS": str(calls_file)}
    done = subprocess.run(pass_command(record, tmp_path / "w", budget_min=0.5), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=scaled(120))
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
        wait_until(lambda: member_pids(marker) or bench.poll() is not None, 300, "the member to start")
        assert member_pids(marker), "the bench ended before its member started"
        os.killpg(bench.pid, signal.SIGTERM)  # what scripts/gpu_pass.py sends first at its budget
        bench.wait(timeout=scaled(60))
        wait_until(lambda: not member_pids(marker), 30, "the member to end with its bench")
    finally:
        for pid in member_pids(marker):
            os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)


def test_a_compiled_decode_step_recorded_again_at_every_step_fails_its_setting(tmp_path):
    """The compiled decode step must replay its CUDA graph; one recorded again at each step (new cache addresses, a
    moved weight) costs its recording every step, which a short bench would show only as a slower step."""
    record = tmp_path / "pass.jsonl"
    done = run_pass(tmp_path, "bench:persistent_compiled", STANDIN_RERECORD="1")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    entry = json.loads(record.read_text().splitlines()[-1])
    assert entry["status"] == "fail" and "CUDA graph recordings over 6 generations" in entry["detail"]
    # measured anyway: its step is shown beside the verdict, which rules it out of the presets' decision
    done = run_pass(tmp_path, "bench:dynamic,bench:persistent_compiled", STANDIN_RERECORD="1")
    assert ("decode_cache=persistent_compiled: failed on this machine's CPU (not a measurement), 0.97x the dynamic "
            "cache's step (15.50 s/step): not a candidate") in done.stdout
    assert "keep train.decode_cache: dynamic" in done.stdout


def documented_call(marker: str) -> list[str]:
    """The arguments of the gpu_pass.sh command docs/gpus.md gives in its command block, found by ``marker``."""
    import shlex

    line = next(line for line in (ROOT / "docs" / "gpus.md").read_text().splitlines()
                if "scripts/gpu_pass.sh" in line and marker in line)
    words = shlex.split(line)
    return words[words.index("scripts/gpu_pass.sh") + 1:]


def _documented_pass(tmp_path, marker: str, keys: list[str]):  # noqa: ANN001, ANN202
    """docs/gpus.md's call naming ``marker``, its record moved under tmp_path: (args, budget, record, calls file);
    the call is at most 9 minutes, runs ``keys`` in that order, and every line fits its minutes."""
    args = documented_call(marker)
    budget = float(args[args.index("--budget-min") + 1])
    assert budget <= 9.0
    record, calls_file = tmp_path / "pass.jsonl", tmp_path / "calls.txt"
    args[args.index("--record") + 1] = str(record)
    needs = {c.key: c.least_min for c in gpu_pass.checks(gpu_pass.parse_args(args))}
    assert list(needs) == keys
    assert sum(needs.values()) + gpu_pass.SUMMARY_RESERVE_S / 60 <= budget  # every line fits the call
    return args, budget, record, calls_file


def test_the_documented_one_call_returns_the_deciding_figures_within_its_minutes(tmp_path):
    """docs/gpus.md's one call: the compiled cache first, then its baseline, then two members on the faster cache, each
    started within the budget (the lines' minutes fit the call's), in the order --only names them; run here with
    the stand-in bench on the CPU, as it runs on the card."""
    args, budget, record, calls_file = _documented_pass(
        tmp_path, "--only bench:persistent_compiled,bench:dynamic,bench:faster:x2 ",
        ["bench:persistent_compiled:x1", "bench:dynamic:x1", "bench:faster:x2"])
    env = {**os.environ, "STANDIN_CALLS": str(calls_file), "STANDIN_PERSISTENT_STEP_S": "6.0", "STANDIN_SLEEP": "0"}
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_pass.py"), *args, "--device", "cpu", "--bench",
                           str(STANDIN)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget * 60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - began < budget * 60
    assert calls(calls_file) == ["hf_generate_persistent_compiled x1", "hf_generate x1",
                                 "hf_generate_persistent_compiled x2"]
    assert "-> conf/experiment/mbpp_qwen3.yaml: train.decode_cache: persistent_compiled" in done.stdout
    # the logs of each setting stay beside the record
    entries = [json.loads(line) for line in record.read_text().splitlines()]
    assert all(Path(e["figures"]["logs"]["bench"]).is_file() for e in entries)
    assert all(Path(e["figures"]["logs"]["bench"]).is_relative_to(tmp_path / "pass.jsonl.logs") for e in entries)
    # the second call the docs give for what was cut: nothing of the first is measured again
    second = documented_call(",cuda_tests,acceptance ")
    assert second[second.index("--only") + 1].startswith(args[args.index("--only") + 1] + ",")


def test_only_runs_the_checks_in_the_order_it_names_them(tmp_path):
    done = run_pass(tmp_path, "bench:dynamic,bench:persistent_compiled", STANDIN_SLEEP="0")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert calls(tmp_path / "calls.txt") == ["hf_generate x1", "hf_generate_persistent_compiled x1"]


@pytest.mark.parametrize("steps_before, status", [(0, "cut"), (2, "fail")])
def test_a_bench_stopped_at_its_limit_is_cut_while_compiling_and_failed_while_stepping(tmp_path, steps_before, status):
    """A setting past its minutes x the margin is stopped. Before any member ended a step, it was building the model
    or compiling cold: not a final failure (a second call, with inductor's cache warm, measures it). After, its steps
    were slower than it needs: a failure, kept."""
    limit = ("--bench-minutes", "bench:persistent_compiled:x1=0.05")  # stopped at 0.05 x 1.3 min = 3.9 s
    done = run_pass(tmp_path, "bench:persistent_compiled", *limit, STANDIN_HANG_AFTER_STEPS=str(steps_before))
    entry = json.loads((tmp_path / "pass.jsonl").read_text().splitlines()[-1])
    assert entry["status"] == status, entry
    assert done.returncode == (3 if status == "cut" else 1), done.stdout[-2000:] + done.stderr[-2000:]
    if status == "cut":
        assert "before its first step ended" in entry["detail"]
        again = run_pass(tmp_path, "bench:persistent_compiled", *limit)  # the second call: compiled, it steps
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert calls(tmp_path / "calls.txt") == ["hf_generate_persistent_compiled x1"] * 2
        assert list((tmp_path / "w").glob("bench_persistent_compiled_x1.cut-*"))  # the cut call's logs are kept
    else:
        assert "slower than it needs" in entry["detail"]


def test_a_misnamed_bench_setting_in_bench_minutes_is_refused_naming_the_settings(tmp_path):
    done = subprocess.run([*pass_command(tmp_path / "r.jsonl", tmp_path / "w"), "--bench-minutes", "bench:dynamic=3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 2 and "bench:dynamic:x1" in done.stderr and not (tmp_path / "r.jsonl").exists()


def test_the_sharing_rule_counts_what_the_members_held_not_their_peak_allocation():
    """persistent_compiled: the static KV cache and the CUDA graph pool stay held through the backward; two members
    whose peak allocations (2 x 28 GiB) fit 75% of an 80 GB card may not fit once their holds (2 x 31 GiB) and CUDA
    contexts are counted, and the card's own peak (nvidia-smi) counts where it is higher."""
    gib = 2**30
    runs = [{"peak_memory_bytes": 28 * gib, "peak_gpu_reserved_bytes": 31 * gib}] * 2
    assert gpu_pass.held_bytes(runs[0]) == 31 * gib + gpu_pass.CONTEXT_ALLOWANCE_BYTES
    assert gpu_pass.held_bytes({"peak_memory_bytes": 28 * gib}) == 28 * gib  # measured before issue 53: its allocation
    assert gpu_pass.card_held_bytes(runs, None) == 2 * (31 * gib + gpu_pass.CONTEXT_ALLOWANCE_BYTES)
    assert gpu_pass.card_held_bytes(runs, 70 * gib) == 70 * gib
    row = {"setting": "persistent_compiled x2", "members": 2, "scaling": 1.7, "peak_gib_total": 56.0,
           "held_gib_total": gpu_pass.card_held_bytes(runs, None) / gib}
    assert "does not meet" in gpu_pass.sharing_verdict(row, 79.2)  # 64 GiB held > 59.4; the allocations alone fit
    assert gpu_pass.sharing_verdict({**row, "held_gib_total": 56.0}, 79.2).startswith("persistent_compiled x2: meets")


def test_the_documented_owned_loop_call_runs_its_three_lines_within_its_minutes(tmp_path):
    """docs/gpus.md's one call for the owned decode loop: the loop alone, the LoRA merge alone, two members on the
    loop, each started within the budget, with the stand-in bench on the CPU; the loop's decode counts are checked,
    and its lone member's profiled step (the named ranges, 16 token steps) is recorded and printed."""
    args, budget, record, calls_file = _documented_pass(
        tmp_path, "--only loop:owned_loop:x1,loop:persistent_merged:x1,loop:owned_loop:x2 ",
        ["loop:owned_loop:x1", "loop:persistent_merged:x1", "loop:owned_loop:x2"])
    env = {**os.environ, "STANDIN_CALLS": str(calls_file), "STANDIN_SLEEP": "0"}
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_pass.py"), *args, "--device", "cpu", "--bench",
                           str(STANDIN)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget * 60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - began < budget * 60
    assert calls(calls_file) == ["hf_generate_owned_loop x1", "hf_generate_persistent_merged x1",
                                 "hf_generate_owned_loop x2"]
    entries = {e["check"]: e for e in map(json.loads, record.read_text().splitlines())}
    assert all(e["status"] == "pass" for e in entries.values()), entries
    assert entries["loop:owned_loop:x1"]["figures"]["decode_counts"][0]["recordings"] == 1
    profile = entries["loop:owned_loop:x1"]["figures"]["profile"]
    assert profile["decode_window"]["tokens"] == 16 and profile["ranges"]["rewards_wait"]["calls"] == 1
    assert not any(e["figures"].get("profile") for k, e in entries.items() if k != "loop:owned_loop:x1")
    printed = done.stdout[done.stdout.index("loop:owned_loop:x1: one step profiled"):]
    for name in ("generate", "rewards", "rewards_wait", "reference_forward", "policy_forward", "backward", "optimizer",
                 "prepare_inputs"):  # each range's line: calls, host s, own s, device s, busy s, syncs
        assert any(line.split()[:1] == [name] and len(line.split()) >= 7 for line in printed.splitlines()), name
    assert ("16 token steps of the owned loop, per token: 1.400 ms in the captured step, 0.050 ms eager, 0.350 ms "
            "idle") in printed

"""Each member's result.json is written exactly once, by one writer (results.store.member_files.write_final_result).

The entry point records its own outcome where it can (train_in_process: a single run has no wrapper, and it deletes
checkpoints only once the record is durable); the job wrapper (launch/member.run_member) and the seed group then
keep that record instead of writing it again, and write one themselves only for what the entry point could not
record: an exception it let through, the wall limit, a used-up budget, an entry point that only returns its record.
Writes are counted where they land: an atomic write ends in os.replace, an exclusive create in os.link.
"""
from __future__ import annotations

import ast
import logging
import os
import time
from pathlib import Path

import pytest

from conf_groups import load_group
from launch.member import run_member
from results.store.layout import RESULT_FILE, archived_result_name, seed_dir_name
from core.records import MEMBER_SEEDS_KEY, ResultRecord
from results.store.member_files import read_result, write_result
from time_limits import scaled

ROOT = Path(__file__).resolve().parents[3]
SELF_RECORDING = f"{__name__}:self_recording_entry"
# Tiny and untrained (no warm-up): the run needs its stages to happen, not a model that answers.
TINY = {"warmup_max_steps": 0, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


@pytest.fixture
def result_writes(monkeypatch) -> list[Path]:
    """Every path a result.json was put at during the test, in order."""
    writes: list[Path] = []
    real_replace, real_link = os.replace, os.link

    def replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if Path(dst).name == RESULT_FILE:
            writes.append(Path(dst))

    def link(src, dst, *args, **kwargs):
        real_link(src, dst, *args, **kwargs)
        if Path(dst).name == RESULT_FILE:
            writes.append(Path(dst))

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    return writes


def self_recording_entry(spec):
    """An entry point that records its own outcome as train_in_process does (result.json first, then returns it).

    Options: ``fail_seeds`` raise before recording for these seeds, ``failed_seeds`` record `failed` for them (as
    train_in_process records its own failures); ``after_writing`` "raise" or "hang" once the record is written (a crash
    or the wall limit while the member settles its checkpoints)."""
    options = spec.inner.get("options", {})
    calls = Path(spec.work_dir) / "calls.log"
    calls.parent.mkdir(parents=True, exist_ok=True)
    with calls.open("a") as log:
        log.write("call\n")
    if spec.seed in options.get("fail_seeds", ()):
        raise RuntimeError(f"injected failure on seed {spec.seed}")
    record = ResultRecord(status="ok", fitness=0.25 + 0.01 * spec.seed, val_size=4, steps_done=2, wall_time_s=1.5)
    if spec.seed in options.get("failed_seeds", ()):
        record = ResultRecord(status="failed", error="training: loss is nan", steps_done=1, wall_time_s=1.5)
    write_result(spec.work_dir, record)
    if options.get("after_writing") == "raise":
        raise OSError("could not delete a checkpoint")
    if options.get("after_writing") == "hang":
        while True:
            time.sleep(0.05)
    return record


def _spec(tmp_path: Path, attempt: int = 0, seeds: list[int] | None = None, **options) -> dict:
    inner = {"options": options}
    if seeds:
        inner[MEMBER_SEEDS_KEY] = seeds
    return {"run_id": "t", "generation": 0, "index": 0, "seed": 0, "params": [0.02] * 380,
            "work_dir": str(tmp_path / "member_000"), "inner": inner, "attempt": attempt}


def _calls(work_dir: Path) -> int:
    path = work_dir / "calls.log"
    return path.read_text().count("\n") if path.exists() else 0


def _tiny_inner() -> dict:
    inner = {"task": load_group("task", "arith"), "model": {**load_group("model", "tiny"), **TINY},
             "divergence": load_group("divergence", "prob_l2"), "train": load_group("train", "default")}
    inner["train"].update({"steps": 1, "batch_size": 8, "group_size": 4, "save_every": 1, "val_size": 8,
                           "max_completion_length": 4})
    return inner


def test_an_ok_member_run_through_the_wrapper_writes_its_result_once(tmp_path, result_writes):
    """The issue's case: train_in_process wrote result.json and the wrapper wrote the same record again."""
    spec = {"run_id": "t", "generation": 0, "index": 0, "seed": 0, "params": [], "work_dir": str(tmp_path / "m"),
            "inner": _tiny_inner()}
    out = run_member("inner_loop.member.lifecycle:train_in_process", spec, timeout_s=0)
    assert out["status"] == "ok", out["error"]
    assert result_writes == [tmp_path / "m" / RESULT_FILE]
    assert read_result(tmp_path / "m").to_dict() == out
    again = run_member("inner_loop.member.lifecycle:train_in_process", spec, timeout_s=0)
    assert again == out  # final: never run or written again
    assert result_writes == [tmp_path / "m" / RESULT_FILE]


def test_a_single_run_without_the_wrapper_still_writes_its_result_once(tmp_path, result_writes):
    """`python -m inner_loop.run` calls train_in_process directly: the member's own write is its only one."""
    from inner_loop.member.lifecycle import train_in_process

    spec = {"run_id": "single", "generation": 0, "index": 0, "seed": 0, "params": [],
            "work_dir": str(tmp_path / "run"), "inner": _tiny_inner()}
    record = train_in_process(spec)
    assert record.ok, record.error
    assert result_writes == [tmp_path / "run" / RESULT_FILE] and read_result(tmp_path / "run") == record


def test_a_self_recording_entry_points_record_is_kept_not_rewritten(tmp_path, result_writes):
    spec = _spec(tmp_path)
    out = run_member(SELF_RECORDING, spec, timeout_s=scaled(10))
    assert out["status"] == "ok" and out["fitness"] == pytest.approx(0.25) and out["wall_time_s"] == 1.5
    assert result_writes == [tmp_path / "member_000" / RESULT_FILE]


def test_an_entry_point_that_only_returns_its_record_gets_it_written_by_the_wrapper(tmp_path, result_writes):
    spec = _spec(tmp_path)
    out = run_member("meta.synthetic:member", spec, timeout_s=scaled(10))
    assert out["status"] == "ok" and out["wall_time_s"] > 0
    assert result_writes == [tmp_path / "member_000" / RESULT_FILE]
    assert read_result(spec["work_dir"]).to_dict() == out


@pytest.mark.parametrize("entry, options, timeout_s, status, text", [
    (SELF_RECORDING, {"fail_seeds": [0]}, 10, "failed", "injected failure on seed 0"),
    ("meta.synthetic:member", {"nan_fitness": [0]}, 10, "failed", "non-finite fitness"),
    ("meta.synthetic:member", {"hang": [0]}, 0.3, "timeout", "inner.timeout_s"),
    ("no_such_module:member", {}, 10, "failed", "cannot import module"),
])
def test_an_outcome_the_entry_point_could_not_record_is_written_once_by_the_wrapper(
        tmp_path, result_writes, entry, options, timeout_s, status, text):
    spec = _spec(tmp_path, **options)
    out = run_member(entry, spec, timeout_s=timeout_s)
    assert out["status"] == status and text in out["error"], out
    assert result_writes == [tmp_path / "member_000" / RESULT_FILE]
    assert read_result(spec["work_dir"]).to_dict() == out


def test_a_used_up_running_time_budget_is_written_once_without_calling_the_entry_point(tmp_path, result_writes):
    spec = _spec(tmp_path)
    work = Path(spec["work_dir"])
    work.mkdir(parents=True)
    now = time.time()
    (work / "started.json").write_text(
        f'{{"attempt": 0, "started_at": {now - 60}, "used_before_s": 0.0, "used_s": 5.0, '
        f'"updated_at": {now - 50}, "running": false}}')
    out = run_member(SELF_RECORDING, spec, timeout_s=4.0)
    assert out["status"] == "timeout" and "used up" in out["error"] and _calls(work) == 0
    assert result_writes == [work / RESULT_FILE]


@pytest.mark.parametrize("after_writing, timeout_s, ended_as", [("raise", 10, "failed"), ("hang", 0.3, "timeout")])
def test_a_record_the_entry_point_wrote_stands_when_its_run_then_fails(tmp_path, result_writes, caplog, after_writing,
                                                                       timeout_s, ended_as):
    """A member that recorded `ok` and then crashed or ran out of time while settling its checkpoints did finish:
    the wrapper keeps its record (rewriting it as failed/timeout would retry a finished member) and says so."""
    spec = _spec(tmp_path, after_writing=after_writing)
    with caplog.at_level(logging.WARNING, logger="launch.member"):
        out = run_member(SELF_RECORDING, spec, timeout_s=timeout_s)
    assert out["status"] == "ok" and read_result(spec["work_dir"]).to_dict() == out
    assert result_writes == [tmp_path / "member_000" / RESULT_FILE]
    assert f"recorded ok before the run ended as {ended_as}" in caplog.text


def test_a_member_on_several_seeds_writes_each_result_once(tmp_path, result_writes):
    spec = _spec(tmp_path, seeds=[7, 8])
    out = run_member(SELF_RECORDING, spec, timeout_s=scaled(10))
    work = tmp_path / "member_000"
    assert out["status"] == "ok" and out["fitness"] == pytest.approx(0.25 + 0.075)
    assert result_writes == [work / seed_dir_name(0) / RESULT_FILE, work / seed_dir_name(1) / RESULT_FILE,
                             work / RESULT_FILE]


def test_a_seed_that_recorded_its_own_failure_fails_the_member_with_one_write_each(tmp_path, result_writes):
    work = tmp_path / "member_000"
    out = run_member(SELF_RECORDING, _spec(tmp_path, seeds=[7, 8], failed_seeds=[8]), timeout_s=scaled(10))
    assert out["status"] == "failed" and out["error"] == "seed 1 (seed=8): training: loss is nan"
    assert result_writes == [work / seed_dir_name(0) / RESULT_FILE, work / seed_dir_name(1) / RESULT_FILE,
                             work / RESULT_FILE]
    assert read_result(work / seed_dir_name(1)).error == "training: loss is nan"


def test_a_failed_seed_fails_the_member_once_and_a_retry_runs_only_the_seeds_left(tmp_path, result_writes):
    work = tmp_path / "member_000"
    first = run_member(SELF_RECORDING, _spec(tmp_path, seeds=[7, 8], fail_seeds=[8]), timeout_s=scaled(10))
    assert first["status"] == "failed" and "injected failure on seed 8" in first["error"]
    assert result_writes == [work / seed_dir_name(0) / RESULT_FILE, work / RESULT_FILE]
    assert read_result(work / seed_dir_name(1)) is None  # nothing recorded: the retry runs this seed again
    # the runner's retry: the attempt's record moved aside, the member submitted again under the next attempt
    os.replace(work / RESULT_FILE, work / archived_result_name(0))
    result_writes.clear()
    retry = run_member(SELF_RECORDING, _spec(tmp_path, attempt=1, seeds=[7, 8]), timeout_s=scaled(10))
    assert retry["status"] == "ok"
    assert _calls(work / seed_dir_name(0)) == 1 and _calls(work / seed_dir_name(1)) == 2
    assert result_writes == [work / seed_dir_name(1) / RESULT_FILE, work / RESULT_FILE]


def requeued_entry(spec):
    """Ends like a SLURM run that submitit requeues (SystemExit from its signal handler)."""
    raise SystemExit(-1)


def test_a_requeued_run_writes_no_result_so_its_next_run_resumes(tmp_path, result_writes):
    spec = _spec(tmp_path)
    with pytest.raises(SystemExit):
        run_member(f"{__name__}:requeued_entry", spec, timeout_s=scaled(10))
    assert result_writes == [] and read_result(spec["work_dir"]) is None
    assert run_member(SELF_RECORDING, spec, timeout_s=scaled(10))["status"] == "ok"
    assert result_writes == [tmp_path / "member_000" / RESULT_FILE]


def test_members_write_their_result_through_the_one_writer():
    """write_result is the primitive under write_final_result; no module of the packages calls it directly (tests
    and the store itself may), so no path can write a member's result.json a second time."""
    users = []
    for package in ("core", "meta", "launch", "inner_loop", "mirror_maps", "results", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "results" / "store" / "member_files.py":
                continue
            tree = ast.parse(path.read_text(), str(path))
            names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
            names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                      for alias in node.names}
            names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
            if "write_result" in names:
                users.append(str(path.relative_to(ROOT)))
    assert users == []

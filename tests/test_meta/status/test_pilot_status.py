"""``python -m meta.status`` on a pilot run dir (meta/pilot/status.py): a real pilot of synthetic members, finished
and, in a copy, as a pilot in flight shows it (a run running, one failed, one queued, one not submitted); a pilot
killed before its plan; --watch; and exit 2 for a directory that is neither a search, a tuning nor a pilot."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from meta.pilot.cli import main as pilot_main
from meta.status.view import main as status_main, render
from core.records import ResultRecord
from results.store.member_files import write_result
from results.store.run_store import RunStore, read_jobs_file, write_jobs_file
from test_meta_status import RUNNING_MEMBER, _child  # a process holding a run's ledger at step 3 of 10

#: 2 combinations (coef 0.5 and 1.0) x 2 seeds x (centre + 1 pair x 2) = 12 runs: 000-005 and 006-011
PILOT = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "pilot.seeds=2", "pilot.pairs=1",
         "pilot.coefs=[0.5,1.0]", "resources.gpus=1", "+inner.options={slope: 1.0, param_noise: 0.05}"]


@pytest.fixture(scope="module")
def pilot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("status") / "pilot"
    assert pilot_main([f"run_dir={run_dir}", "new=true", *PILOT]) == 0
    return run_dir


def _copy(pilot: Path, to: Path) -> RunStore:
    """The finished pilot copied, its plan's work dirs pointing into the copy."""
    shutil.copytree(pilot, to)
    store = RunStore(to)
    plan = store.read_pilot_plan()
    for member in plan["members"]:
        member["work_dir"] = str(to / Path(member["work_dir"]).relative_to(pilot))
    store.write_pilot_plan(plan)
    return store


def _rows(text: str) -> dict[str, str]:
    """The run lines by run index."""
    return {line.split()[1]: line for line in text.splitlines() if line.startswith("  run ")}


def test_a_finished_pilot_shows_every_run_final_and_its_findings(pilot, capsys):
    text = render(pilot)
    assert f"pilot run {pilot}: 2 combination(s) x 2 seeds x (centre + 1 antithetic pair(s)) = 12 runs" in text
    assert "orchestrator: not running" in text
    assert "combination 0: radius 0.1 (es.radius), divergence.coef 0.5: 6/6 final (6 ok)" in text
    assert "combination 1: radius 0.1 (es.radius), divergence.coef 1: 6/6 final (6 ok)" in text
    assert "all runs: 12/12 final (12 ok) | GPU time 0.00 h | done" in text
    assert f"findings: {RunStore(pilot).pilot_path}" in text
    assert not _rows(text)  # nothing in flight: the runs only with --all
    rows = _rows(render(pilot, show_all=True))
    assert sorted(rows) == [f"{i:03d}" for i in range(12)]
    assert rows["000"].split()[2:6] == ["centre", "seed", "0", "ok"] and "fitness 0." in rows["000"]
    assert rows["003"].split()[2:7] == ["pair", "0", "+", "seed", "1"]
    assert rows["010"].split()[2:7] == ["pair", "0", "-", "seed", "0"]
    assert status_main([f"run_dir={pilot}", "--all"]) == 0
    assert "run 011 pair 0 - seed 1" in capsys.readouterr().out


def test_a_pilot_in_flight_shows_each_runs_state_and_the_counts(pilot, tmp_path):
    store = _copy(pilot, tmp_path / "pilot")
    store.pilot_path.unlink()  # not every run is final: no findings yet
    plan = store.read_pilot_plan()
    work = {m["index"]: Path(m["work_dir"]) for m in plan["members"]}
    jobs_path = store.pilot_runs_dir / "jobs.json"
    jobs = read_jobs_file(jobs_path)
    # combination 1, as the files of a live pilot show it: run 006 running (a real process keeps its ledger), 007
    # failed after 30 minutes on its GPU, 008 submitted and waiting in the queue, 009 not submitted yet
    for index in (6, 8, 9):
        (work[index] / "result.json").unlink()
    (work[7] / "started.json").unlink()
    write_result(work[7], ResultRecord(status="failed", error="RuntimeError: CUDA out of memory", wall_time_s=1800.0))
    jobs[8] = {**jobs[8], "job_id": "1008"}
    del jobs[9]
    write_jobs_file(jobs_path, jobs)
    member = _child(RUNNING_MEMBER, work[6], "ready")
    try:
        text = render(store.root)
    finally:
        member.kill()
        member.wait()
    assert "combination 0: radius 0.1 (es.radius), divergence.coef 0.5: 6/6 final (6 ok) | GPU time 0.00 h" in text
    assert ("combination 1: radius 0.1 (es.radius), divergence.coef 1: 3/6 final "
            "(1 failed, 1 not submitted, 2 ok, 1 queued, 1 running) | GPU time 0.50 h") in text
    rows = _rows(text)
    assert sorted(rows) == [f"{i:03d}" for i in range(6, 12)]  # the finished combination's runs only with --all
    assert "running" in rows["006"] and "step 3/10, reward 0.250, grad share 0.05" in rows["006"]
    assert "failed" in rows["007"] and "CUDA out of memory" in rows["007"]
    assert "ran 30m00s, 0.50 GPU-h" in rows["007"]  # a failed run is over: it ran, it is not running
    assert "queued" in rows["008"] and "job 1008" in rows["008"]
    assert "not submitted" in rows["009"]
    assert "ok" in rows["010"] and "fitness 0." in rows["010"]
    # ETA: the running run's 7 steps at 2 s, then the two waiting ones in one wave of the finished runs' median
    assert "all runs: 9/12 final (1 failed, 1 not submitted, 8 ok, 1 queued, 1 running) | GPU time 0.50 h | ETA 0m14s" \
        in text
    assert "findings: complete once every run is final" in text


def test_a_pilot_killed_before_its_plan_says_so(pilot, tmp_path):
    early, finished = RunStore(tmp_path / "early"), RunStore(pilot)
    early.root.mkdir()
    shutil.copy(finished.config_path, early.config_path)
    shutil.copy(finished.manifest_path, early.manifest_path)
    text = render(early.root)
    assert "no pilot_plan.json yet" in text and "orchestrator: not running" in text


def test_watch_refreshes_until_interrupted(pilot, capsys, monkeypatch):
    def interrupt(seconds: float) -> None:
        assert seconds == 5.0
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupt)
    assert status_main([f"run_dir={pilot}", "--watch", "5"]) == 0
    assert capsys.readouterr().out.count("all runs: 12/12 final") == 1


def test_neither_a_search_a_tuning_nor_a_pilot_exits_2(pilot, tmp_path, capsys):
    assert status_main([f"run_dir={tmp_path / 'nothing'}"]) == 2
    assert "not a search, tuning or pilot directory (no config.yaml)" in capsys.readouterr().err
    other = RunStore(tmp_path / "other")
    other.root.mkdir()
    shutil.copy(RunStore(pilot).config_path, other.config_path)
    other.write_manifest({"kind": "export"})
    assert status_main([str(other.root)]) == 2
    assert "its manifest says kind 'export'; meta.status shows a search, a tuning" in capsys.readouterr().err

"""meta.tune end to end on this machine with the synthetic run (meta/tune/synthetic.py): the study in a real store,
objective values, pruning, failures, resume after SIGKILL at random points, lost trials, export and report."""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from meta.tune.cli import main
from meta.tune.synthetic import quality, score
from meta.tune.trials import plan_trial, run_seed, trial_dir, write_trial
from results.store.member_files import read_intermediate, read_result
from results.store.layout import JOURNAL_FILE, STUDY_FILE, TRIAL_FILE
from results.store.study_store import LOST_ATTR, SAVED_ATTR, SLOT_ATTR, load_study
from helpers import wait_for_file
from time_limits import scaled

ROOT = Path(__file__).resolve().parents[3]
SYNTH = ["inner.entrypoint=meta.tune.synthetic:run", "tune.sampler=random", "tune.pruner=none"]


def _expected(params: dict, seeds: int, noise: float, steps: int = 60) -> float:
    q = quality(params["divergence.coef"], params["train.learning_rate"], {})
    return statistics.fmean(score(q, steps, steps, random.Random(run_seed(0, k)).gauss(0.0, noise))
                            for k in range(seeds))


def _counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if not t.user_attrs.get(LOST_ATTR)]


def test_a_tuning_finishes_and_its_journal_study_opens_with_plain_optuna(tmp_path):
    run_dir = tmp_path / "run"
    args = [f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=local", "tune.trials=4", "tune.parallel=2", "tune.seeds=2",
            "+inner.options={step_s: 0.005, noise: 0.02}"]
    assert main(args) == 0
    path = str(run_dir / JOURNAL_FILE)
    storage = optuna.storages.JournalStorage(JournalFileBackend(path))
    (name,) = optuna.study.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    for t in study.trials:
        assert t.value == pytest.approx(_expected(t.params, 2, 0.02), abs=1e-12)
        plan = json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())
        records = [read_result(m["work_dir"]) for m in plan["members"]]
        assert [r.status for r in records] == ["ok", "ok"]
        assert {m["inner"]["eval_split"] for m in plan["members"]} == {"validation"}  # the test split never
        assert t.user_attrs["run_values"] == [r.fitness for r in records]
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE


def test_an_sqlite_study_store_works_and_opens_with_optuna(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=3", f"tune.storage={url}",
                 "tune.study_name=coef_lr", "+inner.options={step_s: 0.0}"]) == 0
    study = optuna.load_study(study_name="coef_lr", storage=url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3


def test_a_new_run_may_not_take_over_another_runs_study(tmp_path, capsys):
    """Refused before anything is written: a run dir left behind would resume straight into the other study."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    args = [*SYNTH, "launcher=debug", "tune.trials=2", f"tune.storage={url}", "+inner.options={step_s: 0.0}"]
    assert main([f"run_dir={tmp_path / 'first'}", "new=true", *args, "tune.study_name=coef_lr"]) == 0
    capsys.readouterr()
    assert main([f"run_dir={tmp_path / 'other'}", "new=true", *args, "tune.study_name=coef_lr"]) == 2
    assert "tune.study_name=coef_lr: the storage" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()

    # a run dir whose study.json names another run's study (edited by hand, or copied): its resume is refused
    assert main([f"run_dir={tmp_path / 'second'}", "new=true", *args, "tune.study_name=second"]) == 0
    study_file = tmp_path / "second" / STUDY_FILE
    study_file.write_text(study_file.read_text().replace('"second"', '"coef_lr"'))
    capsys.readouterr()
    assert main([f"run_dir={tmp_path / 'second'}", "new=true", "tune.trials=3"]) == 2
    assert "belongs to run" in capsys.readouterr().err
    assert len(optuna.load_study(study_name="coef_lr", storage=url).trials) == 2


def test_pruning_stops_runs_early_and_records_the_running_time_it_saved(tmp_path):
    run_dir = tmp_path / "run"
    args = [f"run_dir={run_dir}", "new=true", "inner.entrypoint=meta.tune.synthetic:run", "tune.sampler=random",
            "launcher=local", "tune.trials=6", "tune.parallel=2", "tune.pruner=median",
            "tune.pruner_options={n_startup_trials: 1}", "train.steps=40", "train.eval_every=4",
            "+inner.options={step_s: 0.08}"]
    assert main(args) == 0
    study = load_study(run_dir)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, [(t.number, t.state, t.intermediate_values) for t in study.trials]
    for t in pruned:
        assert t.user_attrs[SAVED_ATTR] > 0
        assert t.intermediate_values and t.value == t.intermediate_values[max(t.intermediate_values)]
        plan = json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())
        for member in plan["members"]:
            record = read_result(member["work_dir"])
            assert record.status == "pruned" and "pruned by tune.pruner=median" in record.error
            progress = json.loads((Path(member["work_dir"]) / "progress.json").read_text())
            assert progress["step"] < 40  # stopped before its last step
    assert sum(1 for t in study.trials if t.state == TrialState.COMPLETE) + len(pruned) == 6


def test_a_complete_trial_carries_every_intermediate_score_even_if_its_runs_ended_between_scans(tmp_path):
    """The median pruner judges a trial against the intermediate scores of COMPLETE trials: a run that finishes
    within one scan of the tuner must still leave all its scores in the study (they were missing, so whether a
    later trial was pruned depended on timing)."""
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=3", "tune.parallel=1",
                 "tune.seeds=2", "train.steps=6", "train.eval_every=2", "+inner.options={step_s: 0.0}"]) == 0
    study = load_study(run_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    for t in study.trials:
        plan = json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())
        series = [read_intermediate(m["work_dir"]) for m in plan["members"]]
        assert sorted(t.intermediate_values) == [2, 4]
        assert t.intermediate_values == pytest.approx({step: statistics.fmean(s[step] for s in series)
                                                      for step in (2, 4)}, abs=1e-12)


def test_a_run_that_fails_fails_its_trial_stops_its_sibling_and_counts(tmp_path):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=local", "tune.trials=5", "tune.seeds=2", "retries=0",
                 "+inner.options={step_s: 0.01, fail_above_coef: 0.01}"]) == 0
    study = load_study(run_dir)
    assert len(study.trials) == 5
    for t in study.trials:
        if t.params["divergence.coef"] > 0.01:
            assert t.state == TrialState.FAIL and "synthetic divergence" in t.user_attrs["error"]
        else:
            assert t.state == TrialState.COMPLETE


def _start(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "meta.tune", f"run_dir={run_dir}", "new=true", *extra], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_gives_the_uninterrupted_study(tmp_path):
    args = [*SYNTH, "tune.trials=6", "tune.parallel=2", "+inner.options={step_s: 0.03, count_calls: true}"]
    reference = tmp_path / "reference"
    assert main([f"run_dir={reference}", "new=true", "launcher=debug", *args]) == 0

    run_dir = tmp_path / "killed"
    rng = random.Random(20261124)
    triggers = [(run_dir / "tuning_trials" / "jobs.json", 1.5), (trial_dir(run_dir, 2) / TRIAL_FILE, 0.3),
                (trial_dir(run_dir, 3) / TRIAL_FILE, 2.0), (trial_dir(run_dir, 5) / TRIAL_FILE, 0.5)]
    kills = 0
    for trigger, spread in triggers:
        proc = _start(run_dir, ["launcher=local", *args])
        wait_for_file(trigger, proc)
        time.sleep(rng.uniform(0.0, spread))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 3, "the tuner finished before it could be killed; the test did not test anything"
    final = _start(run_dir, ["launcher=local", *args])
    _, err = final.communicate(timeout=scaled(300))
    assert final.returncode == 0, err.decode()[-3000:]

    got, want = load_study(run_dir), load_study(reference)
    assert not [t for t in got.trials if t.state == TrialState.RUNNING]
    counted = sorted(_counted(got), key=lambda t: t.user_attrs[SLOT_ATTR])
    assert len(counted) == 6, "a trial was counted twice or lost"
    assert [(t.params, t.value, t.state) for t in counted] == \
        [(t.params, t.value, t.state) for t in want.trials]
    for t in counted:  # no run trained twice: re-attached or read, never resubmitted
        plan = json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())
        for member in plan["members"]:
            assert (Path(member["work_dir"]) / "calls.log").read_text().splitlines() == ["attempt 0"]


def test_a_lost_trial_is_failed_and_replaced_by_the_same_draw(tmp_path):
    """Killed between asking the study for a trial and writing its trial.json: on resume the trial is FAIL with the
    reason, not counted, and the slot is drawn again with the same sampler seed (random: the same params)."""
    args = [*SYNTH, "launcher=debug", "+inner.options={step_s: 0.0}"]
    reference = tmp_path / "reference"
    assert main([f"run_dir={reference}", "new=true", "tune.trials=3", *args]) == 0
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "tune.trials=2", *args]) == 0
    study = load_study(run_dir)
    orphan = study.ask()  # what a tuner killed right after its ask leaves behind: RUNNING, no trial.json
    orphan.suggest_float("divergence.coef", 1e-4, 1.0, log=True)
    assert main([f"run_dir={run_dir}", "new=true", "tune.trials=3", *args]) == 0

    study = load_study(run_dir)
    lost = study.trials[orphan.number]
    assert lost.state == TrialState.FAIL and "replaced" in lost.user_attrs[LOST_ATTR]
    counted = _counted(study)
    assert [t.state for t in counted] == [TrialState.COMPLETE] * 3
    assert [(t.params, t.value) for t in counted] == [(t.params, t.value) for t in load_study(reference).trials]


def test_a_running_trial_whose_trial_file_is_damaged_is_failed_naming_the_file_and_replaced(tmp_path, caplog):
    args = [*SYNTH, "launcher=debug", "+inner.options={step_s: 0.0}"]
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "tune.trials=1", *args]) == 0
    study = load_study(run_dir)
    damaged = study.ask()
    damaged.suggest_float("divergence.coef", 1e-4, 1.0, log=True)
    path = trial_dir(run_dir, damaged.number) / TRIAL_FILE
    path.parent.mkdir(parents=True)
    path.write_text('{"number": 1, "members": [')  # a torn write the atomic writer never leaves: disk damage
    with caplog.at_level("WARNING", logger="meta.tune"):
        assert main([f"run_dir={run_dir}", "new=true", "tune.trials=2", *args]) == 0

    study = load_study(run_dir)
    failed = study.trials[damaged.number]
    assert failed.state == TrialState.FAIL
    assert str(path) in failed.user_attrs[LOST_ATTR] and "replaced" in failed.user_attrs[LOST_ATTR]
    assert f"trial {damaged.number}: {path} is unreadable" in caplog.text
    assert [t.state for t in _counted(study)] == [TrialState.COMPLETE] * 2


def test_a_pruned_trial_whose_runs_outlived_the_tuner_is_settled_as_pruned_on_resume(tmp_path):
    run_dir = tmp_path / "run"
    args = [*SYNTH, "launcher=debug", "tune.trials=1", "+inner.options={step_s: 0.0, count_calls: true}"]
    assert main([f"run_dir={run_dir}", "new=true", *args]) == 0
    study = load_study(run_dir)
    done = study.trials[0]
    trial = study.ask()  # told PRUNED, runs never settled: the tuner died between the tell and the cancel
    plan = plan_trial(run_dir, "run", 0, trial.number, 1, dict(done.params), [], 
                      json.loads((trial_dir(run_dir, 0) / TRIAL_FILE).read_text())["members"][0]["inner"], 1)
    write_trial(run_dir, plan)
    study.tell(trial, state=TrialState.PRUNED)
    assert main([f"run_dir={run_dir}", "new=true", *[a for a in args if a != "tune.trials=1"], "tune.trials=2"]) == 0
    record = read_result(plan.specs[0].work_dir)
    assert record.status == "pruned" and "cancelled on resume" in record.error
    assert not (Path(plan.specs[0].work_dir) / "calls.log").exists()
    assert len(load_study(run_dir).trials) == 2


def test_resume_refuses_another_study_but_may_run_more_trials(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [*SYNTH, "launcher=debug", "+inner.options={step_s: 0.0}"]
    assert main([f"run_dir={run_dir}", "new=true", "tune.trials=2", *args]) == 0
    assert main([f"run_dir={run_dir}", "new=true", "tune.trials=2", "tune.space={divergence.coef: [log, 1e-3, 1.0]}",
                 *args]) == 2
    assert "tune.space" in capsys.readouterr().err
    assert main([f"run_dir={run_dir}", "new=true", "tune.trials=3", *args]) == 0
    assert [t.state for t in load_study(run_dir).trials] == [TrialState.COMPLETE] * 3


def test_the_exported_preset_reproduces_the_best_trial_in_inner_loop_and_meta_run(tmp_path):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from meta.compose import CONF_DIR, compose

    run_dir = tmp_path / "run"
    space = "tune.space={divergence: [choice, kl, prob_l2], divergence.coef: [log, 1e-3, 1.0], " \
            "train.learning_rate: [log, 1e-5, 1e-3]}"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=4", space,
                 "+inner.options={step_s: 0.0, bonus: {kl: 0.5}}"]) == 0
    search_path = tmp_path / "presets"
    out = search_path / "experiment" / "tuned.yaml"
    assert main([f"run_dir={run_dir}", "new=true", f"export={out}"]) == 0
    study = load_study(run_dir)
    best = max((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    want = json.loads((trial_dir(run_dir, best.number) / TRIAL_FILE).read_text())["members"][0]["inner"]
    want["train"]["eval_every"] = None
    overrides = ["experiment=tuned", f"hydra.searchpath=[file://{search_path}]"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        single = hydra_compose("inner", overrides=overrides)
    for node in ("task", "model", "divergence", "train"):
        assert dict(single[node]) == want[node], node
        assert compose(overrides)[node] == want[node], node
    assert want["divergence"]["name"] == best.params["divergence"]

    # exporting again gives the same file; a different file at that path is never overwritten
    assert main([f"run_dir={run_dir}", "new=true", f"export={out}"]) == 0
    mine = search_path / "experiment" / "mine.yaml"
    mine.write_text("# @package _global_\ntrain:\n  steps: 3\n")
    assert main([f"run_dir={run_dir}", "new=true", f"export={mine}"]) == 1
    assert mine.read_text() == "# @package _global_\ntrain:\n  steps: 3\n"


def test_the_report_of_a_tune_run_has_the_trials_importances_and_plots(tmp_path, capsys):
    from results.report.search.report import main as report_main

    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=5",
                 "+inner.options={step_s: 0.0}"]) == 0
    out = tmp_path / "report"
    assert report_main([str(run_dir), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "COMPLETE 5" in text and "parameter importances" in text
    assert "divergence.coef:" in text.split("parameter importances")[1]
    import pandas as pd

    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 5 and set(trials["state"]) == {"COMPLETE"}
    for name in ("optimization_history.png", "parallel_coordinate.png", "slice.png", "importances.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    best = json.loads((out / "best.json").read_text())["best"]
    assert best["value"] == trials["value"].max()


def test_a_run_that_fails_once_is_retried_like_an_es_member(tmp_path):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=2", "retries=1",
                 "+inner.options={step_s: 0.0, fail_attempts: 1, count_calls: true}"]) == 0
    study = load_study(run_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for t in study.trials:
        work_dir = Path(json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())["members"][0]["work_dir"])
        assert (work_dir / "calls.log").read_text().splitlines() == ["attempt 0", "attempt 1"]
        assert "transient failure" in json.loads((work_dir / "result.attempt0.json").read_text())["error"]


def test_status_shows_the_trials_the_best_and_a_trial_without_runs(tmp_path):
    from meta.status.view import render

    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=3",
                 "+inner.options={step_s: 0.0}"]) == 0
    study = load_study(run_dir)
    best = max(study.trials, key=lambda t: t.value)
    study.ask()  # a trial asked by a tuner that died before writing its runs down
    text = render(run_dir)
    assert "3 COMPLETE, 1 RUNNING" in text and f"best so far: trial {best.number}, {best.value:.4f}" in text
    assert "trial 3 RUNNING: no trial file" in text
    assert "orchestrator: not running" in text
    full = render(run_dir, show_all=True)
    assert full.count("run 0    ok") == 3


def test_a_storage_that_does_not_open_exits_2_before_anything_is_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "tune.storage=sqlite:////no/such/dir/study.db"]) == 2
    assert "tune.storage=sqlite:////no/such/dir/study.db: cannot open it" in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_tuning_whose_first_trials_all_fail_stops_and_resumes_once_fixed(tmp_path):
    run_dir, needed = tmp_path / "run", tmp_path / "data.txt"
    args = [f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=6", "retries=0",
            f"+inner.options={{step_s: 0.0, fail_unless: {needed}}}"]
    assert main(args) == 1
    study = load_study(run_dir)
    assert [t.state for t in study.trials if t.state != TrialState.RUNNING] == [TrialState.FAIL] * 3
    assert "needs" in study.trials[0].user_attrs["error"]
    needed.write_text("restored")  # the shared cause fixed: the resume goes on from where it stopped
    assert main(args) == 0
    states = [t.state for t in load_study(run_dir).trials]
    assert states.count(TrialState.COMPLETE) == 3 and TrialState.RUNNING not in states


def test_optuna_dashboard_serves_the_journal_study(tmp_path):
    import socket
    import urllib.request

    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=2", "+inner.options={step_s: 0.0}"]) == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", "from optuna_dashboard._cli import main; main()",
                               str(run_dir / JOURNAL_FILE), "--host", "127.0.0.1", "--port", str(port), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, body = time.monotonic() + scaled(60), None
        while body is None:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"optuna-dashboard did not answer within {scaled(60):.0f} s"
            try:
                body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5).read())
            except OSError:
                time.sleep(0.3)
        (summary,) = body["study_summaries"]
        assert summary["study_name"] == load_study(run_dir).study_name
        detail = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}", timeout=5).read())
        assert [t["state"] for t in detail["trials"]] == ["Complete", "Complete"]
    finally:
        server.terminate()
        server.wait(timeout=scaled(30))

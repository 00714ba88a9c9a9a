"""es=nres's plan, selection and progress (issue 59): the dry run prices what the search needs (episodes, the whole-run
generations of equal information, the step-0 validations and the boundary checkpoints' I/O) and warns of an
incomplete last episode; the nominations, "best", meta.status, the report and the plots of an online search read a
particle run's end score at its horizon (a real full-run pass@1) or the averaged centre, never a truncation's change.

The searches run the synthetic member through meta.run (meta/synthetic.py), whose truncations carry their loss through
the particles' checkpoints as a training run carries its weights."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from meta.search.run import main
from plan_inputs import ONE_MEMBER_AT_15S
from results.report.search.online import AVERAGED_CENTER
from results.report.search.run_ends import END_SCORE_COLUMN, EPISODE_COLUMN, TRUNCATION_FITNESS
from results.store.run_store import RunStore

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
H, K = 12, 4  # a particle's run of 12 steps in 3 truncations of 4
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "es=nres", f"train.steps={H}",
         f"es.truncation_steps={K}", "es.radius=0.01", "es.stagger=false", "population=4",
         "+inner.options={unrolled:{floor:0.5}}"]


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in the plan:\n{text}"
    return float(found.group(1).replace(",", ""))


def test_the_mbpp_plan_of_nres_states_its_episodes_the_equal_information_and_the_truncations_io(tmp_path, capsys):
    """The done-when command of issue 59: 180 particles x 32 generations of 100-step truncations of 1600-step runs
    (without the result table, whose eight rows are composed one by one: tests/test_meta/searchers/test_nres.py plans
    them)."""
    assert main(["experiment=mbpp_qwen3", "launcher=slurm", "population=180", "generations=32", "es=nres",
                 "dry_run=true", f"run_dir={tmp_path / 'plan'}", "new=true", "reevaluate.top_k=0",
                 f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}", f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}",
                 "task.validation_size=2", f"model.name_or_path={FIXTURES}", *ONE_MEMBER_AT_15S]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "plan").exists()
    assert ("episodes: generations=32 / 16 pieces (a particle's run of train.steps=1600 in 16 truncations) = 2 "
            "episodes") in out
    steps = _number(r"member-steps: 180 x 32 generations = 5760 truncations, ([0-9,]+) steps", out)
    whole = _number(r"\(population 180 x train.steps=1600\) = ([0-9.]+) whole-run generations", out)
    assert f"equal information: {steps:,.0f} member-steps" in out and whole == pytest.approx(steps / (180 * 1600),
                                                                                                rel=1e-2)
    assert f"whole-run ES with population 180 gets {whole:g} generations for the same information" in out
    assert "WARNING: generations=32" not in out  # a multiple of the 16 pieces
    # every particle starts at least two runs, each scoring the untouched model first; every truncation but those
    # from step 0 reads a boundary checkpoint of 0.84 GB, and every one writes one
    zero = _number(r"validations, whole search: 5,760 at the truncations' ends \+ ([0-9,]+) at step 0", out)
    assert zero >= 2 * 180
    assert (f"boundary checkpoint I/O, whole search: 5,760 written (one per truncation) and {5760 - zero:,.0f} read"
            in out)
    assert "boundary I/O per generation: 180 particles x 0.84 GB = 150.62 GB written" in out


def test_the_plan_counts_episodes_and_warns_when_the_last_one_is_incomplete(tmp_path, capsys, monkeypatch):
    from meta.searchers import searcher_class

    args = [*SYNTH, "dry_run=true", "new=true", "reevaluate.top_k=2", "reevaluate.seeds=2", "reevaluate.report_seeds=0"]
    nres = searcher_class("nres")
    monkeypatch.setattr(nres, "averaged_center", property(lambda self: self.center / 2))
    assert main([f"run_dir={tmp_path / 'a'}", *args, "generations=7", "es.update=truncation"]) == 0
    out = capsys.readouterr().out
    assert "8 selection runs (reevaluate: top_k=2 + centre + averaged centre, x seeds=2)" in out
    assert "episodes: generations=7 / 3 pieces (a particle's run of train.steps=12 in 3 truncations) = 2.33" in out
    # 7 generations x 4 members x 4 steps over (4 x 12): 2.33 whole-run generations; the pairs restart together and
    # the centre moves after every truncation
    assert "equal information: 112 member-steps / (population 4 x train.steps=12) = 2.33 whole-run generations" in out
    assert ("its centre moves 7 times over these 7 generations (whole-run ES's: 2.33); its pairs restart together, so "
            "the 3 updates of one episode sum to one whole-run estimate") in out
    assert ("WARNING: generations=7 is not a multiple of the run's 3 pieces: the last episode (generations 6..6) has 1 "
            "of its 3 truncations, and no particle of it reaches train.steps=12") in out
    assert "use generations=9 or 6" in out
    # runs start in generations 0, 3 and 6: 12 step-0 validations; 28 boundaries written, 16 read
    assert "validations, whole search: 28 at the truncations' ends + 12 at step 0" in out
    assert "boundary checkpoint I/O, whole search: 28 written (one per truncation) and 16 read" in out
    monkeypatch.setattr(nres, "averaged_center", property(lambda self: None))  # a searcher that keeps no average
    assert main([f"run_dir={tmp_path / 'b'}", *args, "generations=6", "es.update=run"]) == 0
    out = capsys.readouterr().out
    assert "6 selection runs (reevaluate: top_k=2 + centre, x seeds=2)" in out
    assert "= 2 episodes" in out and "in generation(s) 2, 5" in out and "WARNING: generations=" not in out
    # moved by whole runs as they end: as often as whole-run ES of the same information
    assert "its centre moves 2 times over these 6 generations (whole-run ES's: 2)\n" in out


@pytest.fixture(scope="module")
def online_run(tmp_path_factory) -> dict[str, Any]:
    """One es=nres search with an averaged centre, looked at before any particle ended its run (2 generations) and
    after two episodes (resumed to 6), selection included; the averaged centre is half the centre, so that the
    test knows it."""
    from meta.searchers import searcher_class
    from meta.search.after.export import export_init
    from meta.search.config import ConfigError
    from meta.status.view import render

    run_dir = tmp_path_factory.mktemp("nres") / "run"
    patch = pytest.MonkeyPatch()
    patch.setattr(searcher_class("nres"), "averaged_center", property(lambda self: self.center / 2))
    try:
        selection = ["reevaluate.top_k=2", "reevaluate.seeds=2", "reevaluate.report_seeds=0"]
        assert main([f"run_dir={run_dir}", "new=true", *SYNTH, *selection, "generations=2"]) == 0
        early = render(run_dir)
        with pytest.raises(ConfigError) as refused:
            export_init(run_dir, "best_member", run_dir.parent / "early.safetensors")
        finished = _Lines()  # meta.run's last word on the search
        logging.getLogger("meta.run").addHandler(finished)
        try:
            assert main([f"run_dir={run_dir}", "generations=6"]) == 0
        finally:
            logging.getLogger("meta.run").removeHandler(finished)
    finally:
        patch.undo()
    best = export_init(run_dir, "best_member", run_dir.parent / "best_member.safetensors")
    return {"run_dir": run_dir, "early_status": early, "early_export": str(refused.value), "best_member": best,
            "status": render(run_dir), "finished": [line for line in finished.lines if "search finished" in line]}


class _Lines(logging.Handler):
    """The messages logged to it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _run_ends(store: RunStore) -> pd.DataFrame:
    members = store.read_members()
    return members[members["diag_truncation_stop"] == H]


def test_selection_nominates_run_end_scores_and_the_averaged_centre_never_a_change(online_run):
    store = RunStore(online_run["run_dir"])
    ends = _run_ends(store).sort_values(END_SCORE_COLUMN, ascending=False)
    assert sorted(set(ends["generation"])) == [2, 5] and len(ends) == 8  # 4 particles end a run in each episode
    candidates = store.read_candidates()["candidates"]
    nominated = [c for c in candidates if c["index"] is not None]
    # the two best end scores at the horizon, not the two largest changes (the first truncations', from step 0)
    assert [(c["generation"], c["index"]) for c in nominated] == [
        (int(r.generation), int(r.index)) for r in ends.head(2).itertuples()]
    assert [c["search_fitness"] for c in nominated] == pytest.approx(list(ends[END_SCORE_COLUMN].head(2)))
    state = store.read_state(5)
    assert torch.equal(state[AVERAGED_CENTER], state["center"] / 2)
    by_name = {c["name"]: c for c in candidates}
    assert by_name["center"]["search_fitness"] is None  # a mean change is no score of the centre
    assert by_name[AVERAGED_CENTER]["params"] == state[AVERAGED_CENTER].tolist()
    summary = store.read_reevaluation()
    assert {c["name"] for c in summary["candidates"]} == set(by_name)
    assert summary["nominated_by"] == f"validation pass@1 at the end of a particle's run (step {H})"


def test_best_is_the_best_end_score_of_a_run_and_export_says_so(online_run):
    store = RunStore(online_run["run_dir"])
    ends = _run_ends(store)
    top = ends.sort_values([END_SCORE_COLUMN, "generation", "index"], ascending=[False, True, True]).iloc[0]
    best = store.read_best()
    assert (best["generation"], best["index"], best["episode"]) == (5, int(top["index"]), 1)
    assert best["fitness"] == pytest.approx(top[END_SCORE_COLUMN])
    assert best["fitness"] != pytest.approx(store.read_members()["fitness"].max())  # not the largest change
    exported = online_run["best_member"]
    assert exported["fitness"] == best["fitness"] and "at the end of a particle's run" in exported["note"]
    assert f"no particle has ended its run (step {H}) yet" in online_run["early_export"]
    # meta.run's last line names the figure for what it is: a run's end score, not a change over one truncation
    assert online_run["finished"] == [f"search finished after 6 generation(s); best particle run's end score "
                                      f"(validation pass@1 at the end of a particle's run (step {H}); a single run: "
                                      f"the selection runs measure the init) {best['fitness']:.4f}"]


def test_status_labels_the_fitness_and_shows_each_episodes_mean_end_score(online_run):
    early, status = online_run["early_status"], online_run["status"]
    assert f"fitness: {TRUNCATION_FITNESS}" in early and "no particle has ended its run yet" in early
    assert f"fitness: {TRUNCATION_FITNESS}" in status
    ends = _run_ends(RunStore(online_run["run_dir"]))
    for episode, group in ends.groupby(EPISODE_COLUMN):
        assert (f"  episode {episode}: {group[END_SCORE_COLUMN].mean():.4f} (best {group[END_SCORE_COLUMN].max():.4f};"
                f" 4 of 4 particles, by generation {group['generation'].max()})") in status
    assert "gen 5: 4 ok | mean change" in status and f"4 run(s) ended at step {H}: best" in status
    assert "gen 4: 4 ok | mean change" in status and "| best" not in status.split("gen 4:")[1].split("\n")[0]


def test_the_report_and_its_plots_show_end_scores_and_label_the_changes(online_run, tmp_path, drawn):
    from results.report.search.report import build_report, format_report

    figures = drawn
    report = build_report(online_run["run_dir"], tmp_path)
    text = format_report(report)
    assert f"generations:\n  (a member's fitness: {TRUNCATION_FITNESS})" in text
    assert f"top 8 particle runs by validation pass@1 at the end of a particle's run (step {H})" in text
    ends = _run_ends(RunStore(online_run["run_dir"]))
    assert list(report.top["end_score"]) == sorted(ends[END_SCORE_COLUMN], reverse=True)
    assert "  episode 1: " in text and "members nominated by validation pass@1 at the end" in text
    assert figures["fitness.png"].axes[0].get_ylabel() == f"fitness ({TRUNCATION_FITNESS})"
    episodes = figures["episodes.png"].axes[0]
    assert episodes.get_ylabel() == f"validation pass@1 at step {H}"
    line = episodes.get_lines()[0]
    assert list(line.get_xdata()) == [0, 1]
    assert list(line.get_ydata()) == pytest.approx(list(ends.groupby(EPISODE_COLUMN)[END_SCORE_COLUMN].mean()))

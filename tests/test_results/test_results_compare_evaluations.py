"""results.compare shows a run's other test numbers: the in-run extra evaluations of its record and the evaluation
files ``python -m inner_loop.evaluate`` writes beside it, averaged over seeds like the main table, never mixed."""
from __future__ import annotations

import pandas as pd
import pytest

from results.report.compare import compare, main, to_markdown
from results.store.atomic import atomic_write_json
from results.store.layout import evaluation_file_name, parse_evaluation_file_name
from results.store.provenance import build_run_manifest, write_run_manifest
from core.records import ResultRecord
from results.store.member_files import write_result

SPLITS = {"train": ["1+1=", "2+2="], "validation": ["3+3="]}
HUMANEVAL = {"name": "humaneval", "problems_file": None, "test_size": 4}


def _entry(task: str, pass_at_1: float, size: int = 4, tokens: float = 30.0) -> dict:
    return {"task": task, "split": "test", "pass_at_1": pass_at_1, "size": size, "mean_response_tokens": tokens}


def _run(root, method: str, seed: int, evaluations: dict | None = None, status: str = "ok",
         afterwards: dict | None = None, node: dict | None = None):
    """A single-run dir: manifest, result.json with its in-run evaluations, and an evaluation file if given."""
    work = root / f"mbpp_{method}_seed{seed}"
    inner = {"task": {"name": "mbpp"}, "divergence": {"name": method}, "train": {}, "model": {}}
    write_run_manifest(work, build_run_manifest(run_id="single", seed=seed, inner=inner, splits=SPLITS))
    write_result(work, ResultRecord(status=status, fitness=0.5 if status == "ok" else 0.0,
                                    evaluations=evaluations or {}, error="" if status == "ok" else "boom"))
    if afterwards is not None:
        atomic_write_json(work / evaluation_file_name(afterwards["task"]),
                          {**afterwards, "work_dir": str(work), "model_source": "lora_adapter",
                           "task_config": node or HUMANEVAL})
    return work


def test_in_run_and_afterwards_numbers_get_their_own_rows_averaged_over_seeds(tmp_path):
    for seed, (test, transfer) in enumerate([(0.4, 0.25), (0.6, 0.75)]):
        in_run = {"test": _entry("mbpp", test, 10), "transfer/humaneval": _entry("humaneval", transfer)}
        _run(tmp_path, "kl", seed, in_run, afterwards=_entry("humaneval", 0.5 * seed))
    _run(tmp_path, "kl", 2, {"test": _entry("mbpp", 0.9, 10)}, status="failed")  # never averaged in
    result = compare([tmp_path])
    rows = result.evaluations.set_index(["evaluated_on", "source"])
    assert len(rows) == 3 and set(rows["method"]) == {"kl"} and set(rows["task"]) == {"mbpp"}
    assert rows.loc[("mbpp", "in-run"), "pass1_mean"] == pytest.approx(0.5)
    assert rows.loc[("mbpp", "in-run"), "pass1_std"] == pytest.approx(0.1414, abs=1e-4)
    assert (rows.loc[("mbpp", "in-run"), "n_seeds"], rows.loc[("mbpp", "in-run"), "seeds"]) == (2, "0,1")
    assert rows.loc[("humaneval", "in-run"), "pass1_mean"] == pytest.approx(0.5)
    assert rows.loc[("humaneval", "afterwards"), "pass1_mean"] == pytest.approx(0.25)
    assert rows.loc[("humaneval", "afterwards"), "eval_config"] != ""
    text = to_markdown(result)
    assert "| kl | mbpp | humaneval | test | afterwards | 25.0 ± 35.4 | 30.0 | 4 | 2 (0,1) |" in text
    assert "| kl | mbpp | mbpp | test | in-run | 50.0 ± 14.1 | 30.0 | 10 | 2 (0,1) |" in text


def test_evaluations_with_other_task_nodes_are_not_averaged_together(tmp_path):
    _run(tmp_path, "kl", 0, afterwards=_entry("humaneval", 0.25), node=HUMANEVAL)
    _run(tmp_path, "kl", 1, afterwards=_entry("humaneval", 0.75, size=8), node={**HUMANEVAL, "test_size": 8})
    rows = compare([tmp_path]).evaluations
    assert len(rows) == 2 and rows["eval_config"].nunique() == 2 and set(rows["n_seeds"]) == {1}


def test_unreadable_evaluation_files_are_noted_and_left_out(tmp_path):
    work = _run(tmp_path, "kl", 0)
    (work / evaluation_file_name("humaneval")).write_text("{broken")
    result = compare([tmp_path])
    assert result.evaluations.empty and "Other test numbers" not in to_markdown(result)
    assert any("unreadable" in note and "humaneval" in note for note in result.notes)


def test_the_cli_writes_the_evaluations_table(tmp_path, capsys):
    _run(tmp_path / "runs", "prob_l2", 0, {"transfer/humaneval": _entry("humaneval", 0.5)})
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert "| prob_l2 | mbpp | humaneval | test | in-run | 50.0 |" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "out" / "comparison_evaluations.csv")
    assert list(table["evaluated_on"]) == ["humaneval"] and table["pass1_mean"].iloc[0] == pytest.approx(0.5)


@pytest.mark.parametrize("task", ["arith", "humaneval", "gsm_symbolic"])
def test_evaluation_file_names_round_trip(task):
    assert parse_evaluation_file_name(evaluation_file_name(task)) == (task, "test")
    assert evaluation_file_name(task) == f"evaluation_{task}_test.json"


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "transfer/humaneval"])
def test_a_task_name_that_cannot_name_a_file_is_refused(bad):
    with pytest.raises(ValueError, match="cannot name a file"):
        evaluation_file_name(bad)

"""Tuning with real training runs (the tiny model): the intermediate validation a pruner reads, and a small
coef x learning-rate tuning of the embedded default on the local launcher."""
from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from inner_loop.member.lifecycle import train_in_process
from meta.tune.cli import main
from results.store.member_files import read_intermediate
from results.store.layout import INTERMEDIATE_FILE
from results.store.study_store import load_study
from helpers import inner_config, member_spec, SMALL_WARMED

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf"


def _inner(**train) -> dict:
    return inner_config("kl", model_keys=SMALL_WARMED, **{
        "steps": 6, "batch_size": 16, "group_size": 4, "save_every": 3, "val_size": 32, "max_completion_length": 6,
        **train})


def _spec(work_dir: Path, inner: dict) -> dict:
    return member_spec(work_dir, inner, seed=3)


def test_intermediate_validation_is_written_every_eval_every_steps_and_leaves_training_unchanged(tmp_path):
    plain = train_in_process(_spec(tmp_path / "plain", _inner()))
    watched = train_in_process(_spec(tmp_path / "watched", _inner(eval_every=2, eval_subset=8)))
    assert plain.status == watched.status == "ok", (plain.error, watched.error)
    values = read_intermediate(tmp_path / "watched")
    assert sorted(values) == [2, 4]  # not the last step: the full validation scores that one
    assert all(0.0 <= v <= 1.0 and (v * 8).is_integer() for v in values.values())  # 8 problems scored
    assert not (tmp_path / "plain" / INTERMEDIATE_FILE).exists()
    # scoring greedily between steps draws no random numbers and leaves the model in training mode
    assert watched.fitness == plain.fitness
    untimed = lambda d: {k: v for k, v in d.items() if "time" not in k}  # noqa: E731
    assert untimed(watched.diagnostics) == pytest.approx(untimed(plain.diagnostics), nan_ok=True)


def test_eval_every_with_the_test_split_is_refused():
    from inner_loop.training.setup import validate_inner

    with pytest.raises(ValueError, match="train.eval_every"):
        validate_inner({**_inner(eval_every=2), "eval_split": "test"})


@pytest.mark.slow
def test_a_coef_x_learning_rate_tuning_of_the_embedded_default_runs_real_members(tmp_path):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=local", "tune.trials=2", "tune.parallel=2", "tune.pruner=median",
                 "train.steps=8", "train.eval_every=4", "train.eval_subset=16", "train.val_size=40"]) == 0
    study = load_study(run_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for t in study.trials:
        assert set(t.params) == {"divergence.coef", "train.learning_rate"}
        assert 0.0 <= t.value <= 1.0 and (t.value * 40).is_integer()
        assert sorted(t.intermediate_values) == [4]  # reported to the study from intermediate.jsonl

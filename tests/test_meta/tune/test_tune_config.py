"""meta.tune's input checks: every bad space, sampler, pruner or storage exits 2 naming the key, before a study,
a run dir or a job exists; and a trial's values reach the run config exactly."""
from __future__ import annotations

import pytest

from meta.compose import compose
from meta.tune.cli import main
from meta.tune.space import format_value, trial_overrides

SYNTH = ["inner.entrypoint=meta.tune.synthetic:run"]


@pytest.mark.parametrize("override, named", [
    ("tune.space={divergence.coeff: [log, 1e-4, 1.0]}", "tune.space.divergence.coeff"),
    ("tune.space={train.learning_rate: [log, 0.0, 1e-3]}", "log range needs low > 0"),
    ("tune.space={train.learning_rate: [log, -1e-4, 1e-3]}", "log range needs low > 0"),
    ("tune.space={divergence.coef: [float, 1.0, 1.0]}", "is empty"),
    ("tune.space={divergence.coef: [float, 2.0, 1.0]}", "is empty"),
    ("tune.space={divergence.coef: [log, 1e-4]}", "exactly two bounds"),
    ("tune.space={divergence.coef: [uniform, 1e-4, 1.0]}", "tune.space.divergence.coef"),
    ("tune.space={train.steps: [int, 1.5, 10]}", "integer bounds"),
    ("tune.space={divergence: [choice, kl]}", "at least two different values"),
    ("tune.space={divergence: [choice, kl, kl]}", "at least two different values"),
    ("tune.space={divergence: [choice, kl, nope]}", "'nope' is not a divergence config"),
    ("tune.space={divergence: [log, 1e-4, 1.0]}", "config group"),
    ("tune.space={seed: [int, 0, 3]}", "only keys under"),
    ("tune.space={divergence.param_transform: [choice, abs, none], divergence: [choice, kl, neural_mirror]}",
     "divergence=kl has no such setting"),
    ("tune.sampler=grid", "tune.sampler='grid'"),
    ("tune.pruner=hyperband", "tune.pruner='hyperband'"),
    ("tune.pruner_options={bogus: 1}", "tune.pruner_options"),
    ("tune.sampler_options={bogus: 1}", "tune.sampler_options"),
    ("train.eval_every=null", "train.eval_every"),
    ("tune.trials=0", "tune.trials"),
    ("tune.parallel=0", "tune.parallel"),
    ("tune.seeds=0", "tune.seeds"),
    ("tune.storage=study.db", "tune.storage"),
    ("tune.bogus=1", "tune.bogus"),
])
def test_bad_input_exits_2_naming_the_key_before_anything_exists(tmp_path, capsys, override, named):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", *SYNTH, override]) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert not run_dir.exists()


def test_a_trial_value_that_the_run_config_refuses_is_caught_up_front_for_a_group_choice(tmp_path, capsys):
    """Each tuned group choice is composed and validated by the entry point before the first trial: a choice whose
    run config the member would refuse fails the whole tuning with exit 2, not trial after trial on the cluster."""
    run_dir = tmp_path / "run"
    code = main([f"run_dir={run_dir}", "new=true", "tune.space={divergence: [choice, kl, neural_mirror]}",
                 "divergence.init=/no/such/init.safetensors"])
    assert code == 2
    assert "divergence.init" in capsys.readouterr().err
    assert not run_dir.exists()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "dry_run=true", "tune.trials=12", "tune.seeds=3", "tune.parallel=4"]) == 0
    out = capsys.readouterr().out
    assert "12 x 3 seed(s) = 36 training runs, at most 12 at once" in out
    assert "divergence.coef: log [0.0001, 1]" in out
    assert not run_dir.exists()


@pytest.mark.parametrize("value", [1.2345678901234567e-05, 0.1 + 0.2, 3e-4, 1e-300, 7.0])
def test_a_trial_float_reaches_the_composed_config_bit_for_bit(value):
    raw = compose(trial_overrides({"train.learning_rate": value}), "tune")
    assert raw["train"]["learning_rate"] == value
    assert format_value(True) == "true"


def test_a_tuned_group_is_chosen_before_its_leaves_are_set():
    overrides = trial_overrides({"divergence.coef": 0.25, "divergence": "kl"})
    assert overrides == ["divergence=kl", "divergence.coef=0.25"]
    raw = compose(overrides, "tune")
    assert raw["divergence"]["name"] == "kl" and raw["divergence"]["coef"] == 0.25


def test_the_cmaes_sampler_is_available():
    from meta.tune.config import build_sampler

    assert type(build_sampler("cmaes", {}, 0)).__name__ == "CmaEsSampler"


def test_meta_run_and_meta_tune_refuse_each_others_run_dirs(tmp_path, capsys):
    from meta.search.run import main as run_main

    tune_dir, search_dir = tmp_path / "tune", tmp_path / "search"
    assert main([f"run_dir={tune_dir}", "new=true", *SYNTH, "launcher=debug", "tune.trials=1", "+inner.options={step_s: 0.0}"]) == 0
    assert run_main([f"run_dir={tune_dir}", "new=true"]) == 2
    assert "is a meta.tune run" in capsys.readouterr().err
    assert run_main([f"run_dir={search_dir}", "new=true", "inner.entrypoint=meta.synthetic:member", "generations=1",
                     "reevaluate.top_k=0", "launcher=debug"]) == 0
    assert main([f"run_dir={search_dir}", "new=true"]) == 2
    assert "is not a meta.tune run" in capsys.readouterr().err


def test_a_tune_runs_config_hash_follows_its_study_not_the_es_keys():
    """The manifest's config_hash of a tune run is over what the study computes: two studies that differ in their
    space, seeds, sampler or pruner never share one (it hashed the ES search's keys before)."""
    from meta.tune.config import study_hash

    base = compose(["tune.trials=2"], "tune")
    changed = [compose([override], "tune") for override in (
        "tune.space={train.learning_rate: [log, 1e-5, 1e-3]}", "tune.seeds=3", "tune.sampler=random",
        "tune.pruner=successive_halving")]
    assert len({study_hash(raw) for raw in (base, *changed)}) == 5
    assert study_hash(compose(["tune.trials=7", "tune.parallel=3"], "tune")) == study_hash(base)


@pytest.mark.parametrize(("coef", "shown"), [("10.0", "divergence.coef: log [0.1, 1000]"),
                                             ("0.01", "divergence.coef: log [0.0001, 1]")])
def test_the_default_ranges_contain_the_presets_value_and_the_plan_counts_validations(tmp_path, capsys, coef, shown):
    """mbpp_qwen3 runs divergence.coef 10, outside a fixed [1e-4, 1]: the default range moves to contain it; a value
    inside leaves the range as written. Each run's intermediate validations are counted (the tiny preset: 60 steps,
    eval_every 15: at 15, 30, 45)."""
    assert main([f"run_dir={tmp_path / 'run'}", "new=true", *SYNTH, "dry_run=true", f"divergence.coef={coef}",
                 "tune.trials=4"]) == 0
    out = capsys.readouterr().out
    assert shown in out
    assert "intermediate validations: 3 per run (every train.eval_every=15 of train.steps=60" in out
    assert "= 12 in all" in out


def test_the_tune_schema_checks_across_its_keys_wherever_a_config_is_read_through_it():
    """TuneSchema is the tune's one typed config: its cross-key checks run in __post_init__, so a plain read
    (typed_config) refuses what the command refuses, and normalises what the command normalises."""
    from meta.compose import compose
    from meta.settings.schema import ConfigError, TuneSchema, typed_config

    raw = compose(["tune.pruner=median", "train.eval_every=null", "log_level=debug"], "tune")
    with pytest.raises(ConfigError, match="tune.pruner=median decides from intermediate scores"):
        typed_config(TuneSchema, raw)
    raw["tune"]["pruner"] = "none"
    cfg = typed_config(TuneSchema, raw)
    assert cfg.log_level == "DEBUG" and cfg.tune.sampler_options == {} and cfg.inner_config["train"] == raw["train"]

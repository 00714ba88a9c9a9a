"""es.member_steps: a search member trains its own number of steps, apart from train.steps (the exported run, the
selection and reporting runs); its schedule is the full run's shrunk to its steps; the plan prices it, the status and
the report say it, and a resume refuses a changed member_steps while runs from before the key resume."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from meta.compose import compose
from core.config.horizon import member_train
from meta.search.config import ConfigError, build_search_config, config_hash
from meta.search.run import main
from meta.status.view import render
from results.report.search.report import build_report, format_report
from plan_inputs import ONE_MEMBER_AT_15S
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "new=true"]
MBPP = ["experiment=mbpp_qwen3", "launcher=slurm", "population=180", "generations=15", "dry_run=true", "new=true",
        *ONE_MEMBER_AT_15S, "inner.entrypoint=meta.synthetic:member"]


def _spec_train(folder) -> dict:
    return json.loads((folder / "spec.json").read_text())["inner"]["train"]


def test_null_is_train_steps_and_a_value_shrinks_the_members_schedule():
    cfg = build_search_config(compose([]))
    assert cfg.member_steps == cfg.full_steps == 60 and cfg.search_member_inner() == cfg.member_inner()
    cfg = build_search_config(compose(["es.member_steps=15", "train.lr_warmup_steps=8", "train.lr_scheduler=cosine"]))
    train = cfg.search_member_inner()["train"]
    assert train["steps"] == 15 and train["lr_warmup_steps"] == 2 and train["lr_scheduler"] == "cosine"
    assert cfg.member_inner()["train"]["steps"] == 60  # the runs after the search train train.steps
    assert "member_steps" not in cfg.searcher_settings  # the searcher is built without it
    assert member_train({"steps": 10, "lr_warmup_steps": 9}, 2, 10)["lr_warmup_steps"] == 1  # at least one full-lr step


@pytest.mark.parametrize("value", ["0", "61", "2.5", "true", "abc"])
def test_a_bad_member_steps_fails_up_front_naming_the_key_and_writes_nothing(tmp_path, capsys, value):
    with pytest.raises(ConfigError, match=r"es.member_steps=.* must be an integer from 1 to train.steps=60"):
        build_search_config(compose([f"es.member_steps={value}"]))
    assert main([f"run_dir={tmp_path / 'r'}", *SYNTH, f"es.member_steps={value}"]) == 2
    assert "es.member_steps" in capsys.readouterr().err and not (tmp_path / "r").exists()


def _gpu_hours(out: str) -> float:
    return float(re.search(r"GPU-hours, whole search: .* = ([\d,.]+) GPU-h", out).group(1).replace(",", ""))


def test_the_plan_prices_search_members_at_member_steps_and_the_runs_after_at_train_steps(tmp_path, capsys,
                                                                                        monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")  # no scheduler command is asked
    assert main([f"run_dir={tmp_path / 'a'}", *MBPP]) == 0
    full = capsys.readouterr().out
    assert main([f"run_dir={tmp_path / 'b'}", *MBPP, "es.member_steps=100"]) == 0
    short = capsys.readouterr().out
    assert _gpu_hours(full) == pytest.approx(2751 * 412 / 60, abs=0.1)
    # 181 x 15 members of 100 steps x 15 s + the preset's 3 min of a short run's fixed cost
    # (resources.short_run_overhead_min), and 12 selection + 24 reporting runs of 1600 steps (+ 12 min: 412 min)
    assert _gpu_hours(short) == pytest.approx(2715 * 28 / 60 + 36 * 412 / 60, abs=0.1)
    assert "es.member_steps=100 of train.steps=1600" in short and "x es.member_steps=100 + " in short
    assert "member horizon" not in full
    assert "1 written per member (es.member_steps=100 / save_every=100)" in short  # a search member's checkpoints
    assert "16 written per member (train.steps=1600 / save_every=100)" in full


def test_a_search_members_time_limit_follows_its_steps_where_a_step_time_is_measured(tmp_path, capsys, monkeypatch):
    """A 100-step member of a 1,600-step preset is limited (and its SLURM array task asks) for its own time x the
    preset's timeout_factor, not the whole run's 10.3 h; the runs after the search keep the whole run's limit. Without a
    measured step time (the tiny preset) the whole run's limit stays: a short member's fixed cost is unknown."""
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")  # no scheduler command is asked
    cfg = build_search_config(compose(["experiment=mbpp_qwen3", "es.member_steps=100", *MBPP[-3:]]))
    assert cfg.inner.timeout_s == 412 * 60 * 1.5
    assert cfg.search_timeout_s == 28 * 60 * 1.5  # (100 x 15 s + short_run_overhead_min 3 min) = 28 min, x 1.5
    unset = build_search_config(compose(["experiment=mbpp_qwen3", "es.member_steps=100",
                                         "resources.short_run_overhead_min=null", *MBPP[-3:]]))
    assert unset.search_timeout_s == 37 * 60 * 1.5  # null: the whole run's 12 min (100 x 15 s + 12 min = 37 min)
    with pytest.raises(ConfigError, match=r"resources\.short_run_overhead_min"):
        build_search_config(compose(["experiment=mbpp_qwen3", "resources.short_run_overhead_min=-1", *MBPP[-3:]]))
    assert build_search_config(compose(["experiment=mbpp_qwen3", *MBPP[-3:]])).search_timeout_s == cfg.inner.timeout_s
    assert main([f"run_dir={tmp_path / 'a'}", *MBPP]) == 0
    full = capsys.readouterr().out
    assert main([f"run_dir={tmp_path / 'b'}", *MBPP, "es.member_steps=100"]) == 0
    short = capsys.readouterr().out
    assert "a search member's 2520 s" in short and "a search member's" not in full
    sbatch_time = [int(re.search(r"#SBATCH --time=(\d+)", out).group(1)) for out in (full, short)]
    assert sbatch_time[1] * 5 < sbatch_time[0]
    tiny = build_search_config(compose(["es.member_steps=15"]))
    assert tiny.search_timeout_s == tiny.inner.timeout_s


def test_members_train_member_steps_the_runs_after_train_steps_and_status_and_report_say_so(tmp_path):
    assert main([f"run_dir={tmp_path}", *SYNTH, "generations=1", "es.member_steps=20", "reevaluate.top_k=1",
                 "reevaluate.seeds=2", "reevaluate.report_seeds=2", "reevaluate.baselines=[center]"]) == 0
    store = RunStore(tmp_path)
    for index in range(5):  # the population and the control member
        assert _spec_train(store.member_dir(0, index))["steps"] == 20
    after = [p for p in store.reevaluate_dir().rglob("spec.json")]
    assert after and all(json.loads(p.read_text())["inner"]["train"]["steps"] == 60 for p in after)
    assert "members train es.member_steps=20 of train.steps=60" in render(tmp_path)
    assert "members train es.member_steps=20 of train.steps=60" in format_report(build_report(tmp_path,
                                                                                              tmp_path / "rep"))


def test_a_changed_member_steps_is_refused_on_resume_and_runs_from_before_the_key_resume(tmp_path, capsys):
    assert main([f"run_dir={tmp_path}", *SYNTH, "generations=1", "es.member_steps=20", "reevaluate.top_k=0"]) == 0
    assert main([f"run_dir={tmp_path}", "generations=2", "es.member_steps=30"]) == 2
    assert "es.member_steps: 20 -> 30" in capsys.readouterr().err
    old = tmp_path / "old"
    assert main([f"run_dir={old}", *SYNTH, "generations=1", "reevaluate.top_k=0"]) == 0
    store = RunStore(old)
    stored = yaml.safe_load(store.read_config_text())
    del stored["es"]["member_steps"]  # a run written before the key existed
    store.write_config(yaml.safe_dump(stored))
    assert main([f"run_dir={old}", "generations=2"]) == 0
    assert _spec_train(store.member_dir(1, 0))["steps"] == 60
    raw = compose([])
    assert config_hash(raw) == config_hash({**raw, "es": {k: v for k, v in raw["es"].items() if k != "member_steps"}})
    assert config_hash(raw) != config_hash(compose(["es.member_steps=20"]))

"""A run's other test numbers on the same trained model: the inner config's extra_evaluations (own test split,
transfer tasks), 0-step base-model runs, and ``python -m inner_loop.evaluate`` on a finished run's final/ model.

One tiny model, the embedded default's warmed one (a fresh model never answers, and a transfer score of 0 would
prove nothing), trained 2 steps; every number is checked against a direct `evaluate` of the model it claims."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from inner_loop.config import InnerConfig, TrainConfig
from inner_loop.training.evaluate import evaluate, main
from inner_loop.member.lifecycle import train_in_process
from inner_loop.models.loading import load_policy, resolve_model_dir
from inner_loop.training.setup import prepare, validate_inner
from inner_loop.tasks import build_task
from inner_loop.training.warmup import warmed_model_dir
from results.store.layout import CHECKPOINT_DIR, FINAL_MODEL_DIR, evaluation_file_name
from results.store.provenance import build_run_manifest, write_run_manifest
from core.records import ResultRecord
from results.store.member_files import read_result, write_result
from conf_groups import load_group
from helpers import member_spec

CONF = Path(__file__).resolve().parents[3] / "conf"
#: the transfer task's split sizes (its own test split is scored in the run and again directly)
TRANSFER_SIZES = {"validation_size": 40, "test_size": 40}
#: KL with a gradient-share floor: a run with steps would be checked for an inert regularizer
KL = {"name": "kl", "form": "sampled", "estimator": "k3", "coef": 0.04, "grad_share_floor": 0.01}
#: the default train.max_completion_length: with the default tiny model and arith task, the run's warm-up is the
#: embedded default's (greedy validation pass@1 ~0.6), which the session's model cache builds once for every test
MAX_NEW_TOKENS = TrainConfig().max_completion_length


def _load(group: str, name: str) -> dict:
    return load_group(group, name)


def _inner(steps: int = 2, extra: list | None = None, divergence: dict | None = None) -> dict:
    inner = {"task": _load("task", "arith"), "model": _load("model", "tiny"),
             "divergence": divergence or _load("divergence", "none"), "train": _load("train", "default")}
    inner["train"].update({"steps": steps, "batch_size": 8, "group_size": 4, "max_completion_length": MAX_NEW_TOKENS,
                           "val_size": None, "save_every": 10, "report_to": []})
    if extra is not None:
        inner["extra_evaluations"] = extra
    return inner


def _spec(work_dir: Path, inner: dict) -> dict:
    return member_spec(work_dir, inner, run_id="single")


def _direct(model, tokenizer, task_node: dict, split: str) -> dict:
    """What an evaluations entry must hold for ``model`` on ``split`` of the task ``task_node`` builds."""
    task = build_task(task_node)
    result = evaluate(model, tokenizer, task, task.load(split), max_new_tokens=MAX_NEW_TOKENS, log=False)
    return {"task": task.name, "split": split, "pass_at_1": result.pass_at_1, "size": result.size,
            "mean_response_tokens": result.mean_response_tokens}


def _final_model(work_dir: Path):
    """The run's final/ model loaded with plain transformers, independently of the code under test."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = work_dir / FINAL_MODEL_DIR
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


TRANSFER = {**_load("task", "arith"), **TRANSFER_SIZES, "seed": 7}  # other operands, drawn from another seed


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, ResultRecord]:
    """A 2-step single run with its own test split and a transfer task scored in the run, its model in final/."""
    work = tmp_path_factory.mktemp("transfer") / "run"
    extra = [{"name": "test", "task": None}, {"name": "transfer/arith", "task": TRANSFER}]
    record = train_in_process(_spec(work, _inner(extra=extra)), save_final=True)
    assert record.status == "ok", record.error
    return work, record


def test_in_run_evaluations_are_those_of_the_final_model(trained):
    work, record = trained
    model, tokenizer = _final_model(work)
    assert record.steps_done == 2 and set(record.evaluations) == {"test", "transfer/arith"}
    assert all(entry["pass_at_1"] > 0 for entry in record.evaluations.values())  # agreement on answers, not on 0
    assert record.evaluations["test"] == _direct(model, tokenizer, _load("task", "arith"), "test")
    assert record.evaluations["transfer/arith"] == _direct(model, tokenizer, TRANSFER, "test")
    assert record.fitness == _direct(model, tokenizer, _load("task", "arith"), "validation")["pass_at_1"]
    assert read_result(work).evaluations == record.evaluations  # through result.json and back
    # What the checks above scored is the trained model, not the one training started from: 2 steps moved its
    # weights. (Its answers need not move: on some CPUs 2 steps change no greedy answer of this test split.)
    run = prepare(_inner(), seed=0)
    untouched, _ = load_policy(run.cfg.model, warmed_model_dir(run.cfg.model, resolve_model_dir(run.cfg.model),
                                                               run.task, run.cfg.task,
                                                               probe_max_new_tokens=MAX_NEW_TOKENS))
    before, after = untouched.state_dict(), model.state_dict()
    assert before.keys() == after.keys()
    moved = [name for name in before if not torch.equal(before[name], after[name])]
    assert moved, "the final model has the untouched model's weights: the run's evaluations could be either's"


def test_the_command_scores_the_final_model_on_other_operands(trained):
    work, record = trained
    assert main([f"work_dir={work}", "task=arith", "task.seed=7", "task.validation_size=40",
                 "task.test_size=40"]) == 0
    written = json.loads((work / evaluation_file_name("arith")).read_text())
    model, tokenizer = _final_model(work)
    direct = _direct(model, tokenizer, TRANSFER, "test")
    assert {k: written[k] for k in direct} == direct
    assert direct["pass_at_1"] > 0 and direct["size"] == 40
    assert (written["work_dir"], written["model_source"]) == (str(work), "full_model")
    assert written["task_config"] == TRANSFER
    assert {k: written[k] for k in direct} == record.evaluations["transfer/arith"]  # the same numbers as in the run


def test_a_zero_step_run_scores_the_untouched_model(tmp_path, caplog):
    inner = _inner(steps=0, extra=[{"name": "test", "task": None}], divergence=KL)
    validate_inner(inner)  # 0 steps pass the up-front checks, TRL's GRPOConfig included
    with caplog.at_level(logging.WARNING):
        record = train_in_process(_spec(tmp_path / "base", inner), save_final=True)
    assert record.status == "ok", record.error
    assert record.steps_done == 0 and record.diagnostics["steps_done"] == 0.0
    assert not any("grad_share_floor" in r.getMessage() for r in caplog.records)  # no step, no share
    assert not (tmp_path / "base" / CHECKPOINT_DIR).exists() and (tmp_path / "base" / FINAL_MODEL_DIR).is_dir()
    run = prepare(inner, seed=0)
    base = warmed_model_dir(run.cfg.model, resolve_model_dir(run.cfg.model), run.task, run.cfg.task,
                            probe_max_new_tokens=MAX_NEW_TOKENS)
    model, tokenizer = load_policy(run.cfg.model, base)
    assert record.fitness == _direct(model, tokenizer, inner["task"], "validation")["pass_at_1"] > 0
    assert record.evaluations["test"] == _direct(model, tokenizer, inner["task"], "test")


def test_a_failing_extra_evaluation_fails_the_member_naming_it(tmp_path, monkeypatch):
    import inner_loop.member.lifecycle as member

    scored = []

    def flaky(model, tokenizer, task, problems, **kwargs):
        scored.append(len(problems))
        if len(scored) > 1:
            raise RuntimeError("sandbox gone")
        return evaluate(model, tokenizer, task, problems, **kwargs)

    monkeypatch.setattr(member, "evaluate", flaky)
    inner = _inner(steps=0, extra=[{"name": "transfer/arith", "task": TRANSFER}])
    record = train_in_process(_spec(tmp_path / "run", inner))
    assert record.status == "failed" and record.evaluations == {}
    assert record.error == "extra evaluation 'transfer/arith': RuntimeError: sandbox gone"
    assert read_result(tmp_path / "run").error == record.error


# ------------------------------------------------------------------ up-front checks (no model)
@pytest.mark.parametrize("extra, message", [
    ([{"name": "test", "task": None}, {"name": "transfer/arith", "task": {"name": "arith", "seeed": 7}}],
     r"extra_evaluations\[1\]\.task\.seeed"),
    ([{"name": "transfer/arith", "task": {"name": "arith", "test_size": "many"}}],
     r"extra_evaluations\[0\]\.task\.test_size must be an integer"),
    ([{"name": "transfer/gsm9k", "task": {"name": "gsm9k"}}], r"extra_evaluations\[0\]\.task\.name"),
    ([{"name": "transfer/arith", "task": {"name": "arith", "test_size": 0}}],
     r"extra_evaluations\[0\]\.task\.test_size"),
    ([{"name": "transfer", "task": {"name": "arith"}}], r"extra_evaluations\[0\]\.name='transfer'.*'transfer/arith'"),
    ([{"name": "own", "task": None}], r"extra_evaluations\[0\]\.name='own'.*'test'"),
    ([{"name": "test", "task": None}, {"name": "test", "task": None}], r"extra_evaluations\[1\]\.name='test' appears"),
    ([{"name": "test", "tsk": None}], r"extra_evaluations\[0\]\.tsk"),
    ({"name": "test"}, r"extra_evaluations must be a list"),
])
def test_bad_extra_evaluations_are_refused_up_front_naming_the_key(extra, message):
    with pytest.raises(ValueError, match=message):
        validate_inner(_inner(extra=extra))


def test_a_transfer_test_set_that_shares_prompts_with_training_is_refused():
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    inner = _inner()
    inner["task"] = {"name": "mbpp", "train_file": str(fixtures / "mbpp_train.jsonl"), "validation_size": 1}
    leaked = {"name": "mbpp", "train_file": str(fixtures / "mbpp_validation.jsonl"), "validation_size": 1,
              "test_file": str(fixtures / "mbpp_train.jsonl")}  # its test problems are the run's training problems
    with pytest.raises(ValueError, match=r"extra_evaluations\[0\]: task 'mbpp': \d+ prompt\(s\) appear in both the "
                                         r"'test' and 'train' splits"):
        prepare({**inner, "extra_evaluations": [{"name": "transfer/mbpp", "task": leaked}]}, seed=0)
    clean = {**leaked, "test_file": str(fixtures / "mbpp_test.jsonl")}
    assert len(prepare({**inner, "extra_evaluations": [{"name": "transfer/mbpp", "task": clean}]}, seed=0).extras) == 1


def test_steps_must_not_be_negative():
    with pytest.raises(ValueError, match=r"train\.steps must be >= 0"):
        InnerConfig.from_dict(_inner(steps=-1))
    assert InnerConfig.from_dict(_inner(steps=0)).train.steps == 0


def test_records_carry_evaluations_and_older_records_still_load(tmp_path):
    entry = {"task": "humaneval", "split": "test", "pass_at_1": 0.25, "size": 4, "mean_response_tokens": 31.5}
    record = ResultRecord(status="ok", fitness=0.5, evaluations={"transfer/humaneval": entry})
    write_result(tmp_path, record)
    assert read_result(tmp_path) == record and read_result(tmp_path).evaluations["transfer/humaneval"] == entry
    assert ResultRecord.from_dict({"status": "ok", "fitness": 0.5}).evaluations == {}
    with pytest.raises(ValueError, match="evaluations"):
        ResultRecord(status="ok", evaluations={"test": 0.5})


# ------------------------------------------------------------------ the command's bad input (no model is loaded)
@pytest.fixture()
def no_model_loading(monkeypatch):
    import inner_loop.training.transfer as transfer

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for bad input")

    monkeypatch.setattr(transfer, "load_trained", refuse)


def _finished_looking_run(root: Path, final: bool = True) -> Path:
    """What inner_loop.run leaves, minus real weights: manifest, ok result and a final/ with a model config."""
    work = root / "run"
    write_run_manifest(work, build_run_manifest(run_id="single", seed=0, inner=_inner(), splits={"train": ["1+1="]}))
    write_result(work, ResultRecord(status="ok", fitness=0.5))
    if final:
        (work / FINAL_MODEL_DIR).mkdir()
        (work / FINAL_MODEL_DIR / "config.json").write_text("{}")
    return work


@pytest.mark.parametrize("case, args, message", [
    ("none", ["work_dir={missing}", "task=arith"], "no such work_dir"),
    ("no_result", ["work_dir={work}", "task=arith"], "train it with python -m inner_loop.run"),
    ("no_final", ["work_dir={work}", "task=arith"], "older version); train it with python -m inner_loop.run"),
    ("ok", ["work_dir={work}", "task=arithmetic"], "unknown task group 'arithmetic'"),
    ("ok", ["work_dir={work}", "task=arith", "task.seeed=7"], "task.seeed"),
    ("ok", ["work_dir={work}", "task=arith", "+task.seeed=7"], "unknown key(s) ['task.seeed']"),
    ("ok", ["work_dir={work}", "task=arith", "task.test_size=0"], "empty test split"),
    ("ok", ["work_dir={work}", "task=arith", "model=smollm2_135m"], "unknown argument 'model'"),
    ("ok", ["work_dir={work}"], "work_dir= and task= are both required"),
])
def test_bad_input_exits_2_with_one_line_before_any_model_is_loaded(tmp_path, caplog, no_model_loading, case, args,
                                                                     message):
    work = tmp_path / "run"
    if case == "no_result":
        work.mkdir()
    elif case != "none":
        work = _finished_looking_run(tmp_path, final=case != "no_final")
    argv = [a.format(work=work, missing=tmp_path / "nowhere") for a in args]
    with caplog.at_level(logging.ERROR, logger="inner_loop.training.evaluate"):
        assert main(argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0] and message in errors[0], errors
    assert not list(work.glob("evaluation_*")) if work.is_dir() else True


def test_a_failed_run_is_not_scored(tmp_path, caplog, no_model_loading):
    work = _finished_looking_run(tmp_path)
    write_result(work, ResultRecord(status="failed", error="training: diverged"))
    assert main([f"work_dir={work}", "task=arith"]) == 2
    assert "says the run failed: training: diverged" in caplog.text

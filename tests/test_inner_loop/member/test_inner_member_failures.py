"""Every failure of a member, from parsing its config to saving its final model, ends as a `failed` result record.

A member runs unattended in a job: an exception that escapes train_in_process leaves the orchestrator nothing but a
traceback tail (and, outside our job wrapper, nothing at all). Each test injects a failure at one stage and checks
that the record on disk and the one returned carry the stage and the error. A timeout (a BaseException from the
job wrapper's alarm) must pass through untouched, to become status `timeout`.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import inner_loop.member.lifecycle as member
import inner_loop.grpo.trainer as trainer
import inner_loop.models.loading as loading  # build_trainer imports its loaders when it runs
from inner_loop.member.lifecycle import train_in_process
from results.store.provenance import read_run_manifest
from results.store.member_files import read_result
from helpers import inner_config, member_spec, NARROW_UNWARMED

CONF = Path(__file__).resolve().parents[3] / "conf"
def _inner(**train) -> dict:
    """Tiny and untrained (no warm-up): these tests need the stages to run, not a model that answers."""
    return inner_config("prob_l2", model_keys=NARROW_UNWARMED, **{
        "steps": 2, "batch_size": 8, "group_size": 4, "save_every": 1, "val_size": 8, "max_completion_length": 4,
        **train})


def _spec(work: Path, inner: dict) -> dict:
    return member_spec(work, inner, index=3)


def _boom(message: str, kind: type[BaseException] = RuntimeError):
    def fail(*args, **kwargs):
        raise kind(message)
    return fail


def _assert_failed(work: Path, record, stage: str, text: str) -> None:
    """The record is `failed`, names the stage and the error, and is the one on disk."""
    assert record.status == "failed", record
    assert record.error.startswith(f"{stage}: ") and text in record.error, record.error
    assert record.fitness == 0.0
    on_disk = json.loads((work / "result.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["error"] == record.error
    assert read_result(work) == record


def test_a_config_the_member_cannot_parse_ends_as_a_failed_record(tmp_path):
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner(trl={"use_vlm": True})))
    _assert_failed(work, record, "config and data", "train.trl.use_vlm is not a field")
    assert record.steps_done == 0 and record.disk_peak_bytes is None


def test_a_segment_whose_schedule_is_not_its_runs_ends_as_a_failed_record(tmp_path, monkeypatch):
    """A member's segment spans its run's schedule (train.steps): a spec whose segment says otherwise would stop at the
    wrong step or leave its learning rate mid-decay, so it fails before the model loads."""
    monkeypatch.setattr(loading, "load_policy", _boom("the model must not be loaded for a segment that cannot run"))
    work = tmp_path / "m"
    spec = {**_spec(work, _inner()), "segment": {"start": 0, "stop": 3, "horizon": 3}}
    record = train_in_process(spec)
    _assert_failed(work, record, "config and data", "segment spans a schedule of 3 steps, its train.steps is 2")


def test_a_missing_data_file_ends_as_a_failed_record(tmp_path):
    inner = _inner()
    inner["task"] = {"name": "gsm8k", "train_file": str(tmp_path / "absent.jsonl")}
    work = tmp_path / "m"
    _assert_failed(work, train_in_process(_spec(work, inner)), "config and data", "absent.jsonl")


def test_a_value_grpo_config_rejects_fails_before_the_model_is_loaded(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "load_policy", _boom("the model must not be loaded for a bad lr_scheduler"))
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner(lr_scheduler="cosin")))
    _assert_failed(work, record, "model and trainer setup", "train.lr_scheduler: rejected by TRL's GRPOConfig")
    assert read_run_manifest(work) is not None, "the manifest is still written before the trainer is built"


def test_a_model_that_cannot_be_resolved_ends_as_a_failed_record(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "resolve_model_dir", _boom("model.name_or_path='/nope': no such model directory",
                                                              ValueError))
    work = tmp_path / "m"
    _assert_failed(work, train_in_process(_spec(work, _inner())), "model and trainer setup", "no such model directory")


def test_a_model_load_out_of_memory_ends_as_a_failed_record(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "load_policy", _boom("CUDA out of memory. Tried to allocate 2.00 GiB",
                                                        torch.OutOfMemoryError))
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner()))
    _assert_failed(work, record, "model and trainer setup", "OutOfMemoryError: CUDA out of memory")


def test_a_trainer_that_cannot_be_built_ends_as_a_failed_record(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "MirrorGRPOTrainer", _boom("trainer refused its arguments", TypeError))
    work = tmp_path / "m"
    _assert_failed(work, train_in_process(_spec(work, _inner())), "model and trainer setup",
                   "TypeError: trainer refused its arguments")


def test_a_crash_in_a_training_step_ends_as_a_failed_record_with_the_steps_done(tmp_path, monkeypatch):
    real = member.MirrorGRPOTrainer.training_step
    calls = []

    def second_step_crashes(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(member.MirrorGRPOTrainer, "training_step", second_step_crashes)
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner()))
    _assert_failed(work, record, "training", "RuntimeError: CUDA error: an illegal memory access")
    assert record.steps_done == 1 and record.diagnostics, "what the first step logged is kept"
    assert record.disk_peak_bytes and record.disk_peak_bytes > 0


def test_a_crash_in_evaluation_ends_as_a_failed_record(tmp_path, monkeypatch):
    monkeypatch.setattr(member, "_evaluate", _boom("sandbox pool died"))
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner()))
    _assert_failed(work, record, "evaluation", "RuntimeError: sandbox pool died")
    assert record.steps_done == 2


def test_a_crash_saving_the_final_model_ends_as_a_failed_record(tmp_path, monkeypatch):
    monkeypatch.setattr(member, "save_final_model", _boom("No space left on device", OSError))
    work = tmp_path / "m"
    record = train_in_process(_spec(work, _inner()), save_final=True)
    _assert_failed(work, record, "saving the final model", "OSError: No space left on device")


def test_a_timeout_passes_through_without_a_record(tmp_path, monkeypatch):
    """The job wrapper's alarm is a BaseException: it must reach the wrapper, which records `timeout`."""
    from launch.member import MemberTimeout

    monkeypatch.setattr(loading, "load_policy", _boom("member exceeded inner.timeout_s=1", MemberTimeout))
    work = tmp_path / "m"
    with pytest.raises(MemberTimeout):
        train_in_process(_spec(work, _inner()))
    assert not (work / "result.json").exists()


def test_the_job_wrapper_hands_the_orchestrator_the_members_own_record(tmp_path, monkeypatch):
    """Through launch.member.run_member (what every job runs): the record is the member's, stage and all, not a
    traceback tail written by the wrapper."""
    from launch.member import run_member

    monkeypatch.setattr(loading, "load_policy", _boom("CUDA out of memory", torch.OutOfMemoryError))
    work = tmp_path / "m"
    out = run_member("inner_loop.member.lifecycle:train_in_process", _spec(work, _inner()), timeout_s=0)
    assert out["status"] == "failed"
    assert out["error"] == "model and trainer setup: OutOfMemoryError: CUDA out of memory"
    assert read_result(work).error == out["error"]

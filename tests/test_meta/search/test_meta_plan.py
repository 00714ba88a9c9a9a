"""The dry-run plan (`python -m meta.run ... dry_run=true`): validates, prints arrays, the sbatch script, resources,
GPU-hours and disk, and neither writes a run dir nor calls the scheduler."""
from __future__ import annotations

import logging

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meta.search.plan import disk_plan, known_shape, model_shape
from meta.compose import compose
from meta.search.run import main
from plan_inputs import ONE_MEMBER_AT_15S

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MBPP_LOCAL = [f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}", f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}",
              "task.validation_size=2"]
#: a local directory where staging would put Qwen3's snapshot: the hub is out of reach here, and a dry run with the
#: model unstaged offline exits 2 (docs/usage.md "Staged, offline members"); a plan reads no weights
STAGED_MODEL = [f"model.name_or_path={FIXTURES}"]
SCHEDULER_COMMANDS = ("sbatch", "sacct", "squeue", "scontrol", "scancel", "srun", "sacctmgr", "sinfo")


def _failing_scheduler(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose SLURM commands record that they were called, then fail."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scheduler_calls.log"
    bin_dir.mkdir()
    for name in SCHEDULER_COMMANDS:
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {calls}\necho 'no scheduler in a dry run' >&2\nexit 1\n")
        shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, calls


def test_mbpp_dry_run_at_population_180_prints_the_plan_and_touches_nothing(tmp_path):
    env, calls = _failing_scheduler(tmp_path)
    run_dir = tmp_path / "would_be_run"
    proc = subprocess.run(
        [sys.executable, "-m", "meta.run", "experiment=mbpp_qwen3", "launcher=slurm", "population=180",
         "generations=15", "dry_run=true", f"run_dir={run_dir}", "new=true", *MBPP_LOCAL, *STAGED_MODEL,
         *ONE_MEMBER_AT_15S],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert not calls.exists(), f"the dry run called the scheduler: {calls.read_text()}"
    assert not run_dir.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bin"]
    assert "per member: 1 GPU, 4 CPU" in out and "memory 32 GB" in out
    assert "#SBATCH --gpus-per-node=1" in out and "#SBATCH --cpus-per-task=4" in out
    # 180 members + the control member (the centre) per generation
    assert "#SBATCH --array=0-180%181" in out and "#SBATCH --mem=32768M" in out
    assert "#SBATCH --job-name=mirror-es.RUNID.g0000.c000" in out and "#SBATCH --time=619" in out
    assert "assumed 1001 (SLURM's default; set launcher.max_array_size" in out
    # (181 members x 15 generations + (3 + 1) x 3 selection runs + 8 rows x 3 reporting runs) x 412 min x 1 GPU
    assert "= 2751" in out and "= 18,890.2 GPU-h" in out
    # the time per member follows from the measured step time, and says where that was measured
    assert ("time per member: 412 min expected (resources.step_time_s=15 s/step x train.steps=1600 + "
            "resources.overhead_min=12 min; step time measured: scripts/gpu_pass.sh bench:persistent_compiled:x1") in out
    assert "WARNING: inner.timeout_s" not in out  # 1.5x the expected time
    # worst case: every run uses its 10.3 h budget twice (retries=1)
    assert "retried retries=1 time(s) = 56,670.6 GPU-h" in out
    assert "69,730,304 trainable parameters" in out and "= 0.84 GB and 11 files per checkpoint" in out
    assert "16 written per member" in out
    assert "disk per generation: peak 151.45 GB (181 checkpoints" in out


def test_dry_run_splits_at_the_configured_array_size_and_shows_local_gpu_pass_through(tmp_path, capsys):
    synth = ["inner.entrypoint=meta.synthetic:member", "dry_run=true", "population=130", "control_member=false"]
    assert main([f"run_dir={tmp_path / 'a'}", "new=true", "launcher=slurm", "launcher.max_array_size=50",
                 "launcher.array_parallelism=20", *synth]) == 0
    out = capsys.readouterr().out
    assert ("arrays per generation: 3: 50 tasks (--array=0-49%20), 50 tasks (--array=0-49%20), "
            "30 tasks (--array=0-29%20); split size from launcher.max_array_size") in out
    assert "at most 20 members of a generation run at once" in out
    assert main([f"run_dir={tmp_path / 'b'}", "new=true", *synth, "launcher.array_parallelism=7"]) == 0
    out = capsys.readouterr().out
    assert "launcher=local: each member on this machine, 7 processes at once" in out
    assert "members see no GPU (launcher.gpus_per_node=0)" in out and "#SBATCH" not in out
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_bad_config_still_fails_in_a_dry_run(tmp_path, capsys):
    assert main([f"run_dir={tmp_path / 'r'}", "new=true", "dry_run=true", "launcher=slurm", "launcher.cpus_per_task=0"]) == 2
    assert "launcher.cpus_per_task" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_qwen3_lora_and_full_parameter_counts_follow_from_the_published_shape():
    shape = known_shape("qwen3_1_7b")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # per layer: r x (in + out) summed: q 64x4096, k 64x3072, v 64x3072, o 64x4096, gate/up/down 64x8192 each
    assert shape.lora_parameters(64, targets) == 28 * 64 * (4096 + 3072 + 3072 + 4096 + 3 * 8192) == 69_730_304
    assert 1.6e9 < shape.parameters() < 1.8e9  # "Qwen3-1.7B"
    with pytest.raises(ValueError, match="lm_head"):
        shape.lora_parameters(8, ["lm_head"])


def test_tiny_model_count_matches_its_measured_checkpoint():
    # The tiny preset's model.safetensors measured 356,880 bytes: 88,704 float32 weights + a 2,064-byte header.
    shape = model_shape(compose([])["model"])
    assert shape is not None and shape.parameters() == 88_704


@pytest.mark.parametrize("policy,steady,kept", [("none", 1, 0), ("last", 1, 1), ("all", 16, 16)])
def test_disk_plan_follows_the_checkpoint_policy(policy, steady, kept):
    raw = compose(["experiment=mbpp_qwen3"])
    raw["train"]["keep_checkpoints"] = policy
    disk = disk_plan(raw, 1600)
    assert disk is not None and (disk.written, disk.steady, disk.kept) == (16, steady, kept)
    assert disk.bytes_per_checkpoint == 69_730_304 * 4 * 3
    assert disk_plan({**raw, "model": {**raw["model"], "name": "hub"}}, 1600) is None


def test_a_dry_run_of_a_resume_plans_the_remaining_generations_and_changes_nothing(tmp_path, capsys, caplog):
    run_dir = tmp_path / "run"
    synth = ["inner.entrypoint=meta.synthetic:member", "population=4"]
    assert main([f"run_dir={run_dir}", "new=true", "launcher=debug", "generations=1", *synth]) == 0
    before = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="meta.search.resume"):
        assert main([f"run_dir={run_dir}", "generations=3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert f"resume of the search in {run_dir}" in out and "generations 1..2 (2 to run)" in out
    # how this invocation runs is no changed setting of the search; generations is
    assert "generations: 1 -> 3" in caplog.text and "dry_run:" not in caplog.text
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize("steps,save_every,limit,written,steady", [
    (10, 4, 1, 3, 1),      # saves at 4, 8 and the final step 10; rotation keeps 1
    (1600, 100, 2, 16, 2),  # save_total_limit=2 keeps a spare while training
    (1600, 100, None, 16, 16),  # no rotation: every checkpoint stays until the member finishes
])
def test_disk_plan_counts_the_final_save_and_the_trainers_rotation(steps, save_every, limit, written, steady):
    raw = compose(["experiment=mbpp_qwen3"])
    raw["train"].update(save_every=save_every, save_total_limit=limit, keep_checkpoints="none")
    disk = disk_plan(raw, steps)
    assert disk is not None and (disk.written, disk.steady, disk.kept) == (written, steady, 0)


def test_the_plan_warns_when_the_timeout_leaves_less_than_1_3x_the_expected_time(tmp_path, capsys):
    synth = ["inner.entrypoint=meta.synthetic:member", "new=true", "dry_run=true", "launcher=debug", "resources.member_time_min=null",
             "resources.step_time_s=6", "train.steps=100", "resources.overhead_min=0"]
    assert main([f"run_dir={tmp_path / 'a'}", *synth, "resources.timeout_factor=1.2"]) == 0
    out = capsys.readouterr().out
    assert "time per member: 10 min expected (resources.step_time_s=6 s/step x train.steps=100" in out
    assert "step time measured: no source given (resources.step_time_source)" in out
    assert "WARNING: inner.timeout_s=720 s is 1.20x the expected 600 s per member, less than 1.3x" in out
    assert main([f"run_dir={tmp_path / 'b'}", *synth, "resources.timeout_factor=1.3"]) == 0
    assert "WARNING: inner.timeout_s" not in capsys.readouterr().out
    assert main([f"run_dir={tmp_path / 'c'}", *synth[:-3]]) == 2  # neither minutes nor a step time
    assert "resources.member_time_min is null and resources.step_time_s is not set" in capsys.readouterr().err

"""Rehearsal of the real path (#14 item 10): the mbpp_qwen3 preset with SmolLM2-135M in place of Qwen3, LoRA as in
the preset, an MBPP fixture in the hub's `full` format (train / validation / test files), members as SLURM array
tasks on the local cluster, end to end through TRL generation, the isolated sandbox (the preset requires it) and
greedy validation on the hub-style validation split, generating with vLLM in the trainer's process (TRL's colocate
mode) when vLLM is installed (scripts/install_vllm.sh; CI installs it), HF generate otherwise. Only what cannot fit a 2-core CPU is shrunk (steps, group
and batch size, completion length); everything else is the preset's."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from results.store.run_store import RunStore
from slurm_helpers import LocalSlurm
from time_limits import scaled

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "fixtures" / "mbpp_rehearsal"
VALIDATION_PROBLEMS = 6  # lines of validation.jsonl

SHRUNK = ["train.steps=2", "train.group_size=4", "train.batch_size=8", "train.max_completion_length=48",
          "train.val_batch_size=6", "train.save_every=1", "train.num_threads=1",
          "resources.gpus=0", "resources.mem_gb=null", "resources.member_time_min=20",
          # one member per array task: the preset packs two per GPU, and CPU members packed two per task are
          # test_slurm_packed.py's; here each member is its own array task, as one per GPU runs
          "resources.members_per_gpu=1",
          # the search's extras (control member, re-evaluation: 15 more SmolLM2 runs) run on this cluster with the
          # tiny model and synthetic members (test_slurm_default_search.py, test_slurm_status.py); here the two
          # members are the preset's training path end to end
          "control_member=false", "reevaluate.top_k=0"]
#: the fastest generation backend measured on this CPU (bench/bench_generation.py, docs/benchmarks.md), if installed
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
if not VLLM_INSTALLED and os.environ.get("MIRROR_ES_REQUIRE_VLLM"):
    raise RuntimeError("MIRROR_ES_REQUIRE_VLLM is set but vLLM is not installed (scripts/install_vllm.sh)")
#: vLLM's CPU build needs AVX2 kernels: ATEN_CPU_CAPABILITY=default breaks its compiled sampler
#: (tests/test_inner_loop/generation/test_vllm_member.py)
VLLM_USED = VLLM_INSTALLED and os.environ.get("ATEN_CPU_CAPABILITY") != "default"
#: with vLLM, HF generate's cache setting is refused (vLLM keeps its own paged cache); without it the preset's compiled
#: static cache runs with dynamo's eager backend: its plumbing and counts, not inductor's minutes of C++ on a CPU
BACKEND = (["++train.trl={use_vllm: true, vllm_mode: colocate, vllm_max_model_length: 1024}", "train.decode_cache=dynamic"]
           if VLLM_USED else ["train.decode_compile_backend=eager"])
#: likewise vLLM's CPU engine runs its dynamo-traced model eagerly (vLLM's own switch for CPU CI, VLLM_CPU_CI_ENV): the
#: inductor's C++ compile of the engine's graphs cost each member ~100 CPU-s here and is no part of the claim
ENGINE_ENV = {"VLLM_CPU_CI_ENV": "1"} if VLLM_USED else {}


def rehearsal_overrides(run_dir: Path) -> list[str]:
    """The command line of the rehearsal: the real preset, SmolLM2 with the preset's LoRA, the local data files."""
    return [f"run_dir={run_dir}", "new=true", "experiment=mbpp_qwen3", "model=smollm2_135m", "model.lora_r=64",
            f"task.train_file={DATA / 'train.jsonl'}",
            f"task.validation_file={DATA / 'validation.jsonl'}", f"task.test_file={DATA / 'test.jsonl'}",
            "launcher=slurm", "population=2", "generations=1", "launcher.poll_interval_s=1",
            "launcher.query_interval_s=5", *SHRUNK, *BACKEND]


def test_the_mbpp_qwen3_preset_runs_end_to_end_as_slurm_array_tasks(slurm_cluster: LocalSlurm,
                                                                     tmp_path: Path) -> None:
    run_dir = tmp_path / "rehearsal"
    done = subprocess.run([sys.executable, "-m", "meta.run", *rehearsal_overrides(run_dir)], cwd=ROOT,
                          env={**os.environ, **ENGINE_ENV}, capture_output=True, text=True, timeout=scaled(1500))
    store = RunStore(run_dir)
    jobs = store.read_jobs(0) if run_dir.exists() else {}
    slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in jobs.values()})
    assert done.returncode == 0, done.stderr[-4000:]
    assert len(jobs) == 2 and all("_" in j["job_id"] for j in jobs.values())  # array tasks
    members = store.read_members()
    assert set(members["status"]) == {"ok"}, members[["status", "error"]]
    assert set(members["val_size"]) == {VALIDATION_PROBLEMS}  # the hub-style validation file, nothing carved
    assert set(members["steps_done"]) == {2}
    assert set(members["generation_backend"]) == {"vllm_colocate" if VLLM_USED else "hf_generate"}
    assert members["mean_response_tokens"].min() > 0
    # the regularizer's gradient share reached every record (0 at step 0 by construction, where the policy is the
    # reference; a later step whose groups all tie has no policy gradient to compare with)
    assert members["diag_regularizer_grad_share"].notna().all()
    if VLLM_USED:
        # LoRA r=64: TRL merges the adapter into the weights it pushes, and the engine (the policy's float32) sampled
        # from the very weights being trained: TRL's importance-sampling ratio of its samples is 1
        assert ((members["diag_importance_sampling_ratio_mean"] - 1.0).abs() < 1e-3).all(), members.filter(like="diag_")
        assert (members["diag_sampling_logp_difference_mean"].between(0.0, 1e-3)).all()
        assert members["fitness"].between(0.0, 1.0).all()

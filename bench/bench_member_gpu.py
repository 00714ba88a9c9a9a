"""One mbpp_qwen3 member per generation backend on a model of Qwen3-1.7B's architecture (random weights), then
1, 2 and 4 such members sharing one device: step time, completion tokens/s and peak memory, side by side with HF
generate.

Why: the preset's cost estimate and the question "should members share a GPU?" rest on how fast a member
generates, and that depends on the backend (TRL's HF generate, transformers' continuous batching, vLLM colocate)
and, for HF generate, on its KV cache (``train.decode_cache``: ``hf_generate_static`` and
``hf_generate_static_compiled`` are HF generate with a static cache, eager or with transformers' compiled decode
step; ``hf_generate_persistent_compiled`` is the member's one static cache for the run with its decode step compiled
once and replayed, inner_loop/generation/decode_step.py; issue 38: HF generate's decode is bound by kernel launches,
which a compiled step over a static cache cuts). For a compiled variant the first step (its compile) is reported
apart ("1st step s"), with the compiles, recompiles and CUDA graph recordings its record counted: a recording or
recompile at every step shows there, which a mean over a few steps would hide.
The model is built in code from Qwen3-1.7B's config (inner_loop/models/from_config.py, cached in the model cache),
in bf16 on the measured device, in a process of its own (this parent never holds a CUDA context): its shapes
decide a step's cost, its weights do not. Every member is a separate process that trains as a member does (its
trainer built by ``build_trainer`` from the preset's inner config, on its device and share of the card; only
shapes, data files, the backend's ``train.trl`` fields and ``train.decode_cache`` are overridden) but neither
saves a checkpoint nor runs the final validation (a random model's fitness says nothing; both cost minutes), and
writes its measurement to a JSON file; this parent prints the tables.

- Data: the MBPP fixture of the SLURM rehearsal (tests/fixtures/mbpp_rehearsal), no hub.
- Per member: the steps after the first (which carries the one-off set-up: CUDA/vLLM initialisation, the paged
  cache) are timed with TRL's ``step_time``; step time = their mean; completion tokens/s = their completion
  tokens / their total time; generation s = the mean of the same steps' ``generate_time`` (the rest of a step is
  what a faster decode cannot save); peak memory = ``torch.cuda.max_memory_allocated`` on CUDA (the trainer's
  and a colocated vLLM's torch allocations in that process), beside ``max_memory_reserved`` (what the process held,
  a static KV cache and CUDA graph pools included); the process's peak RSS on CPU.
- Sharing: N members started at once. Total tokens/s and steps/s = the members' own rates summed; "window" =
  all timed tokens / the span from the first member's first timed step to the last member's last one (lower when
  their timed steps did not overlap: "overlap" is the shared share of that span). With vLLM each member's
  ``vllm_gpu_memory_utilization`` is ``--vllm-memory`` / N, so N engines fit beside each other, and its own
  MASTER_PORT (TRL would give every member 29500 and all but one fail: ``_free_ports``).
- ``--profile-step``: each member trains one step more, profiled with ``torch.profiler`` over the step's named
  ranges (inner_loop/grpo/step_profile.py: generation, rewards, reference and policy forwards, backward,
  optimizer, TRL's bookkeeping) and, on the owned loop, 16 of its token steps (time in the captured step, eager,
  idle); that step is left out of the step time (a profile slows what it records) and its figures are the member's
  ``profile``.
- A random model's rewards are all 0, so every group is tied, and the trainer would retry its once-per-run exact
  gradient share (two extra backward passes) at every step; members skip that measurement
  (``--keep-exact-share`` keeps it) so the timed steps are the steady state of a real run.

    python bench/bench_member_gpu.py --device cuda --steps 5 --members 1,2,4
    python bench/bench_member_gpu.py --device cuda --steps 5 --members 1,2 \
        --backends hf_generate,hf_generate_static,hf_generate_static_compiled,transformers_continuous_batching
    python bench/bench_member_gpu.py --device cuda --steps 10 --members 1 \
        --backends hf_generate,hf_generate_persistent_compiled          # the decode step: >= 8 timed steps
    .venv/bin/python bench/bench_member_gpu.py --device cpu --layers 2 --hidden 128 --heads 2 --kv-heads 1 \
        --head-dim 64 --intermediate 256 --vocab 512 --steps 10 --group-size 4 --batch-size 8 \
        --completion-length 32 --tokenizer tiny --dtype float32 --threads 1 --members 1 \
        --backends hf_generate,hf_generate_persistent_compiled     # the CPU comparison (inductor compiles here too)
    .venv/bin/python bench/bench_member_gpu.py --device cpu --layers 2 --hidden 128 --heads 2 --kv-heads 1 \\
        --head-dim 64 --intermediate 256 --vocab 512 --steps 3 --group-size 2 --batch-size 4 \\
        --completion-length 8 --tokenizer tiny --dtype float32 --threads 1 --members 1,2   # plumbing only
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inner_loop.generation.backends import (  # noqa: E402
    BACKENDS, COMPILE_BACKENDS, CONTINUOUS_BATCHING, DYNAMIC_CACHE, HF_GENERATE, OWNED_LOOP, PERSISTENT_COMPILED,
    PERSISTENT_MERGED, STATIC_CACHE,
    STATIC_COMPILED, VLLM_COLOCATE, VLLM_SERVER)

DATA = ROOT / "tests" / "fixtures" / "mbpp_rehearsal"
ARCHITECTURE = "qwen3_1_7b"
#: ``--model``: the real SmolLM2-135M-Instruct instead of the random Qwen3-architecture model
SMOLLM2 = "smollm2"
#: command-line flag -> the architecture config key it overrides
SHAPE_FLAGS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "intermediate": "intermediate_size",
               "vocab": "vocab_size"}
#: HF generate with a static KV cache, measured as backends of their own: name -> its train.decode_cache
DECODE_CACHE_VARIANTS = {f"{HF_GENERATE}_{cache}": cache
                         for cache in (STATIC_CACHE, STATIC_COMPILED, PERSISTENT_COMPILED, PERSISTENT_MERGED,
                                       OWNED_LOOP)}
#: every name --backends takes
MEASURED = (*BACKENDS, *DECODE_CACHE_VARIANTS)
DEFAULT_BACKENDS = (HF_GENERATE, *DECODE_CACHE_VARIANTS, CONTINUOUS_BATCHING, VLLM_COLOCATE)
#: vLLM's CPU attention kernels take head sizes from 64 up (the brief's eligibility rule on CPU)
VLLM_CPU_MIN_HEAD_DIM = 64
#: what the vLLM probe runs in a member's environment: the device vLLM's platform would use there
VLLM_PROBE = "import vllm\nfrom vllm.platforms import current_platform\nprint(current_platform.device_type)"
#: tokens beyond the longest formatted prompt that vLLM's max_model_len leaves for special tokens
PROMPT_MARGIN_TOKENS = 16
#: below this shared share of the members' timed span, the table warns that their summed rates overstate sharing
MIN_OVERLAP = 0.8
_MIB = 1 << 20


# ------------------------------------------------------------------ which backends can run here
def measured_name(backend: str | None, decode_cache: str | None) -> str | None:
    """The bench's name for what a member ran: its backend, with HF generate's cache where it is not the default
    (the inverse of ``DECODE_CACHE_VARIANTS``; the record's ``generation`` holds both)."""
    if backend == HF_GENERATE and decode_cache not in (None, DYNAMIC_CACHE):
        return f"{backend}_{decode_cache}"
    return backend


def backend_unavailable(backend: str, device: str, head_dim: int) -> str | None:
    """Why ``backend`` cannot be measured on ``device`` (None: it can). vLLM is imported in a child process, so
    this one never loads it."""
    if backend == HF_GENERATE or backend in DECODE_CACHE_VARIANTS:  # static_compiled on the CPU: eager, as transformers
        return None                                                # compiles the decode step on CUDA-class devices only
    if backend == CONTINUOUS_BATCHING:
        try:
            importlib.import_module("transformers.generation").ContinuousBatchingConfig  # noqa: B018
        except (ImportError, AttributeError) as exc:
            return f"transformers has no continuous batching here ({exc})"
        return None
    if backend == VLLM_COLOCATE:
        probe = subprocess.run([sys.executable, "-c", VLLM_PROBE], capture_output=True, text=True, timeout=600,
                               env=member_env(device))
        if probe.returncode:
            return "`import vllm` fails: " + (probe.stderr.strip().splitlines() or ["?"])[-1][:200]
        platform = (probe.stdout.strip().splitlines() or [""])[-1]
        if platform != device:  # a CUDA build with no GPU visible, or a CPU build on a GPU machine
            return f"vLLM here runs on {platform!r}, not {device!r}"
        if device == "cpu" and head_dim < VLLM_CPU_MIN_HEAD_DIM:
            return f"vLLM on CPU needs head_dim >= {VLLM_CPU_MIN_HEAD_DIM} (the model's is {head_dim})"
        return None
    if backend == VLLM_SERVER:
        return "needs a separate vLLM server on its own GPU (docs/trl_options.md): not measured by this bench"
    return f"unknown backend (one of {list(MEASURED)})"


def backend_trl(backend: str, members: int, opts: argparse.Namespace, max_model_len: int | None) -> dict[str, Any]:
    """The ``train.trl`` fields that select ``backend`` for one of ``members`` members sharing the device."""
    if backend == CONTINUOUS_BATCHING:
        return {"use_transformers_continuous_batching": True}
    if backend == VLLM_COLOCATE:
        return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": opts.vllm_memory / members,
                "vllm_max_model_length": max_model_len}
    return {}


# ------------------------------------------------------------------ the member's inner config
def model_overrides(opts: argparse.Namespace) -> dict[str, int]:
    """The architecture keys the command line sets (the rest stay Qwen3-1.7B's)."""
    return {key: getattr(opts, flag) for flag, key in SHAPE_FLAGS.items() if getattr(opts, flag) is not None}


def compose_inner(opts: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """The preset's inner config (task, model, divergence, train) with this bench's shapes, data and model."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    data = Path(opts.data)
    overrides = ["experiment=mbpp_qwen3", f"model.name_or_path={model_dir}", f"task.train_file={data / 'train.jsonl'}",
                 f"task.validation_file={data / 'validation.jsonl'}", f"task.test_file={data / 'test.jsonl'}",
                 f"train.steps={opts.steps + (1 if opts.profile_step else 0)}", "work_dir=unused"]
    for flag, key in (("group_size", "group_size"), ("batch_size", "batch_size"),
                      ("completion_length", "max_completion_length"), ("threads", "num_threads")):
        if getattr(opts, flag) is not None:
            overrides.append(f"train.{key}={getattr(opts, flag)}")
    if opts.dtype:
        overrides.append(f"model.dtype={opts.dtype}")
    if opts.no_isolation:
        overrides.append("task.sandbox.require_isolation=false")
    from inner_loop.config import register_schemas

    register_schemas()  # the train and divergence groups compose on their schemas
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = OmegaConf.to_container(compose("inner", overrides=overrides), resolve=True)
    inner = {k: cfg[k] for k in ("task", "model", "divergence", "train")}
    if opts.tokenizer == "tiny":  # no chat template: prompts go in as plain text
        inner["model"]["chat_template"], inner["model"]["chat_template_kwargs"] = False, {}
    return inner


def vllm_max_model_len(inner: dict[str, Any], model_dir: Path) -> int:
    """The longest formatted training prompt plus the completion budget: vLLM's context, which otherwise defaults to
    the architecture's 40,960 positions and needs a KV cache for one whole such sequence."""
    from transformers import AutoTokenizer

    from inner_loop.models.prompts import format_prompt
    from inner_loop.tasks import build_task

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = inner["model"]
    prompts = [format_prompt(tokenizer, p.prompt, model["chat_template"], model["chat_template_kwargs"])
               for p in build_task(inner["task"]).load("train")]
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    return longest + inner["train"]["max_completion_length"] + PROMPT_MARGIN_TOKENS


# ------------------------------------------------------------------ one member process
def _skip_exact_share() -> None:
    """Make the trainer's exact gradient share report "not measurable" (NaN) without its two backward passes."""
    from inner_loop.grpo import trainer as trainer_module

    if not hasattr(trainer_module, "exact_share"):
        raise RuntimeError("inner_loop.grpo.trainer no longer calls exact_share: update _skip_exact_share")
    trainer_module.exact_share = lambda *args, **kwargs: float("nan")


def _peak_memory(device: str) -> dict[str, Any]:
    import resource

    import torch

    from inner_loop.generation.memory import private_pool_bytes

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    out: dict[str, Any] = {"peak_rss_bytes": rss, "peak_memory_bytes": rss, "peak_memory_kind": "peak RSS"}
    if device == "cuda" and torch.cuda.is_initialized():
        # what the member held from the driver at its peak (its cap counts it; a static KV cache and the CUDA graph
        # pools are held through the backward) beside its peak allocation, and the graph pools at the end
        out.update(peak_memory_bytes=torch.cuda.max_memory_allocated(),
                   peak_memory_kind="torch.cuda.max_memory_allocated",
                   peak_gpu_reserved_bytes=torch.cuda.max_memory_reserved(),
                   graph_pool_bytes=private_pool_bytes(torch.cuda.memory_snapshot())[0])
    return out


def _step_figures(history: list[dict[str, Any]], work_dir: Path, batch_size: int,
                  profiled: bool = False) -> dict[str, Any]:
    """Step time, generation time, tokens/s and the timed window, from the trainer's log and progress.json; a
    profiled last step (``profiled``) is not timed."""
    from core.keys import COMPLETIONS_MEAN_LENGTH, GENERATE_TIME, STEP_TIME
    from results.store.member_files import read_progress

    logs = [h for h in history if STEP_TIME in h]
    if profiled and len(logs) > 2:
        logs = logs[:-1]
    timed = logs[1:] if len(logs) > 1 else logs  # the first step carries the one-off set-up (and any compile)
    times = [h[STEP_TIME] for h in timed]
    tokens = [h[COMPLETIONS_MEAN_LENGTH] * batch_size for h in timed]
    generating = [h[GENERATE_TIME] for h in timed if GENERATE_TIME in h]
    progress = read_progress(work_dir)
    window = [progress.started_at, progress.updated_at] if progress is not None and len(logs) > 1 else None
    return {"steps_logged": len(logs), "steps_timed": len(timed), "step_times_s": times,
            "first_step_s": logs[0][STEP_TIME] if len(logs) > 1 else None,
            "step_s": sum(times) / len(times), "completion_tokens": sum(tokens),
            # the step's generation (the decode) beside the step: the rest is what a faster decode cannot save
            "generate_s": sum(generating) / len(generating) if generating else None,
            "tokens_per_s": sum(tokens) / sum(times), "mean_completion_length": sum(tokens) / len(tokens) / batch_size,
            "window": window}


def _no_checkpoint() -> Any:
    """A callback that cancels every checkpoint save (TRL saves every train.save_every steps and at the end): a bench
    member's steps are what it measures, and a save of its weights and optimizer would only lengthen its run."""
    from transformers import TrainerCallback

    class NoCheckpoint(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            control.should_save = False
            return control

    return NoCheckpoint()


def _train(spec: dict[str, Any], device: dict[str, Any], profile: Any = None) -> Any:
    """The member's trainer, built and set up as a member builds it (inner_loop/member/lifecycle.py: its device, its
    share of the card, its threads), trained for its steps without a checkpoint; the final validation, which a real
    member scores its fitness by, is not run (a random model's fitness says nothing, and it costs minutes).
    ``profile``: a callback that profiles one of the steps."""
    import torch

    from inner_loop.process.gpu_share import apply_memory_share
    from inner_loop.training.setup import build_trainer, prepare

    run = prepare(spec["inner"], spec["seed"], spec["params"])
    device.update(apply_memory_share(device, run.cfg.gpu_memory_fraction, run.cfg.members_per_gpu))
    torch.set_num_threads(run.cfg.train.num_threads)
    work_dir = Path(spec["work_dir"])
    work_dir.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(run, work_dir, spec["seed"])
    trainer.add_callback(_no_checkpoint())  # after TRL's own flow callback: its decision to save is undone
    if profile is not None:
        trainer.add_callback(profile)
    trainer.train()
    return trainer


def member_job(job_file: Path, out_file: Path) -> None:
    """Run one member's training as a member process does (without its validation and checkpoints) and write its
    measurement to ``out_file``."""
    job = json.loads(job_file.read_text())
    started = time.time()
    from inner_loop.member.entry import keep_vllm_out_unless_used

    keep_vllm_out_unless_used(job["spec"]["inner"])  # a process for this one member, as a member's own is
    from inner_loop.member.device import require_device
    from inner_loop.process.gpu_share import out_of_memory_reason

    if job["skip_exact_share"]:
        _skip_exact_share()
    spec = job["spec"]
    out: dict[str, Any] = {"index": spec["index"], "backend": job["backend"], "members": job["members"],
                           "device": job["device"]}
    device: dict[str, Any] = {}
    profile = None
    if job.get("profile_step"):  # the member's last step
        from core.records import MemberSpec
        from inner_loop.grpo.step_profile import StepProfileCallback

        profile = StepProfileCallback(MemberSpec.from_dict(spec).work.stop)
    try:
        device = require_device(spec["inner"])
        trainer = _train(spec, device, profile)
        generation = trainer.generation_summary()
        out.update(status="ok", error=None, decode_counts=generation.get("decode_counts"),
                   ran_as=measured_name(generation.get("backend"), generation.get("decode_cache")),
                   profile=profile.summary if profile is not None else None)
        out.update(_step_figures(trainer.state.log_history, Path(spec["work_dir"]), job["batch_size"],
                                 profiled=profile is not None))
    except Exception as exc:  # the member's failure is its row's, with the reason a member's record would give
        traceback.print_exc()
        out.update(status="failed", error=out_of_memory_reason(exc, device) or f"{type(exc).__name__}: {exc}")
    out["wall_s"] = time.time() - started
    out.update(_peak_memory(job["device"]))
    tmp = out_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(out_file)


# ------------------------------------------------------------------ the parent: N members at once
class GpuSampler:
    """The device's used memory and utilisation every second while members run (nvidia-smi; none without it):
    what N processes take together, which no one process's torch counters see."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (MiB used, utilisation %)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        self._query = ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits",
                       "-i", visible or "0"]

    def __enter__(self) -> "GpuSampler":
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                line = subprocess.run(self._query, capture_output=True, text=True, timeout=10).stdout.strip()
                used, util = (float(x) for x in line.splitlines()[0].split(","))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue
            self.samples.append((used, util))

    def summary(self) -> dict[str, float | None]:
        if not self.samples:
            return {"device_peak_bytes": None, "gpu_util_mean": None}
        return {"device_peak_bytes": max(s[0] for s in self.samples) * _MIB,
                "gpu_util_mean": statistics.mean(s[1] for s in self.samples)}


def member_env(device: str) -> dict[str, str]:
    """A member process's environment: offline (everything is local), and no GPU visible on ``--device cpu``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports, one per vLLM member: TRL's colocate set-up takes MASTER_PORT 29500 when it
    finds it free (trl.trainer.utils._find_free_port), so members started at once all pick it and all but one fail
    with EADDRINUSE; the bench gives each its own (``--shared-master-port`` leaves TRL's choice, to see that)."""
    import socket

    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _failure(index: int, backend: str, members: int, why: str) -> dict[str, Any]:
    return {"index": index, "backend": backend, "members": members, "status": "failed", "error": why}


def run_members(backend: str, members: int, inner: dict[str, Any], opts: argparse.Namespace, work: Path,
                max_model_len: int | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Start ``members`` member processes at once with ``backend``; their measurements and the device's."""
    group = work / f"{backend}-x{members}"
    group.mkdir(parents=True)
    env = member_env(opts.device)
    trl = backend_trl(backend, members, opts, max_model_len)
    ports = _free_ports(members) if backend == VLLM_COLOCATE and not opts.shared_master_port else []
    procs = []
    for index in range(members):
        member_inner = json.loads(json.dumps(inner))
        member_inner["train"]["trl"] = {**member_inner["train"].get("trl", {}), **trl}
        member_inner["train"]["decode_cache"] = DECODE_CACHE_VARIANTS.get(backend, DYNAMIC_CACHE)
        member_inner["train"]["decode_compile_backend"] = opts.compile_backend
        spec = {"run_id": "bench_member_gpu", "generation": 0, "index": index, "seed": opts.seed + index,
                "params": [], "work_dir": str(group / f"member-{index}"), "inner": member_inner}
        job = {"spec": spec, "backend": backend, "members": members, "device": opts.device,
               "batch_size": inner["train"]["batch_size"], "skip_exact_share": not opts.keep_exact_share,
               "profile_step": opts.profile_step}
        job_file, out_file = group / f"job-{index}.json", group / f"out-{index}.json"
        log = group / f"member-{index}.log"
        job_file.write_text(json.dumps(job))
        with log.open("w") as log_handle:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--member-job", str(job_file),
                                     "--member-out", str(out_file)], stdout=log_handle, stderr=subprocess.STDOUT,
                                    env={**env, "MASTER_PORT": str(ports[index])} if ports else env,
                                    cwd=str(ROOT), start_new_session=True)
        procs.append((index, proc, out_file, log))
    results = []
    deadline = time.monotonic() + opts.member_timeout
    try:
        sampler = _wait_members(procs, deadline, opts.device)
    finally:  # the bench stopped (SIGTERM, an error): its members, each in a session of its own, go with it
        for _, proc, _, _ in procs:
            if proc.poll() is None:
                _kill_member(proc)
    for index, proc, out_file, log in procs:
        if out_file.is_file():
            results.append(json.loads(out_file.read_text()))
        else:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            results.append(_failure(index, backend, members, f"exit {proc.returncode}: " + " | ".join(tail)))
    return results, sampler.summary()


def _kill_member(proc: subprocess.Popen) -> None:
    """Kill a member process's whole session (it and its sandbox workers) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _wait_members(procs: list, deadline: float, device: str) -> "GpuSampler | _NoSampler":
    """Wait for every member until ``deadline`` (a late one is killed); the device's samples meanwhile."""
    with GpuSampler() if device == "cuda" else _NoSampler() as sampler:
        for _, proc, _, _ in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_member(proc)
    return sampler


class _NoSampler:
    def __enter__(self) -> "_NoSampler":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def summary(self) -> dict[str, float | None]:
        return {"device_peak_bytes": None, "gpu_util_mean": None}


# ------------------------------------------------------------------ summaries and tables
def single_row(backend: str, result: dict[str, Any] | None, reason: str | None) -> dict[str, Any]:
    """One backend's line of the first table: its lone member's figures, or why it was skipped."""
    if result is None:
        return {"backend": backend, "status": "skipped", "reason": reason}
    row = {"backend": backend, "status": result["status"], "reason": result.get("error"),
           "ran_as": result.get("ran_as")}
    for key in ("step_s", "first_step_s", "generate_s", "tokens_per_s", "peak_memory_bytes", "peak_memory_kind",
                "peak_rss_bytes", "peak_gpu_reserved_bytes", "graph_pool_bytes", "mean_completion_length",
                "steps_timed", "wall_s", "decode_counts", "profile"):
        row[key] = result.get(key)
    return row


def with_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's figures over HF generate's (the baseline), where both were measured."""
    base = next((r for r in rows if r["backend"] == HF_GENERATE and r["status"] == "ok"), None)
    for row in rows:
        ok = base is not None and row["status"] == "ok"
        row["step_ratio"] = row["step_s"] / base["step_s"] if ok else None
        row["tokens_ratio"] = row["tokens_per_s"] / base["tokens_per_s"] if ok else None
        row["memory_ratio"] = (row["peak_memory_bytes"] / base["peak_memory_bytes"]
                               if ok and base["peak_memory_bytes"] else None)


def sharing_row(backend: str, members: int, results: list[dict[str, Any]], device: dict[str, Any]) -> dict[str, Any]:
    """One line of the sharing table: the members' summed rates, the common-window rate and their overlap."""
    ok = [r for r in results if r["status"] == "ok"]
    row: dict[str, Any] = {"backend": backend, "members": members, "ok": len(ok),
                           "errors": [r.get("error") for r in results if r["status"] != "ok"], **device}
    row["tokens_per_s_total"] = sum(r["tokens_per_s"] for r in ok) if ok else None
    row["steps_per_s_total"] = sum(1.0 / r["step_s"] for r in ok) if ok else None
    row["peak_memory_max_bytes"] = max(r["peak_memory_bytes"] for r in ok) if ok else None
    row["peak_memory_sum_bytes"] = sum(r["peak_memory_bytes"] for r in ok) if ok else None
    windows = [r["window"] for r in ok if r.get("window")]
    row["tokens_per_s_window"] = row["overlap"] = None
    if windows and len(windows) == len(ok):
        span = max(w[1] for w in windows) - min(w[0] for w in windows)
        shared = min(w[1] for w in windows) - max(w[0] for w in windows)
        if span > 0:
            row["tokens_per_s_window"] = sum(r["completion_tokens"] for r in ok) / span
            row["overlap"] = max(0.0, shared) / span
    return row


def _decode_counts_text(counts: dict[str, Any] | None) -> str:
    """A compiled decode step's counts over the member's run, for the table (empty for other caches): the persistent
    decoder's CUDA graph recordings (torch's trees), or the owned loop's captures and host reads per token."""
    if not counts:
        return ""
    text = f" ({counts['generate_calls']} generations: {counts['compiles']} compiles, {counts['recompiles']} recompiles"
    if "loop" in counts:  # the owned loop (generation/owned_loop.py): its own captures, replays and host reads
        per_token = counts.get("host_syncs_per_token")
        return (f"{text}, {counts['recordings']} captures, {counts['replays']} replays, "
                f"{'-' if per_token is None else format(per_token, '.3f')} host reads per token)")
    recordings = counts["cudagraph_recordings"]
    return f"{text}, {'-' if recordings is None else recordings} CUDA graph recordings)"


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, spec)


#: the step profile's ranges in the order of a step, with what each line means
PROFILE_ROWS = (("step", "the whole optimizer step"), ("prepare_inputs", "TRL's generation and scoring: own = TRL's "
                "bookkeeping"), ("generate", "generation"), ("rewards", "rewards (their own thread)"),
                ("rewards_wait", "waiting for the rewards after the reference"), ("reference_forward",
                "reference forward"), ("compute_loss", "the loss: own = its arithmetic and metrics"),
                ("policy_forward", "policy forward"), ("backward", "backward"), ("grad_clip", "gradient clipping"),
                ("optimizer", "optimizer step"), ("training_step", "the micro-step: own = not in a range"))


def _column(value: Any, width: int, spec: str) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}s}"


def profile_lines(profile: dict[str, Any]) -> list[str]:
    """A profiled step as lines: per range its calls, host seconds (inclusive and its own), device seconds (the span
    of its kernels) and busy seconds, and host syncs; then the owned loop's 16 token steps."""
    ranges = profile.get("ranges") or {}
    lines = [f"  {'range':18s} {'calls':>5s} {'host s':>8s} {'own s':>8s} {'device s':>8s} {'busy s':>8s} "
             f"{'syncs':>5s}  what"]
    for key, what in PROFILE_ROWS:
        r = ranges.get(key)
        if not r or not r.get("calls"):
            continue
        lines.append(f"  {key:18s} {r['calls']:5d} {r['host_s']:8.3f} {r['own_host_s']:8.3f} "
                     f"{_column(r.get('device_s'), 8, '.3f')} {_column(r.get('busy_s'), 8, '.3f')} "
                     f"{_column(r.get('syncs'), 5, 'd')}  {what}")
    window = profile.get("decode_window")
    if window:
        lines.append(f"  {window['tokens']} token steps of the owned loop, per token: "
                     f"{_fmt(window.get('in_graph_ms'), '.3f')} ms in the captured step, "
                     f"{_fmt(window.get('eager_ms'), '.3f')} ms eager, {_fmt(window.get('idle_ms'), '.3f')} ms idle "
                     f"(device span {_fmt(window.get('device_ms'), '.3f')} ms; host "
                     f"{window['host_ms']:.3f} ms, {window['host_in_step_ms']:.3f} in the replays)"
                     + (f"; {window['note']}" if window.get("note") else ""))
    return lines


def print_tables(summary: dict[str, Any]) -> None:
    """The two tables, ratios beside the figures (the repository's bench convention)."""
    s = summary["settings"]
    name = summary["model"]["architecture"]
    what = ("SmolLM2-135M-Instruct, its own weights and tokenizer" if name == SMOLLM2
            else f"{name} architecture, random weights, tokenizer {s['tokenizer']}")
    print(f"\nmodel: {what} ({summary['model']['parameters'] / 1e6:.1f}M parameters: {summary['model']['config']}), "
          f"dir {summary['model']['dir']}")
    print(f"member: mbpp_qwen3 preset, device {s['device']}, dtype {s['dtype']}, LoRA r={s['lora_r']}, batch "
          f"{s['batch_size']} = {s['batch_size'] // s['group_size']} prompts x G={s['group_size']}, completions <= "
          f"{s['completion_length']} tokens, {s['steps']} steps (first untimed), {s['threads']} threads per member")
    rows = summary["single"]
    print(f"\n{'backend (1 member)':34s} {'status':>7s} {'step s':>8s} {'1st step s':>10s} {'compl. tok/s':>12s} "
          f"{'peak MiB':>9s} {'step / HF':>9s} {'tok/s / HF':>10s} {'mem / HF':>8s}  ran as")
    for r in rows:
        print(f"{r['backend']:34s} {r['status']:>7s} {_fmt(r.get('step_s'), '8.3f')} "
              f"{_fmt(r.get('first_step_s'), '10.3f')} "
              f"{_fmt(r.get('tokens_per_s'), '12.1f')} {_fmt(r.get('peak_memory_bytes'), '9.0f', _MIB)} "
              f"{_fmt(r.get('step_ratio'), '8.2f')}x {_fmt(r.get('tokens_ratio'), '9.2f')}x "
              f"{_fmt(r.get('memory_ratio'), '7.2f')}x  {r.get('ran_as') or r.get('reason') or ''}"
              f"{_decode_counts_text(r.get('decode_counts'))}")
    print(f"(peak memory: {rows[0].get('peak_memory_kind') if rows else '-'}; ratios against {HF_GENERATE})")
    for r in rows:
        if r.get("profile"):
            print(f"\n{r['backend']}: one profiled step (not timed above)")
            for line in profile_lines(r["profile"]):
                print(line)
    print(f"\n{'backend':34s} {'members':>7s} {'ok':>3s} {'tok/s total':>11s} {'steps/s total':>13s} "
          f"{'vs 1 member':>11s} {'tok/s window':>12s} {'overlap':>7s} {'peak MiB/member':>15s} "
          f"{'device MiB':>10s} {'GPU util %':>10s}")
    for r in summary["sharing"]:
        print(f"{r['backend']:34s} {r['members']:7d} {r['ok']:3d} {_fmt(r['tokens_per_s_total'], '11.1f')} "
              f"{_fmt(r['steps_per_s_total'], '13.4f')} {_fmt(r.get('scaling'), '10.2f')}x "
              f"{_fmt(r['tokens_per_s_window'], '12.1f')} {_fmt(r['overlap'], '7.2f')} "
              f"{_fmt(r['peak_memory_max_bytes'], '15.0f', _MIB)} {_fmt(r['device_peak_bytes'], '10.0f', _MIB)} "
              f"{_fmt(r['gpu_util_mean'], '10.0f')}")
        for error in r["errors"]:
            print(f"    failed member: {str(error)[-300:]}")
        if r["members"] > 1 and r["overlap"] is not None and r["overlap"] < MIN_OVERLAP:
            print(f"    timed steps overlapped for {r['overlap']:.0%} of their span: the summed rates are partly "
                  "members running alone; trust the window rate, or raise --steps")


# ------------------------------------------------------------------ main
def _csv_ints(text: str) -> list[int]:
    values = sorted({int(x) for x in text.split(",") if x.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def _csv_backends(text: str) -> list[str]:
    names = list(DEFAULT_BACKENDS) if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in MEASURED]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {unknown}; choose from {list(MEASURED)} or all")
    return list(dict.fromkeys(names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's options; unset shapes and settings keep the model's and the preset's own."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when visible")
    parser.add_argument("--steps", type=int, default=5,
                        help="optimizer steps per member (the first is untimed when there are two or more)")
    for flag, key in SHAPE_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int, default=None,
                            help=f"model {key} (default: Qwen3-1.7B's)")
    parser.add_argument("--group-size", type=int, default=None, help="default: the preset's (32)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the preset's (64)")
    parser.add_argument("--completion-length", type=int, default=None, help="default: the preset's (256)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per member (default: the preset's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="default: the preset's (bfloat16)")
    parser.add_argument("--members", type=_csv_ints, default=[1, 2, 4], help="members sharing the device, e.g. 1,2,4")
    parser.add_argument("--backends", type=_csv_backends, default=list(DEFAULT_BACKENDS),
                        help=f"comma-separated, or all ({','.join(DEFAULT_BACKENDS)})")
    parser.add_argument("--share-backends", type=_csv_backends, default=None,
                        help="backends run with every --members count (default: every measured backend)")
    parser.add_argument("--model", choices=(ARCHITECTURE, SMOLLM2), default=ARCHITECTURE,
                        help=f"{ARCHITECTURE}: its architecture with random weights; {SMOLLM2}: the real SmolLM2-135M")
    parser.add_argument("--tokenizer", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default="inductor",
                        help="train.decode_compile_backend of the persistent_compiled members")
    parser.add_argument("--vllm-memory", type=float, default=0.3,
                        help="share of GPU memory the members' vLLM engines take together (each: this / members)")
    parser.add_argument("--no-isolation", action="store_true",
                        help="task.sandbox.require_isolation=false (where bubblewrap is missing)")
    parser.add_argument("--shared-master-port", action="store_true",
                        help="leave MASTER_PORT to TRL in vLLM members (they race for 29500; see _free_ports)")
    parser.add_argument("--without-alone", action="store_true",
                        help="measure only the --members counts, not also one member alone (a caller that measured "
                             "it already: scripts/gpu_pass.py)")
    parser.add_argument("--profile-step", action="store_true",
                        help="each member trains one step more, profiled (torch.profiler over the step's named ranges "
                             "and 16 of the owned loop's token steps) and left out of the step time")
    parser.add_argument("--keep-exact-share", action="store_true",
                        help="keep the trainer's per-step retries of the exact gradient share (see above)")
    parser.add_argument("--data", default=str(DATA), help="MBPP files train/validation/test.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--member-timeout", type=float, default=3600.0, help="seconds for one group of members")
    parser.add_argument("--work-dir", default=None, help="keep the members' work dirs here (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write every measurement here")
    parser.add_argument("--member-job", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--member-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--build-model", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    opts.argv = list(sys.argv[1:] if argv is None else argv)  # for the model-building child (built_model_source)
    return opts


def parameter_count(config: dict[str, Any]) -> int:
    """The model's parameter count, from a weightless copy on the meta device (no memory, no init)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = dict(config)
    model_config = AutoConfig.for_model(keys.pop("model_type"), **keys)
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(model_config).parameters())


def model_source(opts: argparse.Namespace) -> tuple[str, Path, dict[str, Any]]:
    """The measured model: (its name, its directory, its architecture config). ``--model smollm2`` is the real
    SmolLM2-135M-Instruct (its weights decide the completions' lengths; bench/bench_generation.py), otherwise the
    Qwen3-1.7B architecture with random weights and this command line's shapes."""
    if opts.model == SMOLLM2:
        from inner_loop.config import ModelConfig
        from inner_loop.models.smollm2 import smollm2_model_dir

        if model_overrides(opts):
            raise SystemExit(f"--model {SMOLLM2} has its own shapes: drop {sorted(model_overrides(opts))}")
        model_dir = smollm2_model_dir(ModelConfig(name="smollm2_135m"))
        config = json.loads((model_dir / "config.json").read_text())
        config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
        keep = ("model_type", *SHAPE_FLAGS.values(), "tie_word_embeddings", "rms_norm_eps", "rope_theta")
        return SMOLLM2, model_dir, {k: config[k] for k in keep if k in config}
    from inner_loop.models.from_config import architecture_config, random_model_dir

    config = architecture_config(ARCHITECTURE, model_overrides(opts))
    return ARCHITECTURE, random_model_dir(ARCHITECTURE, model_overrides(opts), tokenizer=opts.tokenizer,
                                          seed=opts.seed, device=opts.device), config


def built_model_source(opts: argparse.Namespace) -> tuple[str, Path, dict[str, Any]]:
    """``model_source``, the random model built first (on CUDA) by a process of its own, which ends before any member
    starts: this parent never holds a CUDA context, whose memory every member's figures would share the card with."""
    if opts.device == "cuda" and opts.model == ARCHITECTURE:
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *opts.argv, "--device", "cuda", "--build-model"],
                       cwd=str(ROOT), env=member_env("cuda"), check=True)
    return model_source(opts)


def run_bench(opts: argparse.Namespace) -> dict[str, Any]:
    """Build the model, measure every backend alone, then the sharing counts; returns the summary."""
    import torch

    if opts.device is None:
        opts.device = "cuda" if torch.cuda.is_available() else "cpu"
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch here")
    architecture, model_dir, config = built_model_source(opts)
    parameters = parameter_count(config)
    inner = compose_inner(opts, model_dir)
    train, model = inner["train"], inner["model"]
    summary: dict[str, Any] = {
        "settings": {"device": opts.device, "dtype": model["dtype"], "lora_r": model["lora_r"], "steps": opts.steps,
                     "batch_size": train["batch_size"], "group_size": train["group_size"],
                     "completion_length": train["max_completion_length"], "threads": train["num_threads"],
                     "tokenizer": opts.tokenizer, "members": opts.members, "exact_share_skipped":
                     not opts.keep_exact_share, "vllm_memory": opts.vllm_memory,
                     "profile_step": opts.profile_step},
        "model": {"architecture": architecture, "config": {k: config[k] for k in SHAPE_FLAGS.values()},
                  "parameters": parameters, "dir": str(model_dir)},
        "single": [], "sharing": [], "runs": {}}
    unavailable = {b: backend_unavailable(b, opts.device, config["head_dim"]) for b in opts.backends}
    max_model_len = vllm_max_model_len(inner, model_dir) if unavailable.get(VLLM_COLOCATE, "x") is None else None
    share = [b for b in (opts.share_backends or opts.backends) if b in opts.backends]
    work = Path(opts.work_dir) if opts.work_dir else Path(tempfile.mkdtemp(prefix="bench_member_gpu-"))
    try:
        for backend in opts.backends:
            if unavailable[backend] is not None:
                summary["single"].append(single_row(backend, None, unavailable[backend]))
                print(f"{backend}: skipped ({unavailable[backend]})", flush=True)
                continue
            alone = [] if opts.without_alone else [1]
            counts = sorted({*alone, *(opts.members if backend in share else [])})
            for members in counts:
                print(f"{backend}: {members} member(s) ...", flush=True)
                results, device = run_members(backend, members, inner, opts, work, max_model_len)
                summary["runs"][f"{backend}-x{members}"] = results
                if members == 1:
                    summary["single"].append(single_row(backend, results[0], None))
                if members in opts.members and backend in share:
                    summary["sharing"].append(sharing_row(backend, members, results, device))
    finally:
        if not opts.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    with_ratios(summary["single"])
    alone = {r["backend"]: r for r in summary["single"] if r["status"] == "ok"}
    for row in summary["sharing"]:
        base = alone.get(row["backend"])
        row["scaling"] = (row["tokens_per_s_total"] / base["tokens_per_s"]
                          if base and row["tokens_per_s_total"] is not None else None)
    return summary


def main(argv: list[str] | None = None) -> None:
    """The parent (tables, optional JSON) or, with the hidden --member-job, one member process."""
    opts = parse_args(argv)
    if opts.member_job:
        member_job(Path(opts.member_job), Path(opts.member_out))
        return
    if opts.build_model:  # the parent's child that builds the model on the device (built_model_source)
        model_source(opts)
        return
    # a SIGTERM (scripts/gpu_pass.py at its budget) unwinds run_members, which kills the members' sessions
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    summary = run_bench(opts)
    if opts.json:  # first: the measurements outlive a table that fails to print
        Path(opts.json).write_text(json.dumps(summary, indent=1))
    print_tables(summary)


if __name__ == "__main__":
    main()

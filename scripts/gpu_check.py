"""The GPU acceptance run: the project's main job, for real, on this machine's GPU, offline, in a few minutes.

Why: every part of the project is tested on CPUs, and the first GPU member ever run failed at its first step on
something no CPU test could see. This runs what a user runs, on the GPU: the CUDA tests, then ``meta.run`` with
``launcher=local`` on the mbpp_qwen3 preset (bf16, LoRA, the sampled neural-mirror form, the sandbox) with a model of
Qwen3-1.7B's architecture at reduced depth with random weights (built in code: no hub), the tiny tokenizer and the
MBPP fixture; 1 generation of 2 members (sharing the GPU: resources.members_per_gpu=2) plus the control member,
searched by es=openai_es_elite (no evotorch, no ray: what an air-gapped node can run), a minimal re-evaluation (the
top member and the centre on 2 seeds, the exported init and the base model on 2 reporting seeds), ``meta.export``,
and ``inner_loop.run`` with the exported init, decoding over the member's one static KV cache with the decode step
compiled once (``train.decode_cache=persistent_compiled``; its record's decode counts must show the cache kept, the
weights in place, recompiles within the buckets and CUDA graph recordings bounded). It then checks that every record names the device it should (``cuda`` on a GPU
machine) and that members shared the GPU, and prints each member's step time, peak GPU memory and partners.

Without CUDA it runs the same path on the CPU at small shapes (``--device cpu``, what tests/scripts/test_gpu_check.py
runs), the CUDA tests skipped with the reason printed.

    scripts/gpu_check.sh                    # on a GPU machine: ~5 minutes on one H100 (4.8 measured)
    scripts/gpu_check.sh --device cpu       # the same path on the CPU, small shapes
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inner_loop.generation.decode_step import decode_counts_problem  # noqa: E402
from results.store.gpu_share import read_gpu_share, share_text  # noqa: E402
from results.store.layout import PROGRESS_FILE, RESULT_FILE  # noqa: E402

logger = logging.getLogger("gpu_check")

DATA = ROOT / "tests" / "fixtures" / "mbpp_rehearsal"
CUDA_TESTS = ["tests/test_mirror_maps/test_mirror_maps_cuda.py", "tests/test_inner_loop/grpo/test_trainer_cuda.py",
              "tests/test_inner_loop/process/test_gpu_share_cuda.py",
              "tests/test_inner_loop/generation/test_decode_step_cuda.py"]
ARCHITECTURE = "qwen3_1_7b"
#: train.decode_cache of the single run (the search keeps the preset's): the member's one static cache and decode step
#: compiled once (CUDA graphs on a GPU); its record's decode_counts must show the cache kept and recordings bounded
SINGLE_DECODE_CACHE = "persistent_compiled"
#: the decode step's compile backend per device: inductor on the GPU (what a search runs); on the CPU the check is
#: the plumbing and the counts, so dynamo traces without inductor's minutes of C++ compiling
COMPILE_BACKEND = {"cuda": "inductor", "cpu": "eager"}
#: Qwen3-1.7B's shapes at reduced depth on a GPU; small shapes on the CPU (what a step costs is not the point there)
SHAPES = {"cuda": {"num_hidden_layers": 4},
          "cpu": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                  "head_dim": 64, "intermediate_size": 256, "vocab_size": 512}}
#: the preset's training shrunk to a few steps; the rest (LoRA, the form, temperature, clipping, sandbox) is the preset's
SHRUNK = ["train.steps=3", "train.group_size=4", "train.batch_size=8", "train.max_completion_length=32",
          "train.val_batch_size=6", "train.save_every=2", "train.eval_every=null", "resources.member_time_min=20"]
#: every run decodes as the preset does (its compiled static cache), with the decode step's backend of the device
PER_DEVICE = {"cuda": ["resources.gpus=1", "model.dtype=bfloat16",
                       f"train.decode_compile_backend={COMPILE_BACKEND['cuda']}"],
              "cpu": ["resources.gpus=0", "model.dtype=float32", "train.num_threads=1", "resources.mem_gb=null",
                      f"train.decode_compile_backend={COMPILE_BACKEND['cpu']}"]}
#: straggler_grace: with fewer slots than members (one GPU), the control member starts only when a member ends; the
#: default grace (0.5 x the median member time after the quorum) would cancel it as late
#: on the GPU the search's members share it two by two (resources.members_per_gpu=2: each holds half the card, an
#: antithetic pair side by side); the single run has the card alone
SHARED_SEARCH = {"cuda": ["resources.members_per_gpu=2"], "cpu": ["resources.members_per_gpu=1"]}
#: es=openai_es_elite: the authors' antithetic OpenAI-ES needs neither evotorch nor ray (evotorch imports ray at import
#: time, and ray's 79 MB wheel cannot be carried to an air-gapped node: scripts/node_bundle.sh); one generation (its
#: tell and the centre's move are the searcher's, tested on CPUs) keeps the run within ~5 minutes on one H100 (4.8 measured)
#: what the check prints of the single run's decode counts
DECODE_COUNTS_SHOWN = ("generate_calls", "compiles", "recompiles", "cudagraph_recordings", "weights_moved",
                       "cache_kept", "buckets_used", "compile_backend", "compile_mode")
SEARCH = ["es=openai_es_elite", "population=2", "generations=1", "control_member=true", "straggler_grace=5",
          "reevaluate.top_k=1", "reevaluate.seeds=2", "reevaluate.report_seeds=2", "reevaluate.baselines=[base]",
          "launcher=local"]


def cuda_device() -> str | None:
    """The GPU's name, or None (with the reason logged) where CUDA is not usable here."""
    import torch

    if not torch.cuda.is_available():
        logger.info("no usable CUDA device (torch %s, CUDA build %s, CUDA_VISIBLE_DEVICES=%r)", torch.__version__,
                    torch.version.cuda, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return None
    return torch.cuda.get_device_name(0)


def run(args: list[str], env: dict[str, str], what: str, timeout: float) -> float:
    """Run a command of the main job; its seconds. A failure stops the check with its output's tail."""
    started = time.monotonic()
    logger.info("%s: %s", what, " ".join(args))
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: {what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n"
                         f"{done.stderr[-5000:]}")
    return time.monotonic() - started


def model_overrides(device: str, model_dir: Path) -> list[str]:
    return [f"model.name_or_path={model_dir}",
            f"task.train_file={DATA / 'train.jsonl'}", f"task.validation_file={DATA / 'validation.jsonl'}",
            f"task.test_file={DATA / 'test.jsonl'}", *SHRUNK, *PER_DEVICE[device]]


def member_rows(work: Path) -> list[dict[str, Any]]:
    """One row per record the job wrote under ``work``: where, status, device, step time, peak GPU memory."""
    rows = []
    for result in sorted(work.rglob(RESULT_FILE)):
        record = json.loads(result.read_text())
        if "status" not in record:
            continue
        progress_file = result.parent / PROGRESS_FILE
        progress = json.loads(progress_file.read_text()) if progress_file.is_file() else {}
        device = record.get("device") or {}
        rows.append({"record": str(result.parent.relative_to(work)), "status": record["status"],
                     "steps": record.get("steps_done"), "device_type": device.get("type"),
                     "device": device.get("name"), "step_s": progress.get("seconds_per_step"),
                     "peak_gpu_gib": (device.get("peak_memory_bytes") or 0) / 2**30,
                     "shared": share_text(read_gpu_share(result.parent))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: cuda where usable, else cpu (small shapes)")
    parser.add_argument("--work", type=Path, default=None, help="where the job writes (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and timings here")
    parser.add_argument("--skip-cuda-tests", action="store_true",
                        help="leave the CUDA tests out (scripts/gpu_pass.py runs them as a check of their own)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_check: %(message)s")
    started = time.monotonic()
    gpu = cuda_device()
    device = opts.device if opts.device != "auto" else ("cuda" if gpu else "cpu")
    if device == "cuda" and gpu is None:
        raise SystemExit("gpu_check: --device cuda, but CUDA is not usable here (see the line above)")
    logger.info("device: %s", gpu if device == "cuda" else "cpu (CUDA parts skipped: no usable CUDA device)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    timings: dict[str, float] = {}
    if device == "cuda" and not opts.skip_cuda_tests:
        timings["cuda tests"] = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS],
                                    env, "the CUDA tests", 300)
    else:
        logger.info("the CUDA tests (%s) skipped: %s", ", ".join(CUDA_TESTS),
                    "--skip-cuda-tests" if opts.skip_cuda_tests else "no usable CUDA device")

    from inner_loop.models.from_config import random_model_dir

    model_dir = random_model_dir(ARCHITECTURE, SHAPES[device], tokenizer="tiny")
    work = opts.work or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    run_dir, init, single_dir = work / "search", work / "exported.safetensors", work / "single"
    overrides = ["experiment=mbpp_qwen3", *model_overrides(device, model_dir)]
    timings["meta.run"] = run([sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", *overrides, *SEARCH,
                               *SHARED_SEARCH[device]],
                              env,
                              "the search (meta.run)", 1800)
    timings["meta.export"] = run([sys.executable, "-m", "meta.export", f"run_dir={run_dir}", f"out={init}"], env,
                                 "the export", 300)
    timings["inner_loop.run"] = run([sys.executable, "-m", "inner_loop.run", *overrides, f"divergence.init={init}",
                                     f"work_dir={single_dir}", f"train.decode_cache={SINGLE_DECODE_CACHE}"], env,
                                    "a single run with the exported init", 900)
    rows = member_rows(work)
    print(f"{'record':<44} {'status':<8} {'steps':>5} {'device':<28} {'s/step':>7} {'peak GPU GiB':>12}  shared")
    for row in rows:
        step = f"{row['step_s']:.2f}" if row["step_s"] else "-"
        print(f"{row['record']:<44} {row['status']:<8} {row['steps'] or 0:>5} {(row['device'] or '-')[:28]:<28} "
              f"{step:>7} {row['peak_gpu_gib']:>12.2f}  {row['shared'] or '-'}")
    for what, seconds in timings.items():
        print(f"{what}: {seconds:.0f} s")
    print(f"total: {time.monotonic() - started:.0f} s")
    if opts.json:
        opts.json.write_text(json.dumps({"device": device, "gpu": gpu, "rows": rows, "timings": timings}, indent=1))
    wrong = [r for r in rows if r["status"] != "ok" or r["device_type"] != device]
    single = json.loads((single_dir / RESULT_FILE).read_text())
    single_cache = (single.get("generation") or {}).get("decode_cache")
    if single_cache != SINGLE_DECODE_CACHE:
        print(f"gpu_check: FAILED: the single run decoded with {single_cache!r}, not {SINGLE_DECODE_CACHE!r}",
              file=sys.stderr)
        return 1
    counts = (single.get("generation") or {}).get("decode_counts") or {}
    print(f"single run's decoding: {json.dumps({k: counts.get(k) for k in DECODE_COUNTS_SHOWN})}")
    problem = decode_counts_problem(single)
    if problem:
        print(f"gpu_check: FAILED: the single run's decoding: {problem}", file=sys.stderr)
        return 1
    if device == "cuda" and not any(row["shared"] for row in rows):
        print("gpu_check: FAILED: resources.members_per_gpu=2, but no member shared its GPU", file=sys.stderr)
        return 1
    if not rows or wrong:
        print(f"gpu_check: FAILED: {len(wrong)} record(s) not ok on {device}: {wrong}", file=sys.stderr)
        return 1
    print(f"gpu_check: OK: {len(rows)} records, every one trained on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

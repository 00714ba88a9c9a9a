"""Step time and completion tokens/s of the rehearsal: the mbpp_qwen3 preset on SmolLM2-135M (LoRA r=64 as the
preset) over the MBPP fixture, one in-process member per variant, side by side with a baseline.

Baseline: the same run with `divergence=none` (no reference forward, no mirror map); the preset's neural mirror
map (sampled form, coef 10) is then reported as a ratio to it, so the figure reads as "what the regularizer costs
per step". Shapes default to the SLURM rehearsal's (tests/slurm/test_slurm_rehearsal.py); pass the preset's own
(--group-size 32 --batch-size 64 --completion 256) on a machine that can afford them.

    .venv/bin/python bench/bench_rehearsal.py --steps 3 --threads 2
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "fixtures" / "mbpp_rehearsal"
VARIANTS = {"baseline (divergence=none)": ["divergence=none"], "preset (neural_mirror, coef 10)": []}


def _inner(work_dir: Path, opts: argparse.Namespace, extra: list[str]) -> dict:
    overrides = ["experiment=mbpp_qwen3", "model=smollm2_135m", "model.lora_r=64",
                 f"task.train_file={DATA / 'train.jsonl'}", f"task.validation_file={DATA / 'validation.jsonl'}",
                 f"task.test_file={DATA / 'test.jsonl'}", f"train.steps={opts.steps}",
                 f"train.group_size={opts.group_size}", f"train.batch_size={opts.batch_size}",
                 f"train.max_completion_length={opts.completion}", f"train.num_threads={opts.threads}",
                 "train.val_batch_size=6", "train.keep_checkpoints=last", f"train.save_every={opts.steps}",
                 # what the regularizer costs a step, not the decode: the preset's compiled static cache is a GPU
                 # setting (bench/bench_member_gpu.py measures it), on a CPU inductor's compile would swamp 3 steps
                 "train.decode_cache=dynamic", f"work_dir={work_dir}", *extra]
    from inner_loop.config import register_schemas

    register_schemas()  # the train and divergence groups compose on their schemas
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = OmegaConf.to_container(compose("inner", overrides=overrides), resolve=True)
    return {k: cfg[k] for k in ("task", "model", "divergence", "train")}


def _measure(opts: argparse.Namespace, extra: list[str]) -> dict[str, float]:
    from inner_loop.training.checkpoints import CHECKPOINT_DIR
    from inner_loop.member.lifecycle import train_in_process
    from core.keys import COMPLETIONS_MEAN_LENGTH, GRAD_SHARE_DIAGNOSTIC, STEP_TIME

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "member"
        record = train_in_process({"run_id": "bench", "generation": 0, "index": 0, "seed": opts.seed, "params": [],
                                   "work_dir": str(work), "inner": _inner(work, opts, extra)})
        if not record.ok:
            raise RuntimeError(f"the member failed: {record.error}")
        state = json.loads(next((work / CHECKPOINT_DIR).glob("checkpoint-*/trainer_state.json")).read_text())
    steps = [h for h in state["log_history"] if STEP_TIME in h][1:]  # step 0 includes one-off set-up
    step_time = statistics.median(h[STEP_TIME] for h in steps)
    tokens = statistics.median(h[COMPLETIONS_MEAN_LENGTH] * opts.batch_size / h[STEP_TIME] for h in steps)
    return {"step_s": step_time, "tokens_per_s": tokens, "fitness": record.fitness, "wall_s": record.wall_time_s,
            "grad_share": record.diagnostics.get(GRAD_SHARE_DIAGNOSTIC, float("nan"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--completion", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"SmolLM2-135M LoRA r=64, mbpp_qwen3 preset, batch {opts.batch_size} (G={opts.group_size}), completion "
          f"<= {opts.completion} tokens, {opts.steps} steps (median of steps 1..), {opts.threads} threads")
    results = {name: _measure(opts, extra) for name, extra in VARIANTS.items()}
    base = results["baseline (divergence=none)"]
    print(f"{'variant':34s} {'step s':>8s} {'tokens/s':>9s} {'step ratio':>10s} {'grad share':>10s} {'wall s':>7s}")
    for name, r in results.items():
        print(f"{name:34s} {r['step_s']:8.2f} {r['tokens_per_s']:9.1f} {r['step_s'] / base['step_s']:10.2f}x "
              f"{r['grad_share']:10.3g} {r['wall_s']:7.1f}")


if __name__ == "__main__":
    main()

"""Regularizer gradient share ||grad coef*D|| / ||grad policy term|| of real GRPO runs, per divergence coefficient.

For each form (sampled, full) and coefficient, one short training run of the member code path (same trainer,
config validation, task, LoRA) from the same seed. At EVERY step (not only once, as in a member) the first batch
gets the exact share w.r.t. the trainable parameters, beside the cheap per-step estimate the members log (w.r.t.
the sampled-token log-probs, or the logits for the full form), so the table also shows how the estimate tracks
the exact value. Step 0 is left out: there the policy equals the reference and the share is 0 by construction.

    .venv/bin/python bench/bench_grad_share.py [--model smollm2_135m] [--steps 4] [--threads 2]
        [--coefs 1e-4,1e-3,1e-2,1e-1,1] [--forms sampled,full] [--lr 1e-5]

Prints one row per (form, coefficient): exact share per step, estimate per step, their ratio, reward, seconds.
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers import TrainerCallback  # noqa: E402

from inner_loop.training.setup import build_trainer as _build_trainer, prepare  # noqa: E402
from core.keys import GRAD_SHARE, GRAD_SHARE_EXACT, GRAD_SHARE_EXACT_STEP, REWARD  # noqa: E402


def _inner(args: argparse.Namespace, form: str, coef: float) -> dict:
    load = lambda group, name: yaml.safe_load((ROOT / "conf" / group / f"{name}.yaml").read_text())  # noqa: E731
    model = load("model", args.model)
    # The Qwen3 presets' adapter (LoRA r=64, alpha 64 on attention and MLP) and dtype; prompts without the chat
    # template so the 135M model answers "37+05=" with a number often enough to give groups unequal rewards.
    model.update({"lora_r": args.lora_r, "lora_alpha": args.lora_r, "chat_template": False})
    divergence = load("divergence", "neural_mirror")  # U(0, 0.01) map, seed 42: the authors' init
    divergence.update({"form": form, "coef": coef})
    train = load("train", "default")
    train.update({"steps": args.steps, "batch_size": args.batch_size, "group_size": args.group_size,
                  "max_completion_length": args.completion, "learning_rate": args.lr, "lr_scheduler": "constant",
                  "num_threads": args.threads, "save_every": 10_000, "val_size": 1, "temperature": 1.0,
                  "aggregation": "dr_grpo"})
    # One-digit sums, unpadded: SmolLM2-135M gets some right by chance (its first integer is often an operand),
    # enough for groups of 8 with unequal rewards, i.e. a policy gradient to compare with.
    task = load("task", "arith")
    task.update({"min_digits": 1, "max_digits": 1, "prompt_template": "{a}{op}{b}=", "train_size": 30,
                 "validation_size": 4, "test_size": 4})
    return {"task": task, "model": model, "divergence": divergence, "train": train}


class _ExactEveryStep(TrainerCallback):
    """Ask the trainer for the exact (parameter-space) share on the first batch of every step from step 1."""

    def __init__(self) -> None:
        self.trainer = None

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003 - transformers' signature
        self.trainer._exact_share_step = max(1, state.global_step)


def _run(args: argparse.Namespace, form: str, coef: float, work: Path) -> dict:
    torch.manual_seed(args.seed)
    run = prepare(_inner(args, form, coef), seed=args.seed)
    trainer = _build_trainer(run, work, args.seed)
    callback = _ExactEveryStep()
    callback.trainer = trainer
    trainer.add_callback(callback)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    exact, estimate, reward = {}, {}, []
    for entry in trainer.state.log_history:
        step = entry.get(GRAD_SHARE_EXACT_STEP)
        if isinstance(entry.get(GRAD_SHARE_EXACT), float) and step is not None:
            exact[int(step)] = entry[GRAD_SHARE_EXACT]
        if "step" in entry and isinstance(entry.get(GRAD_SHARE), float):
            estimate[int(entry["step"]) - 1] = entry[GRAD_SHARE]  # logged after the step's update
        if isinstance(entry.get(REWARD), float):
            reward.append(entry[REWARD])
    return {"exact": exact, "estimate": estimate, "mean_reward": sum(reward) / max(len(reward), 1), "seconds": seconds}


def _fmt(values: dict[int, float], steps: list[int]) -> str:
    return " ".join(f"{values[s]:.2e}" if s in values and math.isfinite(values[s]) else "   n/a  " for s in steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--coefs", default="1e-4,1e-3,1e-2,1e-1,1")
    parser.add_argument("--forms", default="sampled,full")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--lora-r", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    steps = list(range(1, args.steps))
    print(f"model={args.model} lora_r={args.lora_r} lr={args.lr} batch={args.batch_size} G={args.group_size} "
          f"completion<={args.completion} steps={args.steps} threads={args.threads} neural_mirror U(0,0.01) seed 42")
    print(f"{'form':8} {'coef':>7}  exact share at steps {steps}  | estimate at the same steps | est/exact | "
          "reward | s")
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms.split(","):
            for coef in (float(c) for c in args.coefs.split(",")):
                out = _run(args, form, coef, Path(tmp) / f"{form}_{coef:g}")
                ratios = [out["estimate"][s] / out["exact"][s] for s in steps
                          if s in out["exact"] and s in out["estimate"] and out["exact"][s] > 0]
                ratio = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "n/a"
                print(f"{form:8} {coef:7.0e}  {_fmt(out['exact'], steps)} | {_fmt(out['estimate'], steps)} | "
                      f"{ratio} | {out['mean_reward']:.2f} | {out['seconds']:.0f}", flush=True)


if __name__ == "__main__":
    main()

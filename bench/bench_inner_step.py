"""Training-step throughput of MirrorGRPOTrainer vs the unmodified TRL GRPOTrainer with its own KL (beta > 0).

Same tiny model directory, data, reward, batch and lengths for every variant; the variants run interleaved for
several rounds so background load hits all of them alike. Per-step time is TRL's own `step_time` metric
(generation + loss + backward + optimizer), first step of each run dropped, median over the rest. The learning
rate is ~0 so the weights do not move and every variant generates the same completions: the comparison is of
equal work, not of how long each variant's completions happen to become.

    .venv/bin/python bench/bench_inner_step.py [--steps 12] [--rounds 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inner_loop.config import DivergenceConfig, ModelConfig  # noqa: E402
from inner_loop.models.loading import load_policy  # noqa: E402
from inner_loop.models.tiny import tiny_model_dir  # noqa: E402
from inner_loop.loss.regularizers import build_regularizer  # noqa: E402
from inner_loop.tasks import build_task  # noqa: E402
from inner_loop.grpo.trainer import MirrorGRPOTrainer  # noqa: E402
from core.keys import STEP_TIME  # noqa: E402

VARIANTS = {
    "trl_kl (baseline, beta=0.04)": None,
    "prob_l2 sampled": DivergenceConfig(name="prob_l2", form="sampled", coef=0.1),
    "neural_mirror sampled": DivergenceConfig(name="neural_mirror", form="sampled", coef=1e-4),
    "neural_mirror sampled_is": DivergenceConfig(name="neural_mirror", form="sampled_is", coef=1e-4),
    "prob_l2 full": DivergenceConfig(name="prob_l2", form="full", coef=0.1),
    "neural_mirror full": DivergenceConfig(name="neural_mirror", form="full", coef=1e-4),
}


def _step_times(variant: DivergenceConfig | None, model_dir: str, work: Path, steps: int, seed: int) -> list[float]:
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    task = build_task({"name": "arith"})
    problems = task.load("train")
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems], "idx": list(range(len(problems)))})

    def reward(completions, idx, **_):
        return task.score_many([problems[i] for i in idx], completions)

    args = GRPOConfig(output_dir=str(work), per_device_train_batch_size=32, num_generations=8,
                      max_completion_length=8, loss_type="dr_grpo", scale_rewards="none", report_to=[],
                      use_cpu=True, bf16=False, max_steps=steps, logging_steps=1, save_strategy="no",
                      disable_tqdm=True, seed=seed, beta=0.04 if variant is None else 0.0,
                      learning_rate=1e-12)  # weights stay put: every variant generates the same completions
    if variant is None:  # TRL as shipped: it loads the policy and re-loads the reference by path
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=data)
    else:
        model, tok = load_policy(ModelConfig(), model_dir)
        trainer = MirrorGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                                    processing_class=tok, regularizer=build_regularizer(variant))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    times = [h[STEP_TIME] for h in trainer.state.log_history if STEP_TIME in h]
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(opts.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(tiny_model_dir(ModelConfig(), root=Path(tmp)))
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_index in range(opts.rounds):
            for name, variant in VARIANTS.items():
                samples[name] += _step_times(variant, model_dir, Path(tmp) / "run", opts.steps, round_index)
    base = statistics.median(samples["trl_kl (baseline, beta=0.04)"])
    print(f"tiny model (hidden 64, 2 layers), batch 32 = 4 prompts x 8, completion <= 8 tokens, "
          f"{opts.threads} thread(s), {opts.rounds} rounds x {opts.steps - 1} timed steps")
    print(f"{'variant':32s} {'median step (ms)':>17s} {'steps/s':>8s} {'time vs baseline':>17s}")
    for name, times in samples.items():
        median = statistics.median(times)
        print(f"{name:32s} {1000 * median:17.1f} {1 / median:8.2f} {median / base:16.3f}x")


if __name__ == "__main__":
    main()

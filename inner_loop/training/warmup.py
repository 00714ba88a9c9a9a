"""Cached supervised format warm-up of a model built from scratch (the tiny model), run to a target, not a step count.

A randomly initialised model never produces a correct answer, so RL would see zero reward forever. Supervised
training on the task's demonstrations (prompt -> answer <eos>) gives a policy that is sometimes right; RL then has
something to improve. The warmed model is a directory in the cache keyed by the model, task and warm-up settings,
shared by every population member and built once even when members race.

Why a target: the learning rate stays constant and the warm-up stops mid-learning on purpose (a warm-up annealed to
lr 0 ends in a sharp minimum where any further noisy update first lowers greedy pass@1: 0.44 -> 0.33 after 50
supervised steps at lr 1e-4 on arith). But mid-learning is exactly where the CPU's kernels (AVX2 vs AVX-512,
``ATEN_CPU_CAPABILITY``) and the thread count change the rounding enough to move the model a lot: the same seeded
550-step warm-up gave step-0 validation pass@1 0.665 / 0.555 / 0.135 under default / avx2 / avx512. So the warm-up
checks the probe every ``warmup_check_every`` steps and stops once it is inside ``warmup_band``: every machine starts
RL from a model of the same skill, whatever step count that takes there.

Why the sampled pass@1 (``warmup_signal: sampled``, the default) and not the greedy one: mid-learning, greedy pass@1
jumps between checks (measured on arith, pinned numerics, checks 25 steps apart: 0.51, 0.26, 0.58, 0.37, 0.55, 0.73,
0.51 from step 700 to 900), so the first check inside a greedy band is a draw from that noise: an Intel and an AMD
machine stopped 350 steps apart, and RL from one start gained +0.13 where from the other it lost 0.03. Pass@1 of
temperature-1 samples (fixed sampling seed, two per probe problem) is the reward RL itself sees, and it rises
smoothly (0.17, 0.22, 0.22, 0.29, 0.30, 0.34 over the same checks), so the stop lands on the same skill; its band
[0.30, 0.40] gives RL groups of 8 with a reward to rank in most groups.

With ``model.cpu_numerics: pinned`` (the tiny preset) the warm-up is built under the pinned numerics
(inner_loop/process/pinned.py), in a child process when the caller runs under others, so it is the same model, bit for
bit, on every machine with AVX2; the cache key names the numerics a warmed model was built with.

The probe is the last ``warmup_probe_size`` problems of the TRAINING split, held out of the demonstrations the
warm-up trains on (so it measures skill, not memory); validation and test are never looked at.
"""
from __future__ import annotations

import json
import logging
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import inner_loop.process.pinned as numerics
import inner_loop.process.pinned_child as pinned_child
from inner_loop.config import ModelConfig
from inner_loop.training.evaluate import evaluate
from inner_loop.models.cache import build_once, cache_root, config_digest
from inner_loop.models.loading import load_policy
from inner_loop.tasks.base import Problem, Task

logger = logging.getLogger(__name__)

#: Part of the cache key: bump when the warm-up procedure changes so stale warmed models are not reused.
WARMUP_VERSION = 6
#: Written into the warmed model's directory: how the warm-up ended (steps, probe pass@1, band, CPU kernels).
WARMUP_RECORD = "warmup.json"


def cpu_capabilities() -> list[str]:
    """The ``ATEN_CPU_CAPABILITY`` values this CPU can run, lowest first, for comparing verdicts across kernel sets.

    Asked of the CPU, not of the kernels in use (those follow the variable): a value above what the CPU offers
    is not refused by torch, it kills the process with SIGILL at the first vectorised kernel."""
    supported = ["default"]
    if torch.cpu._is_avx2_supported():
        supported.append("avx2")
    if torch.cpu._is_avx512_supported():
        supported.append("avx512")
    return supported


class WarmupTargetError(ValueError):
    """The warm-up hit its step cap without its probe pass@1 entering the configured band."""


@dataclass
class WarmupOutcome:
    """How a warm-up ended; stored beside the warmed weights."""

    steps: int
    probe_pass_at_1: float
    probe_size: int
    band: list[float]
    final_loss: float
    seconds: float
    cpu_capability: str
    torch_threads: int
    numerics: str = ""


def demonstration_pairs(task: Task, problems: list[Problem]) -> list[tuple[str, str]]:
    """(prompt, completion) pairs for the problems that have a demonstration."""
    pairs = []
    for problem in problems:
        demo = task.demonstration(problem)
        if demo is not None:
            pairs.append((problem.prompt, demo))
    return pairs


def _batch(tokenizer, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask, and labels that score only the completion and its <eos>."""
    rows, label_rows = [], []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=True)["input_ids"]  # as TRL and evaluate.encode_prompts tokenize it
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + c)
        label_rows.append([-100] * len(p) + c)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in label_rows])
    return ids, mask, labels


def split_probe(task: Task, train: list[Problem], probe_size: int) -> tuple[list[Problem], list[tuple[str, str]]]:
    """(probe problems, demonstration pairs of the rest of the training split): the probe is held out of training."""
    with_demo = [p for p in train if task.demonstration(p) is not None]
    if not with_demo:
        raise ValueError(f"model.warmup_max_steps > 0 but task {task.name!r} has no demonstrations to warm up on; "
                         "set model.warmup_max_steps=0")
    if len(with_demo) < probe_size + 1:
        raise ValueError(
            f"model.warmup_probe_size={probe_size} needs more than {probe_size} training problems with "
            f"demonstrations; task {task.name!r} has {len(with_demo)}. Lower model.warmup_probe_size or raise the "
            "task's train_size"
        )
    probe = with_demo[-probe_size:]
    return probe, demonstration_pairs(task, with_demo[:-probe_size])


#: temperature-1 samples per probe problem when the band is read on sampled pass@1 (400 problems: s.e. ~0.016)
PROBE_SAMPLES = 2


def probe_pass_at_1(model, tokenizer, task: Task, probe: list[Problem], cfg: ModelConfig, max_new_tokens: int,
                    step: int) -> float:
    """The warm-up's reading of the probe (``cfg.warmup_signal``): sampled pass@1 under a seed fixed by ``cfg.seed``
    and ``step`` (the training's random state is left as it was), or greedy pass@1."""
    if cfg.warmup_signal == "greedy":
        return evaluate(model, tokenizer, task, probe, max_new_tokens=max_new_tokens, log=False).pass_at_1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 1_000_003 + step)
        result = evaluate(model, tokenizer, task, probe, max_new_tokens=max_new_tokens, log=False, pass_k=(1,),
                          pass_k_samples=PROBE_SAMPLES)
    return result.pass_at_k[1]


def warm_up_to_band(model, tokenizer, pairs: list[tuple[str, str]], task: Task, probe: list[Problem],
                    cfg: ModelConfig, probe_max_new_tokens: int) -> WarmupOutcome:
    """Train ``model`` in place (AdamW, constant lr) until the probe's pass@1 (:func:`probe_pass_at_1`) is inside
    ``cfg.warmup_band``.

    Checks every ``cfg.warmup_check_every`` steps; raises WarmupTargetError naming the band and the values reached
    when ``cfg.warmup_max_steps`` pass without entering it.
    """
    started = time.monotonic()
    low, high = cfg.warmup_band
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.warmup_lr)
    loss_value, probe_value, best = float("nan"), float("nan"), (-1.0, 0)
    for step in range(1, cfg.warmup_max_steps + 1):
        model.train()
        ids, mask, labels = _batch(tokenizer, rng.sample(pairs, min(cfg.warmup_batch_size, len(pairs))))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
        if step % cfg.warmup_check_every and step != cfg.warmup_max_steps:
            continue
        probe_value = probe_pass_at_1(model, tokenizer, task, probe, cfg, probe_max_new_tokens, step)
        best = max(best, (probe_value, step))
        logger.debug("warm-up step %d: loss %.3f, probe pass@1 %.4f", step, loss_value, probe_value)
        if low <= probe_value <= high:
            model.eval()
            return WarmupOutcome(step, probe_value, len(probe), [low, high], loss_value,
                                 time.monotonic() - started, torch.backends.cpu.get_cpu_capability(),
                                 torch.get_num_threads(), numerics.signature())
    raise WarmupTargetError(
        f"the warm-up of model {cfg.name!r} on task {task.name!r} did not reach {cfg.warmup_signal} pass@1 in "
        f"model.warmup_band=[{low}, {high}] on its {len(probe)}-problem probe within model.warmup_max_steps="
        f"{cfg.warmup_max_steps} (checked every {cfg.warmup_check_every} steps): last {probe_value:.4f}, highest "
        f"{best[0]:.4f} at step {best[1]}. Raise model.warmup_max_steps, move model.warmup_band, or change "
        "model.warmup_lr"
    )


def _pinned(cfg: ModelConfig) -> bool:
    return cfg.cpu_numerics == "pinned" and numerics.can_pin()


def warmup_key(cfg: ModelConfig, base_dir: str, task_cfg: dict, probe_max_new_tokens: int) -> str:
    """Cache key of a warmed model: everything that decides which model the warm-up returns, the numerics it is
    built with included (pinned, or this process's kernels, MKL path and threads)."""
    settings = [cfg.warmup_max_steps, cfg.warmup_band, cfg.warmup_check_every, cfg.warmup_probe_size,
                cfg.warmup_lr, cfg.warmup_batch_size, cfg.seed, probe_max_new_tokens, cfg.warmup_signal]
    built_with = f"pinned-{numerics.PINNED_VERSION}" if _pinned(cfg) else numerics.signature()
    return config_digest([WARMUP_VERSION, base_dir, settings, task_cfg, built_with])


def read_warmup_outcome(model_dir: str | Path) -> WarmupOutcome | None:
    """How the warmed model in ``model_dir`` was made (None for a model that was not warmed here)."""
    path = Path(model_dir) / WARMUP_RECORD
    if not path.is_file():
        return None
    return WarmupOutcome(**json.loads(path.read_text()))


def warmed_model_dir(cfg: ModelConfig, base_dir: str, task: Task, task_cfg: dict, probe_max_new_tokens: int) -> str:
    """``base_dir`` itself when no warm-up is configured, else the cached warmed copy (built on first use).

    ``probe_max_new_tokens`` is the validation decode length, so the probe scores answers as validation will.
    A pinned model asked for in a process with other numerics is built in a pinned child process.
    """
    if cfg.warmup_max_steps == 0:
        return base_dir
    final = cache_root() / "models" / f"{Path(base_dir).name}-warm-{warmup_key(cfg, base_dir, task_cfg, probe_max_new_tokens)}"
    if (final / ".complete").is_file():
        return str(final)
    if _pinned(cfg) and not numerics.pinned_in_force():
        return _build_in_pinned_child(cfg, base_dir, task_cfg, probe_max_new_tokens, final)
    probe, pairs = split_probe(task, task.load("train"), cfg.warmup_probe_size)

    def build(tmp: Path) -> None:
        if _pinned(cfg):
            numerics.enter_pinned()
        model, tokenizer = load_policy(ModelConfig(dtype=cfg.dtype), base_dir)
        outcome = warm_up_to_band(model, tokenizer, pairs, task, probe, cfg, probe_max_new_tokens)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / WARMUP_RECORD).write_text(json.dumps(asdict(outcome), indent=1) + "\n")
        logger.info("warm-up: probe pass@1 %.4f (band %s) after %d steps, loss %.3f, %.1fs, numerics %s",
                    outcome.probe_pass_at_1, outcome.band, outcome.steps, outcome.final_loss, outcome.seconds,
                    outcome.numerics)

    return str(build_once(final, build))


def _build_in_pinned_child(cfg: ModelConfig, base_dir: str, task_cfg: dict, probe_max_new_tokens: int,
                           final: Path) -> str:
    logger.info("warm-up of %s: torch is loaded here under other numerics; building it in a pinned process", final)
    code, out = pinned_child.run_pinned_child(__name__, {"model": asdict(cfg), "base_dir": base_dir,
                                                     "task": task_cfg, "probe_max_new_tokens": probe_max_new_tokens})
    if code == 0 and (final / ".complete").is_file():
        return str(final)
    reply = json.loads(out) if out.strip().startswith("{") else {}
    if reply.get("error_type") == WarmupTargetError.__name__:
        raise WarmupTargetError(reply["error"])
    raise RuntimeError(f"the pinned warm-up process exited with status {code}: "
                       f"{reply.get('error') or 'see its log above'}")


def _child_main() -> int:
    """Build one warmed model in this (pinned) process; errors go back as JSON on stdout."""
    from inner_loop.tasks import build_task

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    payload = numerics.read_child_payload()
    try:
        warmed_model_dir(ModelConfig(**payload["model"]), payload["base_dir"], build_task(payload["task"]),
                         payload["task"], int(payload["probe_max_new_tokens"]))
    except Exception as exc:  # reported to the parent, which raises it there
        sys.stdout.write(json.dumps({"error_type": type(exc).__name__, "error": str(exc)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())

"""One GBMPO loss + backward at Qwen3's vocabulary (151,936) with tiny widths, measuring the process's peak memory
above what it held before, for the sampled and the full neural-map forms; prints JSON. Run by
tests/test_full_form_memory.py in a fresh process, with glibc's mmap threshold fixed so that freed tensors leave the
resident set (the peak of one form does not hide in the next one's).

The peak is the kernel's resident high-water mark (VmHWM), reset through /proc/self/clear_refs before each form."""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import torch

VOCAB = 151_936
#: 2 completions of 8 tokens: the bound is in multiples of the logits, which any length shows (measured: 2.1x at 8
#: tokens, 2.9x at 16, which took twice the time)
ROWS, PROMPT, COMPLETION = 2, 4, 8


def _resident() -> tuple[int, int]:
    status = Path("/proc/self/status").read_text()
    return (int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024,
            int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) * 1024)


def _trainer(form: str, out: Path):
    from datasets import Dataset
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig

    from inner_loop.config import DivergenceConfig
    from inner_loop.grpo.trainer import MirrorGRPOTrainer
    from inner_loop.loss.regularizers import build_regularizer
    from inner_loop.models.tiny import build_tiny_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config)
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=ROWS, num_generations=ROWS,
                      max_completion_length=COMPLETION, beta=0.0, loss_type="dr_grpo", report_to=[], use_cpu=True,
                      temperature=1.0, max_steps=1, bf16=False)
    data = Dataset.from_dict({"prompt": ["1+1="] * ROWS})
    regularizer = build_regularizer(DivergenceConfig(name="neural_mirror", form=form, coef=1.0))
    trainer = MirrorGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                args=args, train_dataset=data, processing_class=build_tiny_tokenizer(),
                                regularizer=regularizer)
    trainer.model.train()
    with torch.no_grad():  # the policy away from its reference, so the divergence has a gradient
        for param in trainer.model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return trainer


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (ROWS, PROMPT), generator=generator)
    completion = torch.randint(0, VOCAB, (ROWS, COMPLETION), generator=generator)
    return {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
            "completion_mask": torch.ones_like(completion), "advantages": torch.tensor([0.5, -0.5])}


def measure(form: str) -> int:
    """Bytes the process's resident set rose above its level before one loss + backward of ``form``."""
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(form, Path(out))
        batch = _batch()
        trainer._compute_loss(trainer.model, batch).backward()  # once first: what a first call sets up is not a step's
        trainer.model.zero_grad(set_to_none=True)
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts from what is resident now
        before = _resident()[1]
        trainer._compute_loss(trainer.model, batch).backward()
        peak = _resident()[0] - before
        del trainer
    return peak


def main() -> None:
    torch.set_num_threads(1)
    forms = sys.argv[1:] or ["sampled", "full"]
    peaks = {form: measure(form) for form in forms}
    logits_bytes = ROWS * COMPLETION * VOCAB * 4
    print(json.dumps({"peaks": peaks, "logits_bytes": logits_bytes}))


if __name__ == "__main__":
    main()

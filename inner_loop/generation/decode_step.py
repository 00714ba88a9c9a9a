"""One static KV cache per member and one compiled decode step, replayed (``train.decode_cache=persistent_compiled``).

Why: HF generate's decode is bound by kernel launches and Python, not by the card (docs/trl_options.md). A compiled
decode step over a static cache removes most of that, but only if it is compiled once and replayed: transformers
makes a new ``StaticCache`` at every ``generate`` call, and under ``mode="reduce-overhead"`` a cache at new addresses
makes CUDA graph trees record again at every step, uncounted by dynamo's recompile limit. So here:

- one ``StaticCache`` for the run, allocated once at its largest shape (generation batch x (longest bucket +
  ``max_completion_length``)) and reset in place before each call (its tensors keep their addresses);
- prompts left-padded to a few bucket lengths, so the shapes the model sees are few and known;
- the decode step compiled through transformers' own path (``compile_config``, on every device, ``dynamic=False``);
  the prefill and every forward outside ``generate`` (the policy's and the reference's log-probs) stay eager;
- grouped-query heads attended without expanding the cache at each token step (generation/gqa_attention.py), and
  the embeddings' input-grad hooks (gradient checkpointing with LoRA) lifted off the model while it decodes, so the
  compiled step neither copies the cache nor runs a training hook;
- compiles, recompiles and CUDA graph recordings counted while decoding (torch._dynamo's compilation callbacks)
  and the storage of the weights checked at every call (an optimizer step that moved a weight would force a
  recording), so the record says whether the step was really replayed (:func:`decode_counts_problem`).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from inner_loop.generation.backends import (COMPILE_BACKENDS, OWNED_LOOP, PERSISTENT_CACHES, PERSISTENT_COMPILED,
                                            PERSISTENT_MERGED)
from inner_loop.generation.gqa_attention import decode_attention
from inner_loop.generation.lora_merge import MergedLora

logger = logging.getLogger(__name__)

#: Bucket lengths are rounded up to a multiple of this many tokens (a tensor-core friendly width).
BUCKET_MULTIPLE = 8


def prompt_buckets(lengths: Sequence[int], count: int, multiple: int = BUCKET_MULTIPLE) -> list[int]:
    """Up to ``count`` bucket lengths covering ``lengths`` (prompt lengths in tokens): the length at each
    ``i/count`` quantile, rounded up to ``multiple``; the last bucket holds the longest prompt."""
    if count < 1:
        raise ValueError(f"train.decode_buckets must be >= 1, got {count}")
    if not lengths:
        raise ValueError("no prompts to size the decode buckets from")
    ordered = sorted(int(n) for n in lengths)
    buckets = set()
    for i in range(1, count + 1):
        at = ordered[max(0, math.ceil(i * len(ordered) / count) - 1)]
        buckets.add(max(multiple, -(-at // multiple) * multiple))
    return sorted(buckets)


def member_decode_buckets(decode_cache: str, count: int, tokenizer: Any, prompts: Sequence[str]) -> list[int] | None:
    """The prompt buckets of a member's run (None unless ``decode_cache`` decodes over one static cache), from its
    training prompts tokenized as TRL tokenizes them (special tokens included)."""
    if decode_cache not in PERSISTENT_CACHES:
        return None
    buckets = prompt_buckets([len(ids) for ids in tokenizer(text=list(prompts))["input_ids"]], count)
    logger.info("decode: prompt buckets %s (train.decode_buckets=%d)", buckets, count)
    return buckets


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds a prompt of ``length`` tokens; ValueError when none does."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"a prompt of {length} tokens is longer than the longest decode bucket ({max(buckets)}): the "
                     "buckets are sized from the training prompts (train.decode_buckets)")


def to_bucket(input_ids: torch.Tensor, attention_mask: torch.Tensor, longest: int, buckets: Sequence[int],
              batch_size: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded prompts (TRL pads to the batch's longest, ``longest`` tokens) re-padded on the left to their
    bucket, and filled up to the cache's fixed ``batch_size`` with copies of the last row (dropped after)."""
    rows, width = input_ids.shape
    bucket = bucket_for(longest, buckets)
    ids, mask = input_ids[:, width - longest:], attention_mask[:, width - longest:]
    if bucket > longest:
        ids = torch.cat([ids.new_full((rows, bucket - longest), pad_id), ids], dim=1)
        mask = torch.cat([mask.new_zeros((rows, bucket - longest)), mask], dim=1)
    if rows < batch_size:
        fill = batch_size - rows
        ids = torch.cat([ids, ids[-1:].expand(fill, -1)], dim=0)
        mask = torch.cat([mask, mask[-1:].expand(fill, -1)], dim=0)
    return ids, mask, bucket


#: The forward hooks that make the input embeddings' output require grad, by their functions' names: transformers'
#: ``enable_input_require_grads`` (which TRL calls for a PEFT model with gradient checkpointing) and PEFT's own.
TRANSFORMERS_INPUT_GRAD_HOOK, PEFT_INPUT_GRAD_HOOK = "make_inputs_require_grads", "make_inputs_require_grad"
INPUT_GRAD_HOOK_NAMES = frozenset({TRANSFORMERS_INPUT_GRAD_HOOK, PEFT_INPUT_GRAD_HOOK})


def input_grad_hooks(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int]]:
    """Every input-grad hook on ``model``'s modules, as (module, key in its ``_forward_hooks``), in order."""
    return [(module, key) for module in model.modules() for key, fn in module._forward_hooks.items()
            if getattr(fn, "__name__", "") in INPUT_GRAD_HOOK_NAMES]


@contextmanager
def without_input_grad_hooks(model: torch.nn.Module) -> Iterator[None]:
    """Lift the input-grad hooks off ``model`` for the block and put them back where they were after (also on an
    error). Why: they exist for training's backward through checkpointed layers and do nothing under no_grad, but
    a compiled decode step traces them into its graph (an in-place ``requires_grad_`` at every step; dynamo before
    2.13 may break the graph there) and guards on them."""
    found = input_grad_hooks(model)
    modules = {id(module): module for module, _ in found}
    order = {ident: list(module._forward_hooks) for ident, module in modules.items()}  # keys in calling order
    lifted = {(id(module), key): module._forward_hooks.pop(key) for module, key in found}
    try:
        yield
    finally:
        for ident, module in modules.items():
            now = dict(module._forward_hooks)
            module._forward_hooks.clear()
            for key in order[ident]:  # each back in its place; a hook added meanwhile after them
                if (ident, key) in lifted or key in now:
                    module._forward_hooks[key] = lifted.get((ident, key), now.pop(key, None))
            module._forward_hooks.update(now)


def static_cache(hf_model: Any, batch_size: int, max_cache_len: int, decode_cache: str) -> Any:
    """One transformers ``StaticCache`` of ``batch_size`` x ``max_cache_len`` positions, allocated now (its tensors'
    addresses are the ones a compiled step replays over)."""
    from transformers import StaticCache

    shape = hf_model._get_static_cache_init_shape()
    if shape is None:
        raise ValueError(f"train.decode_cache={decode_cache}: {type(hf_model).__name__} cannot have its static "
                         "cache initialised ahead of time (layers on several devices, or MLA attention)")
    cache = StaticCache(config=hf_model.config.get_text_config(decoder=True), max_cache_len=max_cache_len)
    cache.early_initialization(batch_size=batch_size, num_heads=shape[0], head_dim=shape[1], dtype=hf_model.dtype,
                               device=hf_model.device)
    return cache


class _CompileEvents:
    """torch._dynamo's compilation callbacks, one per process, counted into the decoder that is decoding at that
    moment (none: not counted). One callback, so trainers built one after another in one process (the tests) do
    not pile up callbacks; put back before each generation where ``torch._dynamo.reset()`` (which
    ``torch._dynamo.explain`` calls) cleared it, else that generation's compiles would go uncounted."""

    active: "DecodeCounts | None" = None
    _ended: Any = None
    #: whether this torch reports CUDA graph recordings to the callbacks (a CallbackTrigger for them)
    counts_recordings = False

    @classmethod
    def register(cls) -> None:
        from torch._dynamo.callback import CallbackTrigger, callback_handler

        if cls._ended is None:
            recording = getattr(CallbackTrigger, "CUDAGRAPH_RECORDING", None)
            cls.counts_recordings = recording is not None

            def ended(args: Any) -> None:
                counts = cls.active
                if counts is None:
                    return
                if args.callback_trigger == CallbackTrigger.DYNAMO:
                    counts.compiles += 1
                    # CompileId "frame/attempt": a frame this run compiled before, compiled again, is a recompile
                    # (a frame first compiled for another model in this process is not: its guards never held here)
                    frame = str(args.compile_id).split("/")[0]
                    if frame in counts.frames:
                        counts.recompiles += 1
                    counts.frames.add(frame)
                elif recording is not None and args.callback_trigger == recording:
                    counts.cudagraph_recordings += 1

            cls._ended = ended
        if cls._ended not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(cls._ended)


@dataclass
class DecodeCounts:
    """What a member's decoding compiled and recorded over its run (the result record's ``decode_counts``)."""

    generate_calls: int = 0
    compiles: int = 0
    recompiles: int = 0
    cudagraph_recordings: int = 0
    #: compiled graphs inductor gave no CUDA graph though the mode asked for one (a CPU op, an input mutated in
    #: place that is not a static address, ...): each of their kernels is still launched one by one
    cudagraph_skips: int = 0
    #: calls at which a weight's storage had moved since the previous call (a CUDA graph records again)
    weights_moved: int = 0
    #: bucket length -> calls that used it
    buckets_used: dict[int, int] = field(default_factory=dict)
    #: dynamo's frame ids this run compiled
    frames: set[str] = field(default_factory=set)


class PersistentDecoder:
    """The member's one static cache and compiled decode step; :meth:`generate` replaces ``model.generate``."""

    def __init__(self, model: torch.nn.Module, buckets: Sequence[int], batch_size: int, max_new_tokens: int,
                 generation_config: Any, compile_backend: str = "inductor", compile_mode: str | None = None,
                 merge_lora: bool = False) -> None:
        """``compile_mode``: torch.compile's mode; None: ``reduce-overhead`` (CUDA graphs) with inductor on CUDA,
        else ``default``. ``merge_lora``: decode on LoRA merged (``persistent_merged``)."""
        from transformers.generation.configuration_utils import CompileConfig

        if not buckets:
            raise ValueError("train.decode_cache=persistent_compiled needs prompt buckets (train.decode_buckets)")
        if compile_backend not in COMPILE_BACKENDS:
            raise ValueError(f"train.decode_compile_backend={compile_backend!r} is not one of {list(COMPILE_BACKENDS)}")
        hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.buckets = sorted(int(b) for b in buckets)
        self.batch_size = int(batch_size)
        self.max_cache_len = self.buckets[-1] + int(max_new_tokens)
        self.cache = static_cache(hf_model, self.batch_size, self.max_cache_len, PERSISTENT_COMPILED)
        #: persistent_merged: LoRA merged into a decoding copy of the weights for each generation
        self.merged = MergedLora(model) if merge_lora else None
        self._cache_ptrs = self.cache_data_ptrs()
        device_type = hf_model.device.type
        #: CUDA graphs where they exist (what removes the launches); elsewhere inductor's default mode
        self.compile_mode = compile_mode or (
            "reduce-overhead" if device_type == "cuda" and compile_backend == "inductor" else "default")
        compile_config = CompileConfig(fullgraph=False, dynamic=False, backend=compile_backend, mode=self.compile_mode)
        compile_config._compile_all_devices = True  # transformers compiles on CUDA-class devices only unless told
        self.compile_backend = compile_backend
        config = generation_config.__class__.from_dict(generation_config.to_dict())
        config.cache_implementation = None  # the cache is ours, passed in (transformers refuses both)
        config.disable_compile = False
        config.compile_config = compile_config
        config.max_new_tokens = int(max_new_tokens)
        self.generation_config = config
        self.counts = DecodeCounts()
        self._weight_ptrs: tuple[int, ...] | None = None
        self._cuda = device_type == "cuda"
        _CompileEvents.register()
        logger.info("decode: one static cache of %d x %d positions (%.1f MiB), prompt buckets %s, decode step "
                    "compiled with %s (mode %s)", self.batch_size, self.max_cache_len, self.cache_bytes() / 2**20,
                    self.buckets, compile_backend, self.compile_mode)

    def cache_data_ptrs(self) -> tuple[int, ...]:
        """The addresses of the cache's key and value tensors (equal across calls: the graph replays over them)."""
        return tuple(t.data_ptr() for layer in self.cache.layers for t in (layer.keys, layer.values))

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.cache.layers for t in (layer.keys, layer.values))

    def _check_weights(self, model: torch.nn.Module) -> None:
        """Count a call whose weights moved since the previous one (the optimizer must update them in place)."""
        ptrs = tuple(p.data_ptr() for p in model.parameters())
        if self._weight_ptrs is not None and ptrs != self._weight_ptrs:
            self.counts.weights_moved += 1
            logger.warning("decode: the policy's weights moved in memory since the last generation; a CUDA graph "
                           "of the decode step records again (update them in place)")
        self._weight_ptrs = ptrs

    @contextmanager
    def _counting(self) -> Iterator[None]:
        from torch._dynamo.utils import counters

        _CompileEvents.register()
        _CompileEvents.active = self.counts
        skips = counters["inductor"]["cudagraph_skips"]
        try:
            yield
        finally:
            _CompileEvents.active = None
            self.counts.cudagraph_skips += counters["inductor"]["cudagraph_skips"] - skips

    @contextmanager
    def decoding(self, model: torch.nn.Module) -> Iterator[None]:
        """The model as the compiled decode step must see it, for the length of one generation: grouped-query
        attention without the cache's copy, no input-grad hooks; as it was afterwards."""
        hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
        with (self.merged.merged() if self.merged is not None else nullcontext()), decode_attention(hf_model), \
                without_input_grad_hooks(model):
            yield

    def generate(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``model.generate`` over the persistent cache for left-padded prompts; returns the completions only,
        (rows, <= max_new_tokens), rows as given."""
        rows = input_ids.shape[0]
        if rows > self.batch_size:
            raise ValueError(f"decode: {rows} prompts in one generation call, but the static cache holds "
                             f"{self.batch_size} (the generation batch it was sized for)")
        longest = int(attention_mask.sum(dim=1).max())
        pad_id = self.generation_config.pad_token_id
        pad_id = int(pad_id[0] if isinstance(pad_id, (list, tuple)) else (pad_id if pad_id is not None else 0))
        ids, mask, bucket = to_bucket(input_ids, attention_mask, longest, self.buckets, self.batch_size, pad_id)
        self._check_weights(model)
        self.cache.reset()
        with self.decoding(model), self._counting():
            out = model.generate(input_ids=ids, attention_mask=mask, past_key_values=self.cache,
                                 generation_config=self.generation_config)
        if self.cache_data_ptrs() != self._cache_ptrs:  # never expected: reset() works in place
            raise RuntimeError("decode: the static cache's tensors moved; the compiled decode step cannot replay")
        self.counts.generate_calls += 1
        self.counts.buckets_used[bucket] = self.counts.buckets_used.get(bucket, 0) + 1
        return out[:rows, bucket:]

    def summary(self) -> dict[str, Any]:
        """The record's ``decode_counts``: what was compiled and recorded over the run, and the cache it used."""
        counts = self.counts
        return {"generate_calls": counts.generate_calls, "compiles": counts.compiles,
                "recompiles": counts.recompiles,
                # null where not measured: no CUDA, or a torch that does not report recordings
                "cudagraph_recordings": (counts.cudagraph_recordings
                                         if self._cuda and _CompileEvents.counts_recordings else None),
                "cudagraph_skips": counts.cudagraph_skips,
                "weights_moved": counts.weights_moved,
                "buckets": list(self.buckets), "buckets_used": {str(k): v for k, v in sorted(counts.buckets_used.items())},
                "cache_shape": [self.batch_size, self.max_cache_len], "cache_bytes": self.cache_bytes(),
                "cache_kept": self.cache_data_ptrs() == self._cache_ptrs,
                "compile_backend": self.compile_backend, "compile_mode": self.compile_mode,
                "merged_bytes": self.merged.merged_bytes() if self.merged is not None else None}


def decode_counts_problem(record: Mapping[str, Any]) -> str | None:
    """What is wrong with a finished member's decoding, from its result record (a mapping like result.json; None:
    nothing). For ``persistent_compiled`` members: the static cache was the one cache of the run, decoding ran, the
    weights never moved, recompiles stayed within the buckets, and CUDA graph recordings stayed bounded (at most one
    per compiled graph: over a static cache the decode step's shapes and addresses do not depend on the prompt's
    bucket, so a second recording of one graph is a stray one, and a per-step one grows with the steps), and where
    the mode asked for CUDA graphs, the decode step got them. Other caches: None."""
    generation = record.get("generation") or {}
    if generation.get("decode_cache") not in PERSISTENT_CACHES:
        return None
    counts = generation.get("decode_counts")
    if not counts:
        return (f"decode_cache={generation['decode_cache']} but the record has no decode_counts: the static cache "
                "was not used")
    if generation["decode_cache"] not in (PERSISTENT_COMPILED, PERSISTENT_MERGED):
        return loop_counts_problem(counts)
    if not counts.get("generate_calls"):
        return "decode_cache=persistent_compiled but no generation went through the static cache"
    if not counts.get("cache_kept"):
        return "the static cache's tensors moved during the run (the compiled decode step could not replay)"
    if counts.get("weights_moved"):
        return f"the policy's weights moved in memory at {counts['weights_moved']} generation(s) (not in place)"
    if counts.get("recompiles", 0) > len(counts.get("buckets") or []):
        return (f"{counts['recompiles']} recompiles of the decode step over {counts['generate_calls']} generations "
                f"(at most one per bucket, {len(counts.get('buckets') or [])}, expected)")
    recordings = counts.get("cudagraph_recordings")
    if counts.get("compile_mode") == "reduce-overhead" and counts.get("compiles"):
        if counts.get("cudagraph_skips"):
            return (f"the decode step was compiled without CUDA graphs ({counts['cudagraph_skips']} graph(s) "
                    "skipped by inductor; TORCH_LOGS=cudagraphs names why): its kernels are still launched one by one")
        if recordings == 0:
            return "the decode step was compiled but no CUDA graph was ever recorded: it ran without one"
    bound = max(1, counts.get("compiles", 0))
    if recordings is not None and recordings > bound:
        return (f"{recordings} CUDA graph recordings over {counts['generate_calls']} generations and "
                f"{len(counts.get('buckets_used') or {})} bucket(s) (at most one per compiled graph, {bound}: the "
                "decode step's graph does not depend on the prompt's bucket): the decode step was recorded again "
                "instead of replayed")
    return None


def loop_counts_problem(counts: Mapping[str, Any]) -> str | None:
    """What is wrong with an owned loop's decode counts (None: nothing): it decoded, compiled its step once per
    attention window (one without ``train.decode_windows``; each further window is dynamo's recompile of the same
    frame) and captured it once per compile, never moved its weights, and read the host at most once per
    ``check_every`` tokens plus once per call."""
    if not counts.get("generate_calls"):
        return f"decode_cache={OWNED_LOOP} but no generation went through the owned loop"
    if counts.get("weights_moved"):
        return f"the policy's weights moved in memory at {counts['weights_moved']} generation(s) (not in place)"
    windows = len(counts.get("windows") or [0])
    if counts.get("compiles") != windows or (counts.get("recompiles") or 0) != windows - 1:
        return (f"the owned loop's step compiled {counts.get('compiles')} time(s) with {counts.get('recompiles')} "
                f"recompile(s) over the run ({windows} expected, one per attention window: the step does not depend "
                "on the prompt's bucket)")
    if counts.get("recordings") != counts.get("compiles"):
        return (f"{counts.get('recordings')} capture(s) of the owned loop's step for {counts.get('compiles')} "
                "compile(s): one each expected")
    calls, tokens, every = counts["generate_calls"], counts.get("tokens") or 0, counts.get("check_every") or 1
    bound = calls + -(-tokens // every)
    if counts.get("host_syncs", 0) > bound:
        return (f"{counts['host_syncs']} host syncs over {tokens} tokens in {calls} generation(s): at most {bound} "
                f"expected (one per call, one per {every} tokens)")
    return None

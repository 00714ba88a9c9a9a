"""The project's own decode loop (``train.decode_cache=owned_loop``): one captured step, replayed, no host sync
per token.

Why: transformers' ``_sample``, as members run it, synchronises the host with the card four times per token step
(the mask's padding check, ``torch.multinomial``'s checks, the stop check) and runs the top-p sort, an fp32 copy of
the logits, the concatenations and the EOS check outside the compiled graph; each sync drains the card's queue while
Python runs. Here the whole token step is one function, compiled once and (on CUDA) captured as one CUDA graph:

- the forward of one token per row over the member's one static cache, on LoRA merged into a decoding copy
  (generation/lora_merge.py), with a boolean mask over the cache's positions kept on the device;
- the processed distribution by the rule the trainer rebuilds (generation/sampling.py ``truncated_logits``:
  temperature, top_k, top_p) and a draw by exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)`` drawn by
  torch's own generator (a fresh offset at every replay of a CUDA graph), which samples exactly from ``p`` without
  ``torch.multinomial``'s host checks (gpt-fast's ``multinomial_sample_one_no_sync``);
- the drawn token's processed log-prob gathered, the token (pad once a row finished) written into a preallocated
  [batch, max_new_tokens] buffer, the unfinished flags updated by the EOS ids.

With ``windows`` > 1 (``train.decode_windows``) the step is compiled (and captured) once per attention window, the
cache's first W positions for W in even steps up to the whole cache, and the host replays the smallest window that
holds every filled position (it knows the fill: the bucket plus the tokens so far, no sync): a step early in a
completion reads a fraction of a cache sized for the longest prompt plus every new token.

The host replays the step and reads the "all finished" flag every ``check_every`` tokens only. The prefill stays
eager, per prompt bucket, as with ``persistent_compiled``; the step itself does not depend on the bucket (it sees
the whole cache), so a run compiles it once. Counted for the record: compiles (dynamo's callbacks), recordings
(CUDA graph captures; on a CPU the step's first, compiling call), replays, and host syncs per token.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from inner_loop.generation.backends import COMPILE_BACKENDS, MAX_DECODE_WINDOWS, OWNED_LOOP
from inner_loop.generation.decode_step import _CompileEvents, static_cache, to_bucket, without_input_grad_hooks
from inner_loop.generation.gqa_attention import attention_window, decode_attention
from inner_loop.generation.lora_merge import MergedLora
from inner_loop.generation.sampling import truncated_logits

logger = logging.getLogger(__name__)

#: Token steps between two reads of the finished flag by the host (the loop's only sync while decoding).
CHECK_EVERY = 16
#: Under a profile (and only then), the token steps named as one window: the second check period, its read of the
#: finished flag included, past the prefill and the first steps' warm-up; and each replay within it. A profile of a
#: step splits a token step by them into the captured step, eager work and idle time (inner_loop/grpo/step_profile.py)
PROFILED_FROM_STEP = CHECK_EVERY
DECODE_WINDOW = "mirror_es.decode_window"
DECODE_REPLAY = "mirror_es.decode_replay"


def profiling() -> bool:
    """Whether torch's profiler is recording now (a module attribute torch sets when a profile starts and stops)."""
    return torch.autograd.profiler._is_profiler_enabled
#: dynamo's limit on compiled entries of the step's code while a decoder builds: every decoder compiles the one
#: ``_step`` code once per window, and the entries of decoders built before in the process (a test module's, a
#: member's trainer rebuilt) stay in that code's cache, where dynamo's default (8) would refuse the next one
STEP_RECOMPILE_LIMIT = 64


def attention_windows(max_cache_len: int, windows: int) -> list[int]:
    """The cache lengths a step is compiled for: ``windows`` even steps up to ``max_cache_len`` (1: the whole cache)."""
    if not 1 <= windows <= MAX_DECODE_WINDOWS:
        raise ValueError(f"train.decode_windows must be in [1, {MAX_DECODE_WINDOWS}], got {windows}")
    quantum = -(-max_cache_len // windows)
    return sorted({min(max_cache_len, quantum * k) for k in range(1, windows + 1)})
#: Generation settings the loop does not apply (HF generate would): refused rather than silently dropped.
_UNAPPLIED = {"min_p": None, "repetition_penalty": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
              "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None,
              "min_new_tokens": None, "min_length": 0, "forced_eos_token_id": None, "sequence_bias": None}


def unapplied_settings(generation_config: Any) -> list[str]:
    """The settings of ``generation_config`` the owned loop would not apply (empty: it applies them all)."""
    found = []
    for key, neutral in _UNAPPLIED.items():
        value = getattr(generation_config, key, neutral)
        if value is not None and value != neutral and not (key == "min_length" and value == 0):
            found.append(f"{key}={value!r}")
    return found


def processed_scores(logits: torch.Tensor, temperature: float, top_p: float, top_k: int | None) -> torch.Tensor:
    """The scores a token is drawn from: fp32 logits at the temperature, truncated by the trainer's rule."""
    return truncated_logits(logits.float() / temperature, top_p, top_k)


def race_draw(scores: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from ``softmax(scores)`` by exponential race: ``argmax(p / E)``, E ~ Exp(1) i.i.d.,
    equals a draw from ``p`` (the first arrival of independent exponential clocks of rates ``p``); no host sync,
    torch's default generator. Tokens of probability 0 never win (0 / E = 0 < any kept p / E)."""
    probs = torch.softmax(scores, dim=-1)
    noise = torch.empty_like(probs).exponential_(1.0)
    return torch.argmax(probs / noise, dim=-1)


@dataclass
class LoopCounts:
    """What the owned loop compiled, captured, replayed and synchronised over a run (the record's decode_counts)."""

    generate_calls: int = 0
    compiles: int = 0
    recompiles: int = 0
    recordings: int = 0
    replays: int = 0
    host_syncs: int = 0
    tokens: int = 0
    weights_moved: int = 0

    # _CompileEvents writes these two as it does for the persistent decoder's counts
    @property
    def cudagraph_recordings(self) -> int:
        return 0

    @cudagraph_recordings.setter
    def cudagraph_recordings(self, value: int) -> None:  # torch's trees are not used: our captures are counted
        pass

    def __post_init__(self) -> None:
        self.frames: set[str] = set()
        self.window_replays: dict[int, int] = {}


class OwnedDecoder:
    """The member's static cache, decoding buffers and captured token step; :meth:`generate` replaces HF generate."""

    def __init__(self, model: torch.nn.Module, buckets: Sequence[int], batch_size: int, max_new_tokens: int,
                 generation_config: Any, compile_backend: str = "inductor", check_every: int = CHECK_EVERY,
                 windows: int = 1) -> None:
        if not buckets:
            raise ValueError(f"train.decode_cache={OWNED_LOOP} needs prompt buckets (train.decode_buckets)")
        if compile_backend not in COMPILE_BACKENDS:
            raise ValueError(f"train.decode_compile_backend={compile_backend!r} is not one of {list(COMPILE_BACKENDS)}")
        if check_every < 1:
            raise ValueError(f"owned loop: check_every must be >= 1, got {check_every}")
        unapplied = unapplied_settings(generation_config)
        if unapplied:
            raise ValueError(f"train.decode_cache={OWNED_LOOP} samples by temperature, top_k and top_p only; it would "
                             f"not apply {', '.join(unapplied)} (set train.decode_cache=persistent_compiled for them)")
        hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.buckets = sorted(int(b) for b in buckets)
        self.batch_size, self.max_new_tokens = int(batch_size), int(max_new_tokens)
        self.max_cache_len = self.buckets[-1] + self.max_new_tokens
        # a window no fill needs (at or below the shortest bucket) is not compiled
        self.windows = [w for w in attention_windows(self.max_cache_len, int(windows)) if w > self.buckets[0]]
        self.cache = static_cache(hf_model, self.batch_size, self.max_cache_len, OWNED_LOOP)
        self.device = hf_model.device
        self.do_sample = bool(generation_config.do_sample)
        self.temperature = float(generation_config.temperature or 1.0) if self.do_sample else 1.0
        self.top_p = float(generation_config.top_p or 1.0) if self.do_sample else 1.0
        top_k = generation_config.top_k if self.do_sample else None
        self.top_k = int(top_k) if top_k else None
        pad = generation_config.pad_token_id
        self.pad_id = int(pad[0] if isinstance(pad, (list, tuple)) else (pad if pad is not None else 0))
        eos = generation_config.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        rows, dev = self.batch_size, self.device
        # the step's state: fixed tensors written in place (a captured graph reads and writes these addresses)
        self.eos = torch.tensor(eos or [-1], dtype=torch.long, device=dev)
        self.tokens = torch.full((rows, self.max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        self.logps = torch.zeros(rows, self.max_new_tokens, dtype=torch.float32, device=dev)
        self.keys_mask = torch.zeros(rows, self.max_cache_len, dtype=torch.bool, device=dev)
        self.current = torch.zeros(rows, 1, dtype=torch.long, device=dev)
        self.position = torch.zeros(rows, 1, dtype=torch.long, device=dev)
        self.fill = torch.zeros(1, dtype=torch.long, device=dev)  # the cache position the current token goes to
        self.column = torch.zeros(1, dtype=torch.long, device=dev)  # its column in ``tokens``
        self.unfinished = torch.ones(rows, dtype=torch.bool, device=dev)
        self.any_unfinished = torch.ones(1, dtype=torch.bool, device=dev)
        self.check_every = int(check_every)
        self.merged = MergedLora(model)
        self.counts = LoopCounts()
        self.compile_backend = compile_backend
        self._cuda = self.device.type == "cuda"
        # on CUDA the graph is ours (captured below), so inductor must not make CUDA graph trees of its own
        mode = "max-autotune-no-cudagraphs" if self._cuda and compile_backend == "inductor" else None
        self.compile_mode = mode or "default"
        self._compiled = torch.compile(self._step, backend=compile_backend, mode=mode, dynamic=False, fullgraph=True)
        self._graphs: dict[int, Any] = {}  # CUDA: one captured step per window
        self._built = False
        self._model: torch.nn.Module | None = None
        self._weight_ptrs: tuple[int, ...] | None = None
        _CompileEvents.register()
        logger.info("decode: owned loop over one static cache of %d x %d positions, prompt buckets %s, step compiled "
                    "with %s%s for attention windows %s, finished flag read every %d tokens", rows,
                    self.max_cache_len, self.buckets, compile_backend,
                    " and captured as CUDA graphs" if self._cuda else "", self.windows, self.check_every)

    # -- the step ------------------------------------------------------------------------------------------------
    def _step(self) -> None:
        """One token step on the device: forward of the current tokens, processed scores, race draw, writes."""
        model = self._model
        self.keys_mask.index_fill_(1, self.fill, True)
        logits = model(input_ids=self.current, attention_mask=self.keys_mask[:, None, None, :],
                       position_ids=self.position, past_key_values=self.cache, use_cache=True).logits[:, -1, :]
        self._choose(logits)
        self.fill.add_(1)
        self.position.add_(1)

    def _choose(self, logits: torch.Tensor) -> None:
        """Draw (or take greedily) the next token from ``logits`` [rows, vocab] and write it, its processed log-prob
        and the finished flags into the buffers at ``column``; then move ``column`` on."""
        scores = processed_scores(logits, self.temperature, self.top_p, self.top_k)
        token = race_draw(scores) if self.do_sample else torch.argmax(logits, dim=-1)
        logp = torch.log_softmax(scores, dim=-1).gather(-1, token[:, None]).squeeze(-1)
        live = self.unfinished
        token = torch.where(live, token, self.pad_id)
        self.tokens.index_copy_(1, self.column, token[:, None])
        self.logps.index_copy_(1, self.column, torch.where(live, logp, 0.0)[:, None])
        self.unfinished.logical_and_(~torch.isin(token, self.eos))
        self.any_unfinished.copy_(self.unfinished.any()[None])
        self.current.copy_(token[:, None])
        self.column.add_(1)

    def _window_for(self, fill: int) -> int:
        """The smallest window holding cache positions [0, fill]."""
        return next(w for w in self.windows if w > fill)

    def _replay(self, window: int) -> None:
        if self._graphs:
            self._graphs[window].replay()
        else:
            with attention_window(window):
                self._compiled()
        self.counts.replays += 1
        self.counts.window_replays[window] = self.counts.window_replays.get(window, 0) + 1

    def _build(self) -> None:
        """Compile the step for every window (and on CUDA capture each as a CUDA graph) over the buffers as they
        are; the state it leaves is overwritten by the next prefill. The captures share one memory pool: every value
        that outlives a replay lives in the decoder's own buffers, and one step runs at a time."""
        limit = max(int(torch._dynamo.config.recompile_limit), STEP_RECOMPILE_LIMIT)
        with torch._dynamo.config.patch(recompile_limit=limit):
            self._build_windows()
        self._built = True

    def _build_windows(self) -> None:
        if self._cuda:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            pool = torch.cuda.graph_pool_handle()
            graphs = {}
            for window in self.windows:
                with attention_window(window):
                    with torch.cuda.stream(stream), torch.random.fork_rng(devices=[self.device]):
                        for _ in range(3):  # compile, then warm up inductor's kernels and the allocator
                            self._reset_buffers()
                            self._compiled()
                    torch.cuda.current_stream().wait_stream(stream)
                    self._reset_buffers()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._compiled()
                graphs[window] = graph
                self.counts.recordings += 1
            self._graphs = graphs
        else:
            for window in self.windows:
                self._reset_buffers()
                with attention_window(window), torch.random.fork_rng(devices=[]):  # must not move the member's RNG
                    self._compiled()
                self.counts.recordings += 1

    def _reset_buffers(self) -> None:
        self.cache.reset()
        self.keys_mask.zero_()
        self.fill.fill_(self.buckets[0])
        self.column.zero_()
        self.position.zero_()
        self.current.fill_(self.pad_id)
        self.unfinished.fill_(True)

    # -- the host ------------------------------------------------------------------------------------------------
    def _host_read(self, tensor: torch.Tensor) -> Any:
        """The loop's one way to read a device value on the host (counted: each is a sync)."""
        self.counts.host_syncs += 1
        return tensor.item()

    @contextmanager
    def decoding(self, model: torch.nn.Module) -> Iterator[None]:
        """The model as the step must see it: merged LoRA, grouped-query decode attention, no input-grad hooks."""
        hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
        with self.merged.merged(), decode_attention(hf_model), without_input_grad_hooks(model):
            self._model = hf_model
            try:
                yield
            finally:
                self._model = None

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """The prompt's forward (eager) into the cache, and the first token chosen from its last logits."""
        rows, bucket = ids.shape
        self.cache.reset()
        self.keys_mask.zero_()
        self.keys_mask[:, :bucket].copy_(mask.bool())
        position = (mask.long().cumsum(-1) - 1).clamp(min=0)
        # the mask given 4D, so transformers does not check it for padding on the host: causal over the prompt's
        # keys, and every position sees itself (a padding query with no key at all would give NaN)
        queries = torch.arange(bucket, device=self.device)[:, None]
        keys = torch.arange(self.max_cache_len, device=self.device)[None, :]
        sees = (self.keys_mask[:, None, :] & (keys <= queries)[None]) | (keys == queries)[None]
        logits = self._model(input_ids=ids, attention_mask=sees[:, None], position_ids=position,
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        self.column.zero_()
        self.unfinished.fill_(True)
        self._choose(logits)
        self.fill.fill_(bucket)
        self.position.copy_(mask.long().sum(-1, keepdim=True))

    def _check_weights(self, model: torch.nn.Module) -> None:
        ptrs = tuple(p.data_ptr() for p in model.parameters()) + self.merged.copy_ptrs()
        if self._weight_ptrs is not None and ptrs != self._weight_ptrs:
            self.counts.weights_moved += 1
            logger.warning("decode: the policy's weights moved in memory since the last generation; the captured "
                           "step reads the old addresses, so it is captured again (update them in place)")
            self._graphs, self._built = {}, False
        self._weight_ptrs = ptrs

    def generate(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Completions (rows, <= max_new_tokens) for left-padded prompts, pad after a row's EOS; rows as given. The
        processed log-probs of the tokens are in :attr:`last_logps` after the call."""
        rows = input_ids.shape[0]
        if rows > self.batch_size:
            raise ValueError(f"decode: {rows} prompts in one generation call, but the static cache holds "
                             f"{self.batch_size} (the generation batch it was sized for)")
        longest = self._host_read(attention_mask.sum(dim=1).max())  # the bucket: one sync per call
        ids, mask, _ = to_bucket(input_ids, attention_mask, longest, self.buckets, self.batch_size, self.pad_id)
        self._check_weights(model)
        steps = 0
        with torch.no_grad(), self.decoding(model), self._counting():
            if not self._built:
                self._build()
            self._prefill(ids.to(self.device), mask.to(self.device))
            bucket = ids.shape[1]
            steps = 1
            with self._profiled_window() as window:
                while steps < self.max_new_tokens:
                    window.at(steps)
                    if steps % self.check_every == 0 and not self._host_read(self.any_unfinished):
                        break
                    with window.replay():
                        self._replay(self._window_for(bucket + steps - 1))  # this step's token goes to that position
                    steps += 1
        self.counts.generate_calls += 1
        self.counts.tokens += steps
        self.last_logps = self.logps[:rows, :steps].clone()
        return self.tokens[:rows, :steps].clone()

    @contextmanager
    def _profiled_window(self) -> Iterator["_Window"]:
        """The token steps a profile names (one check period from PROFILED_FROM_STEP, each replay in it named too);
        without a profile, nothing is opened."""
        window = _Window(PROFILED_FROM_STEP, self.check_every) if profiling() else _NO_WINDOW
        try:
            yield window
        finally:
            window.close()

    @contextmanager
    def _counting(self) -> Iterator[None]:
        _CompileEvents.register()
        _CompileEvents.active = self.counts
        try:
            yield
        finally:
            _CompileEvents.active = None

    def summary(self) -> dict[str, Any]:
        """The record's ``decode_counts``."""
        counts = self.counts
        return {"loop": OWNED_LOOP, "generate_calls": counts.generate_calls, "compiles": counts.compiles,
                "recompiles": counts.recompiles, "recordings": counts.recordings,
                "cuda_graph": bool(self._graphs), "replays": counts.replays, "tokens": counts.tokens,
                "windows": list(self.windows), "window_replays": dict(counts.window_replays),
                "host_syncs": counts.host_syncs,
                "host_syncs_per_token": counts.host_syncs / counts.tokens if counts.tokens else None,
                "check_every": self.check_every, "weights_moved": counts.weights_moved,
                "merged_lora_layers": len(self.merged.layers), "merged_bytes": self.merged.merged_bytes(),
                "buckets": list(self.buckets), "cache_shape": [self.batch_size, self.max_cache_len],
                "compile_backend": self.compile_backend, "compile_mode": self.compile_mode}



class _Window:
    """DECODE_WINDOW over token steps [first, first + length) of one generation, DECODE_REPLAY over each replay in
    it (under a profile only: see OwnedDecoder._profiled_window)."""

    def __init__(self, first: int, length: int) -> None:
        self.first, self.end = first, first + length
        self._range: Any = None
        self._inside = False

    def at(self, step: int) -> None:
        """Called before token step ``step`` (its finished-flag read, then its replay)."""
        if step == self.first:
            self._range = torch.profiler.record_function(DECODE_WINDOW)
            self._range.__enter__()
            self._inside = True
        elif step == self.end:
            self.close()

    def replay(self) -> Any:
        return torch.profiler.record_function(DECODE_REPLAY) if self._inside else _NO_RANGE

    def close(self) -> None:
        if self._inside:
            self._range.__exit__(None, None, None)
            self._range, self._inside = None, False


class _NoWindow(_Window):
    """The window when no profile is taken: every call does nothing."""

    def __init__(self) -> None:
        super().__init__(0, 0)

    def at(self, step: int) -> None:
        return None


_NO_WINDOW = _NoWindow()
_NO_RANGE = nullcontext()

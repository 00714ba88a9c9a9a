"""The exact full-vocabulary form from hidden states, without either model's [positions, vocabulary] logits.

Why: at Qwen3's 151,936-token vocabulary the logits are a batch's largest tensors. The full form over logits
(mirror_maps.forms.full_divergence) needs both models' logits, their float32 copies, a log-softmax and their gradients:
~10x the batch's float32 logits beyond the sampled form, in proportion to the batch. Here the logits are projected
from the two models' hidden states through their LM heads one tile (rows of positions x columns of the vocabulary) at
a time, as Liger's fused linear cross-entropy and TRL's ChunkedDivergenceFunction do, so the memory is a tile's:

- pass 1, per tile: an online logsumexp of each model's tempered logits, and the sampled token's logit;
- pass 2, per tile: the divergence D = sum_v d(p_v, q_v), the slope a_v = dd/dlog p_v (``Potential.
  bregman_and_slope_from_logprobs``) summed to s = sum_v a_v, and, when asked, the sums behind the per-position
  gradient norms of the gradient-share diagnostic;
- backward, each tile again: with z the policy's tempered logits, dD/dz_v = a_v - p_v s and
  d log p(y)/dz_v = [v = y] - p_v, taken into the hidden states (grad z W / T) and, where the head is trained,
  into its weight (grad z^T h / T).

Saved for backward: the two models' hidden states and five per-position vectors. The reference gets no gradient;
the potential's parameters are held constant. The projection runs in ``compute_dtype`` (the autocast dtype the
model's own LM head would use) and its output is cast to float32 and then divided by the temperature, as a trainer
that divides float32 logits by it does.
"""
from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.autograd.function import once_differentiable

from mirror_maps.potentials import Potential

logger = logging.getLogger(__name__)

TILE_BYTES_PER_ENTRY = 192
"""Bytes alive per tile entry at the busiest moment (both models' logits of the tile, the log-probabilities, the
slope's temporaries, the logit gradient). Measured on the CPU as the process peak of one forward + backward with the
norms over one tile of 32 x 16,384 entries (glibc's mmap threshold at 128 KiB, so freed tiles leave the resident set):
108 B for the authors' neural map, 168 B for a map with 42 of its 126 neurons near a kink (evaluated one at a time by
the exact formulas), 53 B for KL, 32 B for ProbL2."""
CPU_WORKSPACE_BYTES = 64 * 2**20
"""The most a tile takes on the CPU: a few tiles' worth of cache misses less than a bigger one, and no call waits."""
CUDA_WORKSPACE_BYTES = 2 * 2**30
"""The most a tile takes on CUDA: a neural-map tile launches ~200 small kernels, so tiles must be large (as the
logits-based form's 2 GiB chunks, docs/benchmarks.md); at mbpp_qwen3's batch (64 x 256 positions) this is ~7M
entries, 44 rows of the vocabulary."""
LOGITS_SHARE = 0.5
"""A tile never takes more than this share of what the batch's float32 logits would: the whole step stays within a
small multiple of its logits at any batch, small ones included."""
MIN_WORKSPACE_BYTES = 4 * 2**20
"""The least a tile may take: smaller ones cost more in calls than they save."""
MIN_COLUMNS = 2048
"""The narrowest tile the default shape picks (more positions shrink the rows, not the columns below this): a
matrix product of fewer vocabulary columns wastes the LM head's reads."""


class FullForm(NamedTuple):
    """Per position: log p(y) of the sampled token and the divergence D (both differentiable in the policy's hidden
    states and head); and, when asked, ||d log p(y)/dz|| and ||dD/dz|| w.r.t. the policy's tempered logits z."""

    logps: torch.Tensor
    divergence: torch.Tensor
    policy_norms: torch.Tensor | None
    divergence_norms: torch.Tensor | None


def default_workspace_bytes(positions: int, vocab: int, device: torch.device) -> int:
    """A tile's budget: the device's cap (CPU_WORKSPACE_BYTES, CUDA_WORKSPACE_BYTES), at most LOGITS_SHARE of the
    batch's float32 logits, at least MIN_WORKSPACE_BYTES."""
    cap = CUDA_WORKSPACE_BYTES if device.type == "cuda" else CPU_WORKSPACE_BYTES
    return min(cap, max(MIN_WORKSPACE_BYTES, int(LOGITS_SHARE * positions * vocab * 4)))


def tile_shape(positions: int, vocab: int, workspace_bytes: int, rows: int | None = None) -> tuple[int, int]:
    """(rows, columns) of a tile whose work (TILE_BYTES_PER_ENTRY an entry) fits ``workspace_bytes``: every position
    in one row block where the columns stay at least MIN_COLUMNS, else fewer rows; row blocks of equal size.
    ``rows`` fixes the rows (the columns then follow from the budget)."""
    entries = max(1, workspace_bytes // TILE_BYTES_PER_ENTRY)
    positions = max(positions, 1)
    if rows is None:
        columns = min(vocab, max(MIN_COLUMNS, entries // positions))
        rows = max(1, entries // columns)
    else:
        columns = min(vocab, max(1, entries // rows))
    blocks = math.ceil(positions / min(rows, positions))
    return math.ceil(positions / blocks), columns


@dataclass(frozen=True)
class _Settings:
    potential: Potential
    temperature: float
    dtype: torch.dtype
    rows: int
    columns: int
    with_norms: bool

    @property
    def logits_dtype(self) -> torch.dtype:
        """float32, as the trainer's logits were; float64 where the projection itself is (checks in float64)."""
        return torch.promote_types(self.dtype, torch.float32)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int, stop: int,
            settings: _Settings) -> torch.Tensor:
    """float32 tempered logits of one tile: the head's projection in the compute dtype, then float, then / T."""
    w = weight[start:stop].to(settings.dtype)
    z = torch.mm(hidden, w.t()) if bias is None else torch.addmm(bias[start:stop].to(settings.dtype), hidden, w.t())
    z = z.to(settings.logits_dtype)
    if settings.temperature != 1.0:
        z = z.div_(settings.temperature)
    return z


def _fold(running_max: torch.Tensor, running_sum: torch.Tensor, z: torch.Tensor) -> None:
    """Online logsumexp: fold a tile into each row's (max, sum of exp(z - max))."""
    new_max = torch.maximum(running_max, z.amax(-1))
    running_sum.mul_(torch.exp(running_max - new_max)).add_(torch.exp(z - new_max.unsqueeze(-1)).sum(-1))
    running_max.copy_(new_max)


def _target_columns(targets: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(whether each row's sampled token falls in vocabulary columns [start, stop), its column in the tile, clamped
    into it where not): a gather or scatter with these reads no count back to the host (no sync on a GPU)."""
    inside = (targets >= start) & (targets < stop)
    return inside, (targets - start).clamp(0, stop - start - 1).unsqueeze(-1)


def _no_autocast(device: torch.device) -> Any:
    """The tiles pick their dtypes themselves (``compute_dtype``), whatever autocast the caller runs under."""
    return torch.autocast(device.type, enabled=False) if torch.is_autocast_enabled(device.type) else nullcontext()


def _accumulate(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out (float32, or float64) += a @ b, the product in a's dtype."""
    if a.dtype == out.dtype:
        out.addmm_(a, b)
    else:
        out.add_(torch.mm(a, b))


class _TiledFullForm(torch.autograd.Function):
    """See the module docstring. Outputs (logps, divergence, policy_norms, divergence_norms), each [N]; the norms are
    empty unless ``with_norms``. Its backward takes no second derivative (once_differentiable)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                ref_hidden: torch.Tensor, ref_weight: torch.Tensor, ref_bias: torch.Tensor | None,
                targets: torch.Tensor, settings: _Settings) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        positions, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device
        wide = dict(dtype=torch.float64, device=device)
        working = dict(dtype=settings.logits_dtype, device=device)
        stats = {name: torch.empty(positions, **working)
                 for name in ("max_p", "log_sum_p", "max_q", "log_sum_q", "logit_y")}
        divergence, slope_sum = torch.zeros(positions, **wide), torch.zeros(positions, **wide)
        if settings.with_norms:
            p_squares, slope_squares, slope_p = (torch.zeros(positions, **wide) for _ in range(3))
        with _no_autocast(device):
            for row in range(0, positions, settings.rows):
                rows = slice(row, row + settings.rows)
                h, h_ref, y = hidden[rows].to(settings.dtype), ref_hidden[rows].to(settings.dtype), targets[rows]
                n = h.shape[0]
                max_p, sum_p = torch.full((n,), -math.inf, **working), torch.zeros(n, **working)
                max_q, sum_q = torch.full((n,), -math.inf, **working), torch.zeros(n, **working)
                logit_y = stats["logit_y"][rows]
                for start in range(0, vocab, settings.columns):
                    stop = min(start + settings.columns, vocab)
                    z = _logits(h, weight, bias, start, stop, settings)
                    _fold(max_p, sum_p, z)
                    inside, column = _target_columns(y, start, stop)
                    logit_y.copy_(torch.where(inside, z.gather(-1, column).squeeze(-1), logit_y))
                    del z
                    _fold(max_q, sum_q, _logits(h_ref, ref_weight, ref_bias, start, stop, settings))
                log_sum_p, log_sum_q = torch.log(sum_p), torch.log(sum_q)
                for start in range(0, vocab, settings.columns):
                    stop = min(start + settings.columns, vocab)
                    logp = (_logits(h, weight, bias, start, stop, settings) - max_p[:, None]) - log_sum_p[:, None]
                    logq = (_logits(h_ref, ref_weight, ref_bias, start, stop, settings) - max_q[:, None]) \
                        - log_sum_q[:, None]
                    value, slope = settings.potential.bregman_and_slope_from_logprobs(logp, logq)
                    del logq
                    divergence[rows] += value.sum(-1, dtype=torch.float64)
                    del value
                    slope_sum[rows] += slope.sum(-1, dtype=torch.float64)
                    if settings.with_norms:  # float64 products: the norm below is a difference of these sums
                        p_wide, slope_wide = torch.exp(logp).double(), slope.double()
                        p_squares[rows] += (p_wide * p_wide).sum(-1)
                        slope_squares[rows] += (slope_wide * slope_wide).sum(-1)
                        slope_p[rows] += (slope_wide * p_wide).sum(-1)
                        del p_wide, slope_wide
                    del logp, slope
                for name, value in (("max_p", max_p), ("log_sum_p", log_sum_p), ("max_q", max_q),
                                    ("log_sum_q", log_sum_q)):
                    stats[name][rows] = value
        logps = (stats["logit_y"] - stats["max_p"]) - stats["log_sum_p"]
        policy_norms = divergence_norms = hidden.new_empty(0, dtype=settings.logits_dtype)
        if settings.with_norms:
            # ||e_y - p||^2 = 1 - 2 p_y + sum p^2;  ||a - p s||^2 = sum a^2 - 2 s sum a p + s^2 sum p^2
            policy_norms = (1.0 - 2.0 * torch.exp(logps.double()) + p_squares).clamp_min(0.0).sqrt()
            divergence_norms = (slope_squares - 2.0 * slope_sum * slope_p + slope_sum * slope_sum * p_squares
                                ).clamp_min(0.0).sqrt()
            policy_norms, divergence_norms = (x.to(settings.logits_dtype) for x in (policy_norms, divergence_norms))
        ctx.save_for_backward(hidden, weight, bias, ref_hidden, ref_weight, ref_bias, targets, stats["max_p"],
                              stats["log_sum_p"], stats["max_q"], stats["log_sum_q"],
                              slope_sum.to(settings.logits_dtype))
        ctx.settings = settings
        ctx.mark_non_differentiable(policy_norms, divergence_norms)
        return logps, divergence.to(settings.logits_dtype), policy_norms, divergence_norms

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logps: torch.Tensor | None, grad_divergence: torch.Tensor | None,
                 *_: Any) -> tuple[torch.Tensor | None, ...]:
        nothing = (None,) * 8
        if grad_logps is None and grad_divergence is None:
            return nothing
        (hidden, weight, bias, ref_hidden, ref_weight, ref_bias, targets, max_p, log_sum_p, max_q, log_sum_q,
         slope_sum) = ctx.saved_tensors
        settings: _Settings = ctx.settings
        positions, vocab = hidden.shape[0], weight.shape[0]
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        working = dict(dtype=settings.logits_dtype, device=hidden.device)
        grad_hidden = torch.zeros(hidden.shape, **working) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, **working) if need_weight else None
        grad_bias = torch.zeros(bias.shape, **working) if need_bias else None
        # the part of grad z proportional to p: -(g_logp + g_D s) per position
        p_weight = torch.zeros(positions, **working)
        if grad_logps is not None:
            p_weight -= grad_logps
        if grad_divergence is not None:
            p_weight -= grad_divergence * slope_sum
        with _no_autocast(hidden.device):
            for row in range(0, positions, settings.rows):
                rows = slice(row, row + settings.rows)
                h, y = hidden[rows].to(settings.dtype), targets[rows]
                h_ref = ref_hidden[rows].to(settings.dtype) if grad_divergence is not None else None
                for start in range(0, vocab, settings.columns):
                    stop = min(start + settings.columns, vocab)
                    logp = (_logits(h, weight, bias, start, stop, settings) - max_p[rows, None]) \
                        - log_sum_p[rows, None]
                    grad = torch.exp(logp).mul_(p_weight[rows, None])
                    if grad_divergence is not None:
                        logq = (_logits(h_ref, ref_weight, ref_bias, start, stop, settings) - max_q[rows, None]) \
                            - log_sum_q[rows, None]
                        _, slope = settings.potential.bregman_and_slope_from_logprobs(logp, logq)
                        del logq
                        grad.addcmul_(slope, grad_divergence[rows, None].to(grad.dtype))
                        del slope
                    del logp
                    if grad_logps is not None:
                        inside, column = _target_columns(y, start, stop)
                        grad.scatter_add_(-1, column, (grad_logps[rows] * inside).to(grad.dtype).unsqueeze(-1))
                    if settings.temperature != 1.0:
                        grad.div_(settings.temperature)
                    if grad_bias is not None:
                        grad_bias[start:stop] += grad.sum(0)
                    grad = grad.to(settings.dtype)
                    if grad_hidden is not None:
                        _accumulate(grad_hidden[rows], grad, weight[start:stop].to(settings.dtype))
                    if grad_weight is not None:
                        _accumulate(grad_weight[start:stop], grad.t(), h)
                    del grad
        return (None if grad_hidden is None else grad_hidden.to(hidden.dtype),
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None, None)


def tiled_full_form(potential: Potential, hidden: torch.Tensor, weight: torch.Tensor, ref_hidden: torch.Tensor,
                    ref_weight: torch.Tensor, targets: torch.Tensor, *, bias: torch.Tensor | None = None,
                    ref_bias: torch.Tensor | None = None, temperature: float = 1.0,
                    compute_dtype: torch.dtype | None = None, rows: int | None = None,
                    workspace_bytes: int | None = None, with_norms: bool = False) -> FullForm:
    """log p(y) and sum_v d(softmax(z)_v, softmax(z_ref)_v) per position, z = (hidden W^T + bias) / temperature.

    ``hidden`` [..., H] and ``targets`` [...] (the sampled tokens) give the result's shape; ``weight`` [V, H] is the
    policy's LM head (trainable or frozen: its gradient is taken where it requires one), ``ref_hidden`` [..., H_ref]
    and ``ref_weight`` [V, H_ref] the reference's (no gradient). ``compute_dtype``: the projection's dtype (default
    the head's). ``rows`` fixes the positions of a tile and ``workspace_bytes`` its budget (default
    ``default_workspace_bytes``); neither changes a value beyond float32 rounding. ``with_norms``: also the
    per-position gradient norms the logit-space gradient share needs (mirror_maps.forms' full form has no such
    output: its logits exist, and autograd gives them).
    """
    if hidden.shape[:-1] != targets.shape or ref_hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {list(hidden.shape)}, ref_hidden {list(ref_hidden.shape)} and targets "
                         f"{list(targets.shape)} must share their leading dimensions")
    if weight.shape[0] != ref_weight.shape[0]:
        raise ValueError(f"the policy's head has {weight.shape[0]} rows, the reference's {ref_weight.shape[0]}: "
                         "the two vocabularies must be the same")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if targets.numel() and not (0 <= int(targets.min()) and int(targets.max()) < weight.shape[0]):
        raise ValueError(f"targets must be token ids in [0, {weight.shape[0]}), got [{int(targets.min())}, "
                         f"{int(targets.max())}]")
    lead = targets.shape
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_ref = ref_hidden.detach().reshape(-1, ref_hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    positions, vocab = flat.shape[0], weight.shape[0]
    budget = workspace_bytes if workspace_bytes is not None else default_workspace_bytes(positions, vocab,
                                                                                         hidden.device)
    tile_rows, columns = tile_shape(positions, vocab, budget, rows)
    logger.debug("tiled full form: %d positions, vocabulary %d, tiles of %d x %d", positions, vocab, tile_rows,
                 columns)
    settings = _Settings(potential, float(temperature), compute_dtype or weight.dtype, tile_rows, columns,
                         with_norms)
    logps, divergence, policy_norms, divergence_norms = _TiledFullForm.apply(
        flat, weight, bias, flat_ref, ref_weight.detach(), None if ref_bias is None else ref_bias.detach(),
        flat_targets, settings)
    if not with_norms:
        return FullForm(logps.reshape(lead), divergence.reshape(lead), None, None)
    return FullForm(logps.reshape(lead), divergence.reshape(lead), policy_norms.reshape(lead),
                    divergence_norms.reshape(lead))

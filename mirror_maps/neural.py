"""The neural mirror map: 126 neurons in six activation blocks plus a quadratic and an entropy term.

h'(y) = sum_j v_j s_j(w_j y + b_j) + a y + c log y, with the 380 numbers stored flat as
[v(126), w(126), b(126), a, c]. The stored vector is the ES search variable; `param_transform` maps it to
the parameters actually used, every time they are read:

- "abs" (default): |x|. Every parameter >= 0 makes h convex and d >= 0 (docs/method.md §2). It equals "none" on the
  authors' U(0, 0.01) init, and an ES perturbation that pushes a coordinate below 0 is reflected instead
  of breaking convexity. "softplus" also guarantees convexity but maps 0.01 to 0.70, far from the
  authors' scale, so it changes what a given vector means.
- "none": the values as given, like the authors' code. Then d can be negative: any v_j < 0, a < 0 or
  c < 0; any w_j < 0 (H_j'' = w_j s_j'(u) turns concave); and the u^2 block wherever u = w y + b < 0
  (s = u^2 decreases there).
- "softplus": log(1 + e^x).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mirror_maps.fused import exact_block, fused_bregman
from mirror_maps.neurons import BLOCK_BREGMAN, EXP_BLOCK, NEURONS_PER_BLOCK, NUM_NEURONS, activations, neuron_bregman
from mirror_maps.numerics import PROB_FLOOR, generalized_kl, generalized_kl_from_logs
from mirror_maps.potentials import Potential
from mirror_maps.taylor import (SMALL_PROB, taylor_bregman, taylor_bregman_and_slope, taylor_degree,
                               taylor_plan)

VECTOR_LENGTH = 3 * NUM_NEURONS + 2
PARAM_TRANSFORMS = ("none", "abs", "softplus")
DEFAULT_PARAM_TRANSFORM = "abs"
#: the authors' random map (NM-GRPO): ``random_init(AUTHORS_INIT_SEED)``, every coordinate U(0, 0.01)
AUTHORS_INIT_SEED = 42


def _apply_transform(raw: torch.Tensor, param_transform: str) -> torch.Tensor:
    if param_transform == "none":
        return raw
    if param_transform == "abs":
        return raw.abs()
    if param_transform == "softplus":
        return F.softplus(raw)
    raise ValueError(f"param_transform={param_transform!r} is unknown; use one of {PARAM_TRANSFORMS}")


def vector_for_parameters(params: torch.Tensor, param_transform: str) -> torch.Tensor:
    """The search vector that ``param_transform`` maps to ``params``: for a map fixed by its parameters (the authors'
    U(0, 0.01) init) whatever transform a search uses. ValueError when the transform cannot reach ``params``."""
    if param_transform not in PARAM_TRANSFORMS:
        raise ValueError(f"param_transform={param_transform!r} is unknown; use one of {PARAM_TRANSFORMS}")
    if param_transform == "none":
        return params.clone()
    if bool((params < 0).any()) or (param_transform == "softplus" and bool((params == 0).any())):
        raise ValueError(f"param_transform={param_transform!r} cannot give a map parameters <= 0")
    if param_transform == "abs":
        return params.clone()
    return torch.log(torch.expm1(params))


def _check_vector(vector: torch.Tensor) -> None:
    if not isinstance(vector, torch.Tensor):
        raise ValueError(f"a mirror-map vector must be a torch.Tensor, got {type(vector).__name__}")
    if vector.dim() != 1 or vector.numel() != VECTOR_LENGTH:
        raise ValueError(
            f"a mirror-map vector must have shape [{VECTOR_LENGTH}] ([v(126), w(126), b(126), a, c]), "
            f"got {list(vector.shape)}"
        )
    if not vector.is_floating_point():
        raise ValueError(f"a mirror-map vector must be floating point, got {vector.dtype}")
    if not torch.isfinite(vector).all():
        raise ValueError("a mirror-map vector contains NaN or inf")


def _neuron_sum_for_small_probabilities(
    p: torch.Tensor, q: torch.Tensor, v: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """sum_j v_j D_j(p, q), equal to neuron_bregman but fast when most entries are below SMALL_PROB."""
    coefficients, exact_neurons = taylor_plan(v, w, b, taylor_degree(p.dtype))
    small = (p <= SMALL_PROB) & (q <= SMALL_PROB)
    zero = torch.zeros_like(p)
    total = taylor_bregman(torch.where(small, p, zero), torch.where(small, q, zero), coefficients)
    if bool(exact_neurons.any()):
        total = total + neuron_bregman(p, q, v, w, b, selected=exact_neurons)
    large = (~small).nonzero(as_tuple=True)
    if large[0].numel() > 0:
        total = total.index_put(large, neuron_bregman(p[large], q[large], v, w, b))
    return total


def _exact_neurons_and_slope(p: torch.Tensor, q: torch.Tensor, v: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                             selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_j v_j D_j, its p-derivative sum_j v_j (s_j(u_p) - s_j(u_q))) over the ``selected`` neurons (the kinked
    ones and fast exp ones that taylor_plan leaves out), each written without cancellation (mirror_maps.fused). One
    neuron at a time: the work per entry stays that of one neuron, however many a map leaves to the exact formulas."""
    value, slope = torch.zeros_like(p), torch.zeros_like(p)
    p_row, q_row = p.reshape(1, -1), q.reshape(1, -1)
    for neuron in selected.nonzero(as_tuple=True)[0].tolist():
        block = neuron // NEURONS_PER_BLOCK
        w_j, b_j = w[neuron:neuron + 1, None], b[neuron:neuron + 1, None]
        if block == EXP_BLOCK:  # d/dp = e^(u_p) - e^(u_q) = e^(u_q) expm1(w (p - q))
            term = BLOCK_BREGMAN[block](p_row, q_row, w_j, b_j)
            term_p = torch.exp(w_j * q_row + b_j) * torch.expm1(w_j * (p_row - q_row))
        else:
            term, term_p, _ = exact_block(block, p_row, q_row, w_j, b_j, grads=True)
        value.addcmul_(term.reshape(p.shape), v[neuron])  # a 0-d tensor: no host read on a GPU
        slope.addcmul_(term_p.reshape(p.shape), v[neuron])
    return value, slope


def _neuron_sum_and_slope_for_small_probabilities(
    p: torch.Tensor, q: torch.Tensor, v: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """_neuron_sum_for_small_probabilities and its derivative in p, without an autograd graph over every entry: the
    Taylor polynomial's slope in closed form, the exact neurons' analytic partials; only the few entries above
    SMALL_PROB (at most 2 / SMALL_PROB a distribution pair) go through autograd."""
    coefficients, exact_neurons = taylor_plan(v, w, b, taylor_degree(p.dtype))
    small = (p <= SMALL_PROB) & (q <= SMALL_PROB)
    zero = torch.zeros_like(p)
    total, slope = taylor_bregman_and_slope(torch.where(small, p, zero), torch.where(small, q, zero), coefficients)
    if bool(exact_neurons.any()):
        exact, exact_slope = _exact_neurons_and_slope(p, q, v, w, b, exact_neurons)
        total, slope = total + exact, slope + exact_slope
    large = (~small).nonzero(as_tuple=True)
    if large[0].numel() > 0:
        with torch.enable_grad():
            p_large = p[large].detach().requires_grad_(True)
            value = neuron_bregman(p_large, q[large], v, w, b)
            (value_p,) = torch.autograd.grad(value.sum(), p_large)
        total = total.index_put(large, value.detach())
        slope = slope.index_put(large, value_p)
    return total, slope


class NeuralMirrorMap(nn.Module, Potential):
    """Learned potential (docs/method.md §2). Build it with `from_vector` or `random_init`; `to_vector` round-trips.

    Computation runs in the dtype of the probabilities passed in (parameters are cast to it), so the same
    map serves float32 training and float64 checks. The raw vector is an nn.Parameter that does not
    require grad by default (the map is fixed during a GRPO run); call `requires_grad_(True)` to
    differentiate with respect to it.
    """

    name = "neural_mirror"

    def __init__(self, vector: torch.Tensor, param_transform: str = DEFAULT_PARAM_TRANSFORM) -> None:
        super().__init__()
        _check_vector(vector)
        if param_transform not in PARAM_TRANSFORMS:
            raise ValueError(f"param_transform={param_transform!r} is unknown; use one of {PARAM_TRANSFORMS}")
        self.param_transform = param_transform
        self.raw = nn.Parameter(vector.detach().clone(), requires_grad=False)

    @classmethod
    def from_vector(cls, vector: torch.Tensor, param_transform: str = DEFAULT_PARAM_TRANSFORM) -> "NeuralMirrorMap":
        """Map from the 380-long search vector [v(126), w(126), b(126), a, c]."""
        return cls(vector, param_transform=param_transform)

    @classmethod
    def random_init(
        cls,
        seed: int,
        scale: float = 0.01,
        param_transform: str = DEFAULT_PARAM_TRANSFORM,
        dtype: torch.dtype = torch.float32,
    ) -> "NeuralMirrorMap":
        """Every coordinate U(0, scale) from a local generator (the global RNG is left untouched)."""
        if not scale > 0:
            raise ValueError(f"random_init scale must be > 0, got {scale}")
        generator = torch.Generator().manual_seed(int(seed))
        vector = torch.rand(VECTOR_LENGTH, generator=generator, dtype=torch.float64) * scale
        return cls(vector.to(dtype), param_transform=param_transform)

    def to_vector(self) -> torch.Tensor:
        """The stored search vector (before the transform), detached."""
        return self.raw.detach().clone()

    def parameters_for(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(v, w, b, a, c) after the transform, cast to `dtype`."""
        params = _apply_transform(self.raw, self.param_transform).to(dtype)
        v, w, b, tail = params.split([NUM_NEURONS, NUM_NEURONS, NUM_NEURONS, 2])
        return v, w, b, tail[0], tail[1]

    def _dtype_for(self, y: torch.Tensor) -> torch.dtype:
        return y.dtype if y.is_floating_point() else self.raw.dtype

    def h_prime(self, y: torch.Tensor) -> torch.Tensor:
        v, w, b, a, c = self.parameters_for(self._dtype_for(y))
        u = y.unsqueeze(-1) * w + b
        return activations(u) @ v + a * y + c * torch.log(y.clamp_min(PROB_FLOOR))

    def h(self, y: torch.Tensor) -> torch.Tensor:
        """h(y) = sum_j v_j H_j(y) + a y^2/2 + c (y log y - y), H_j(0) = 0.

        H_j(y) = s_j(b_j) y + D_j(y, 0), which needs no division by w_j.
        """
        v, w, b, a, c = self.parameters_for(self._dtype_for(y))
        zeros = torch.zeros_like(y)
        linear = (activations(b) @ v) * y
        y_log = y.clamp_min(PROB_FLOOR)
        return linear + neuron_bregman(y, zeros, v, w, b) + 0.5 * a * y * y + c * (y_log * torch.log(y_log) - y_log)

    def bregman(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Elementwise d(p, q). With the map held fixed (its vector needs no gradient, the GRPO case) this
        runs mirror_maps.fused: value and analytic gradients in one cache-sized pass, no autograd graph.
        Differentiating with respect to the vector takes the autograd path through mirror_maps.neurons."""
        v, w, b, a, c = self.parameters_for(self._dtype_for(p))
        if not (torch.is_grad_enabled() and self.raw.requires_grad):
            return fused_bregman(p, q, v, w, b, a, c)
        delta = p - q
        return neuron_bregman(p, q, v, w, b) + 0.5 * a * delta * delta + c * generalized_kl(p, q)

    def bregman_from_logprobs(self, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
        """Elementwise d from log-probabilities, tuned for full vocabularies (mostly tiny probabilities).

        Entries with p, q <= 1e-3 use one Taylor polynomial for all neurons analytic there
        (mirror_maps.taylor, truncation below unit roundoff); other neurons and other entries use the
        exact per-neuron formulas. The entropy term works from the logs, so no 1e-10 clamp applies.
        """
        v, w, b, a, c = self.parameters_for(self._dtype_for(logp))
        p = torch.exp(logp)
        q = torch.exp(logq)
        delta = p - q
        neurons = _neuron_sum_for_small_probabilities(p, q, v, w, b)
        return neurons + 0.5 * a * delta * delta + c * generalized_kl_from_logs(logp, logq)

    @torch.no_grad()
    def bregman_and_slope_from_logprobs(self, logp: torch.Tensor,
                                        logq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``bregman_from_logprobs``, its derivative in logp) with the map held constant: p (dd/dp) with
        dd/dp = sum_j v_j (s_j(u_p) - s_j(u_q)) + a (p - q) + c log(p/q), each part cancellation-free."""
        v, w, b, a, c = self.parameters_for(self._dtype_for(logp))
        p = torch.exp(logp)
        q = torch.exp(logq)
        delta = p - q
        neurons, neurons_p = _neuron_sum_and_slope_for_small_probabilities(p, q, v, w, b)
        value = neurons + 0.5 * a * delta * delta + c * generalized_kl_from_logs(logp, logq)
        return value, p * (neurons_p + a * delta + c * (logp - logq))

    def forward(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Calling the module is `bregman(p, q)` (lets torch.func.functional_call swap the vector)."""
        return self.bregman(p, q)

    def extra_repr(self) -> str:
        return f"param_transform={self.param_transform!r}"

"""A family of synthetic unrolled inner problems: stand-ins for a training run whose outcome depends on the map.

Each problem is a run of ``horizon`` steps whose state evolves under the 380-vector x (fixed over a truncation, changed
at a truncation's boundary, as a mirror map is): ``step`` advances the state by one training step, ``score`` is its
validation pass@1 (``measure``: as a finite validation set would report it). The full-horizon optimum, the start and
a distance to the optimum are known, so a search's result can be judged. The problems differ in structure, so that a
searcher's defaults are chosen on a family, not on one problem:

- ``rate_floor``: SGD on a noisy quadratic (L <- (1 - r)^2 L + r^2 floor, score 1 - L); the map sets the rate r. A
  large rate wins a few steps, a small one many: short members are biased (Wu et al., ICLR 2018).
- ``opposed``: early gains favour a weak regulariser (large z), a mid-run collapse punishes it, more strongly than the
  early phase rewards it; the full-run optimum lies between (the shape of "weak regularisation wins short runs").
- ``plateau``: an approach to a plateau whose height falls as the speed rises, measured on 90 problems (binomial
  noise of greedy pass@1): a truncation's change is often below the measurement's step of 1/90.
- ``many``: many coordinates matter, with curvatures spread over two decades (a quality factor over 96 coordinates),
  and a rate along a direction of the others: a search must move many coordinates by different amounts.

Pure Python (no torch): member processes import it. The synthetic member (meta/synthetic.py) runs these through the
truncation contract; bench/bench_nres.py runs them in-process.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

DIM = 380
#: the offset around which every problem is laid out (the synthetic objectives' ``target``)
TARGET = 0.02
#: the direction that sets a problem's rate: the synthetic slope direction's seed, kept so rate_floor is unchanged
DIRECTION_SEED = "synthetic-slope-direction"


@functools.lru_cache(maxsize=8)
def unit_direction(dim: int, seed: str = DIRECTION_SEED, support: tuple[int, int] | None = None) -> tuple[float, ...]:
    """A fixed unit vector (Gaussian, normalised) drawn from ``seed``; zero outside ``support`` = [lo, hi) if given."""
    rng = random.Random(seed)
    raw = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    if support is not None:
        raw = [v if support[0] <= i < support[1] else 0.0 for i, v in enumerate(raw)]
    norm = math.sqrt(sum(v * v for v in raw))
    return tuple(v / norm for v in raw)


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(float(x) * y for x, y in zip(a, b))


def golden_max(f: Any, lo: float, hi: float, iterations: int = 80) -> float:
    """The argmax of a unimodal ``f`` on [lo, hi] (golden-section search)."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2.0


@dataclass(frozen=True)
class UnrolledProblem:
    """A run of ``horizon`` steps: state -> state under x; score in [0, 1]; its optimum over x at the full horizon.

    Subclasses set ``name`` and the dynamics. ``z(x)`` is the coordinate along ``direction`` (scaled) that sets the
    speed of learning; problems with more coordinates say so in ``distance``."""

    name: str = ""
    scale: float = 30.0
    #: the start's coordinate along the rate direction
    z_start: float = 0.0
    direction_support: tuple[int, int] | None = None
    #: the state at step 0
    start_state: float = 0.1

    # -------------------------------------------------------------- geometry
    @property
    def direction(self) -> tuple[float, ...]:
        return unit_direction(DIM, DIRECTION_SEED, self.direction_support)

    def z(self, x: Sequence[float]) -> float:
        return self.scale * sum(w * (float(v) - TARGET) for w, v in zip(self.direction, x))

    def point(self, z: float, base: Sequence[float] | None = None) -> list[float]:
        """The vector ``base`` (default: TARGET everywhere) moved along the rate direction to coordinate ``z``."""
        base = list(base) if base is not None else [TARGET] * DIM
        shift = (z - self.z(base)) / self.scale
        return [b + w * shift for b, w in zip(base, self.direction)]

    def start(self) -> list[float]:
        """Where a search of this problem starts."""
        return self.point(self.z_start)

    # -------------------------------------------------------------- dynamics
    def initial(self) -> Any:
        """The state at step 0 (a float here: every problem of the family carries one number)."""
        return self.start_state

    def features(self, x: Sequence[float]) -> tuple[float, ...]:
        """What a step reads of x, computed once per vector (x is fixed over a run or a truncation): z here."""
        return (self.z(x),)

    def step(self, state: Any, features: tuple[float, ...], t: int, horizon: int) -> Any:
        """One training step from ``state`` with the vector's ``features``."""
        raise NotImplementedError

    def score(self, state: Any) -> float:
        """The noise-free validation score of ``state`` (the state itself here)."""
        return float(state)

    def measure(self, state: Any, key: str) -> float:
        """The score as a validation pass reports it (noise-free unless the problem says otherwise); ``key`` names the
        measurement (particle, run, step), so a repeated measurement is the same number."""
        return self.score(state)

    def run(self, x: Sequence[float], horizon: int, steps: int | None = None) -> float:
        """The noise-free score after ``steps`` (default ``horizon``) steps of a run with a fixed x."""
        state, features = self.initial(), self.features(x)
        for t in range(horizon if steps is None else steps):
            state = self.step(state, features, t, horizon)
        return self.score(state)

    # -------------------------------------------------------------- the optimum
    def optimum(self, horizon: int) -> list[float]:
        """The best fixed x for a run of ``horizon`` steps."""
        z = golden_max(lambda v: self.run(self.point(v), horizon), -8.0, 8.0)
        return self.point(z)

    def distance(self, x: Sequence[float], horizon: int) -> float:
        """How far x is from the full-horizon optimum, in the problem's own units (|z - z*| here)."""
        return abs(self.z(x) - self.z(self.optimum_cached(horizon)))

    def regret(self, x: Sequence[float], horizon: int) -> float:
        """The full-horizon score given up against the optimum (noise-free)."""
        return self.run(self.optimum_cached(horizon), horizon) - self.run(x, horizon)

    def optimum_cached(self, horizon: int) -> list[float]:
        return _optimum(self, horizon)


@functools.lru_cache(maxsize=64)
def _optimum(problem: UnrolledProblem, horizon: int) -> list[float]:
    return problem.optimum(horizon)


@dataclass(frozen=True)
class RateFloor(UnrolledProblem):
    """SGD on a noisy quadratic: the loss L <- (1 - r)^2 L + r^2 floor, r = sigmoid(z), score 1 - L."""

    name: str = "rate_floor"
    floor: float = 0.5
    z_start: float = -1.0
    start_state: float = 1.0  # the loss

    def step(self, state: float, features: tuple[float, ...], t: int, horizon: int) -> float:
        return self.advance_loss(state, sigmoid(features[0]))

    def advance_loss(self, loss: float, rate: float) -> float:
        """One SGD step at ``rate``: the noise floor's share grows with the rate squared."""
        return (1.0 - rate) ** 2 * loss + rate * rate * self.floor

    def score(self, state: float) -> float:
        return 1.0 - state


@dataclass(frozen=True)
class Opposed(UnrolledProblem):
    """Three phases of a run: early, the score rises at a speed growing with z (a weak regulariser learns fast); mid-run,
    a collapse takes a share of the score that grows faster with z than the early gain did; late, a slow recovery at
    a speed independent of z. The full-run optimum is between the early phase's (z large) and the collapse's (z
    small)."""

    name: str = "opposed"
    #: the steps of a run over which the phases are laid (a property of the training, not of the horizon asked)
    run_steps: int = 64
    gain: float = 0.06
    collapse: float = 0.05
    sharpness: float = 1.2
    center: float = 1.0
    z_start: float = -1.0

    def step(self, state: float, features: tuple[float, ...], t: int, horizon: int) -> float:
        z = features[0]
        phase = min(2, 3 * t // self.run_steps)
        if phase == 0:
            return state + self.gain * sigmoid(z) * (1.0 - state)
        if phase == 1:
            return state - self.collapse * sigmoid(self.sharpness * (z - self.center)) * state
        return state + 0.25 * self.gain * (1.0 - state)


@dataclass(frozen=True)
class Plateau(UnrolledProblem):
    """An approach to a plateau: s <- s + k (h - s), the speed k = sigmoid(z) / 8 rising with z and the height
    h = 0.85 - 0.35 sigmoid(z - 1) falling with it; measured as greedy pass@1 on ``problems`` problems (a binomial
    draw), so a truncation's change is often below the measurement's step."""

    name: str = "plateau"
    problems: int = 90
    z_start: float = -1.5
    start_state: float = 0.2

    def step(self, state: float, features: tuple[float, ...], t: int, horizon: int) -> float:
        z = features[0]
        speed, height = sigmoid(z) / 8.0, 0.85 - 0.35 * sigmoid(z - 1.0)
        return state + speed * (height - state)

    def measure(self, state: float, key: str) -> float:
        rng = random.Random(f"plateau:{key}")
        p = min(1.0, max(0.0, self.score(state)))
        return sum(rng.random() < p for _ in range(self.problems)) / self.problems


#: the coordinates of ``many``'s quality factor, and the ones its rate direction lives on
MANY_QUALITY = (0, 96)
MANY_RATE = (96, DIM)


@functools.lru_cache(maxsize=2)
def many_layout(seed: str = "synthetic-many") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``many``'s optimum offsets (per quality coordinate, up to one radius of 0.01 from TARGET) and curvatures
    (log-spaced over two decades, shuffled)."""
    rng = random.Random(seed)
    count = MANY_QUALITY[1] - MANY_QUALITY[0]
    offsets = tuple(TARGET + 0.01 * rng.uniform(-1.0, 1.0) for _ in range(count))
    curvatures = [10 ** (1.0 + 2.0 * i / (count - 1)) for i in range(count)]
    rng.shuffle(curvatures)
    return offsets, tuple(curvatures)


@dataclass(frozen=True)
class Many(UnrolledProblem):
    """Many coordinates matter: the score approaches a height q(x) = exp(-sum_i c_i (x_i - m_i)^2 / 2) x 0.9 over 96
    coordinates with curvatures c_i from 10 to 1,000 (per coordinate, in x's units, where the radius is 0.01), at a
    speed set by z along a direction of the other coordinates (a larger speed overshoots: s <- s + k (q - s) - k^2 s /
    2), so the search must move many coordinates by different amounts and one direction to a horizon's optimum."""

    name: str = "many"
    z_start: float = 0.0
    direction_support: tuple[int, int] | None = MANY_RATE

    def height(self, x: Sequence[float]) -> float:
        offsets, curvatures = many_layout()
        lo = MANY_QUALITY[0]
        spread = sum(c * (float(x[lo + i]) - m) ** 2 for i, (m, c) in enumerate(zip(offsets, curvatures)))
        return 0.9 * math.exp(-spread / 2.0)

    def start(self) -> list[float]:
        return self.point(self.z_start)

    def features(self, x: Sequence[float]) -> tuple[float, ...]:
        return (self.z(x), self.height(x))

    def step(self, state: float, features: tuple[float, ...], t: int, horizon: int) -> float:
        speed, height = sigmoid(features[0]), features[1]
        return state + 0.2 * speed * (height - state) - 0.04 * speed * speed * state

    def optimum(self, horizon: int) -> list[float]:
        offsets, _ = many_layout()
        base = [TARGET] * DIM
        base[MANY_QUALITY[0]:MANY_QUALITY[1]] = offsets
        z = golden_max(lambda v: self.run(self.point(v, base), horizon), -8.0, 8.0)
        return self.point(z, base)

    def distance(self, x: Sequence[float], horizon: int) -> float:
        """sqrt(|z - z*|^2 + 0.09 sum_i (c_i / 1000) ((x_i - m_i) / 0.01)^2): the rate coordinate in z and the quality
        coordinates in radii of 0.01 weighted by their curvature against the stiffest, converted to z's units (one
        radius along the rate direction is 0.3 in z)."""
        offsets, curvatures = many_layout()
        lo = MANY_QUALITY[0]
        spread = sum(c / 1000.0 * ((float(x[lo + i]) - m) / 0.01) ** 2
                     for i, (m, c) in enumerate(zip(offsets, curvatures)))
        z_gap = self.z(x) - self.z(self.optimum_cached(horizon))
        return math.sqrt(z_gap * z_gap + (0.01 * self.scale) ** 2 * spread)


PROBLEMS: dict[str, type[UnrolledProblem]] = {cls.name: cls for cls in (RateFloor, Opposed, Plateau, Many)}


def problem_from_options(options: Mapping[str, Any]) -> UnrolledProblem:
    """The synthetic member's ``unrolled`` option as a problem: {problem: name (default rate_floor), ...its fields}."""
    settings = dict(options or {})
    name = str(settings.pop("problem", RateFloor.name))
    if name not in PROBLEMS:
        raise ValueError(f"inner.options.unrolled.problem={name!r} is unknown; choose one of {sorted(PROBLEMS)}")
    cls = PROBLEMS[name]
    known = {f for f in cls.__dataclass_fields__ if f != "name"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"inner.options.unrolled.{unknown[0]} is not a setting of problem {name}; known: {sorted(known)}")
    return cls(**settings)


__all__ = ["DIM", "PROBLEMS", "Many", "Opposed", "Plateau", "RateFloor", "TARGET", "UnrolledProblem",
           "problem_from_options", "unit_direction"]

"""Every searcher maximises a known objective of the 380-vector, deterministically and resumably."""
from __future__ import annotations

import io

import pytest
import torch

from meta.search.init import initial_center
from meta.searchers import build_searcher
from meta.synthetic import objective

# Per-searcher settings for a 20-member population on the synthetic objective (the defaults target real runs).
SETTINGS = {
    "pgpe": {"name": "pgpe", "radius": 0.01},
    "snes": {"name": "snes", "radius": 0.01},
    "cem": {"name": "cem", "radius": 0.01},
    "cmaes": {"name": "cmaes", "radius": 0.01, "diagonal": True},
    "openai_es_elite": {"name": "openai_es_elite", "radius": 0.01, "learning_rate": 0.001},
}
POP = 20


def _evaluate(values: torch.Tensor) -> torch.Tensor:
    return torch.tensor([objective(v.tolist()) for v in values], dtype=torch.float64)


def _run(cfg, generations, seed=0, start=None, until=None):
    searcher = start or build_searcher(cfg, initial_center("uniform", 0), POP, seed)
    first = 0 if start is None else until
    history = []
    for generation in range(first, generations):
        values = searcher.ask(generation)
        fitness = _evaluate(values)
        searcher.tell(generation, values, fitness, torch.ones(POP, dtype=torch.bool))
        history.append(values)
    return searcher, history


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_searcher_improves_the_objective(name):
    cfg = SETTINGS[name]
    start = objective(initial_center("uniform", 0).tolist())
    searcher, _ = _run(cfg, 25)
    end = objective(searcher.center.tolist())
    assert end > start + 0.05, f"{name}: centre fitness {start:.3f} -> {end:.3f}"


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_same_seed_same_search_and_resume_from_saved_state_is_identical(name):
    cfg = SETTINGS[name]
    reference, ref_history = _run(cfg, 6)
    again, again_history = _run(cfg, 6)
    assert all(torch.equal(a, b) for a, b in zip(ref_history, again_history))
    other, other_history = _run(cfg, 1, seed=1)
    assert not torch.equal(other_history[0], ref_history[0])

    # Stop after 3 generations, save through torch.save / weights_only load, rebuild, continue.
    half, _ = _run(cfg, 3)
    buffer = io.BytesIO()
    torch.save(half.state_dict(), buffer)
    buffer.seek(0)
    restored = build_searcher(cfg, initial_center("uniform", 0), POP, 0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    resumed, resumed_history = _run(cfg, 6, start=restored, until=3)
    assert all(torch.equal(a, b) for a, b in zip(ref_history[3:], resumed_history))
    assert torch.equal(resumed.center, reference.center)


def test_ask_does_not_disturb_the_global_rng():
    searcher = build_searcher({"name": "pgpe", "radius": 0.01}, initial_center("uniform", 0), 4, 0)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    searcher.ask(0)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", ["pgpe", "openai_es_elite"])
def test_antithetic_searchers_refuse_an_odd_population(name):
    with pytest.raises(ValueError, match="even population"):
        build_searcher({"name": name, "radius": 0.01}, initial_center("uniform", 0), 5, 0)


def test_non_finite_fitness_never_reaches_the_searcher():
    searcher = build_searcher({"name": "pgpe", "radius": 0.01}, initial_center("uniform", 0), 4, 0)
    values = searcher.ask(0)
    with pytest.raises(ValueError, match="non-finite"):
        searcher.tell(0, values, torch.tensor([0.1, float("nan"), 0.2, 0.3], dtype=torch.float64), torch.ones(4, dtype=torch.bool))


def test_unknown_setting_and_unknown_searcher_are_named():
    with pytest.raises(ValueError, match="es.learning_rat"):
        build_searcher({"name": "pgpe", "radius": 0.01, "learning_rat": 0.1}, initial_center("uniform", 0), 4, 0)
    with pytest.raises(ValueError, match="es.name='adam'"):
        build_searcher({"name": "adam"}, initial_center("uniform", 0), 4, 0)


def test_openai_es_elite_keeps_the_top_quarter_when_the_mean_does_not_improve():
    searcher = build_searcher({"name": "openai_es_elite", "radius": 0.01}, torch.zeros(380, dtype=torch.float64), 8, 0)
    ok = torch.ones(8, dtype=torch.bool)
    values = searcher.ask(0)
    searcher.tell(0, values, torch.full((8,), 0.5, dtype=torch.float64), ok)  # first step always accepted
    center = searcher.center
    values = searcher.ask(1)
    fitness = torch.tensor([0.1, 0.9, 0.2, 0.8, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # mean 0.25 < 0.5
    searcher.tell(1, values, fitness, ok)
    assert torch.equal(searcher.center, center)  # rejected
    nxt = searcher.ask(2)
    assert torch.equal(nxt[0], values[1]) and torch.equal(nxt[1], values[3])  # elites re-used, best first


def test_initial_centres():
    uniform = initial_center("uniform", 0)
    assert uniform.shape == (380,) and 0 <= uniform.min() and uniform.max() <= 0.01
    gaussian = initial_center("gaussian", 0)
    assert gaussian.min() < 0 < gaussian.max() and gaussian.std() == pytest.approx(0.01, rel=0.2)
    assert torch.equal(initial_center("uniform", 0), uniform)
    with pytest.raises(ValueError, match="init='nope'"):
        initial_center("nope", 0)


def test_the_uniform_centre_is_the_same_map_under_every_transform():
    """`uniform` documents a map (parameters U(0, 0.01)); under softplus the centre is the vector that gives it,
    not a vector U(0, 0.01), which softplus would read as parameters near 0.69 (a map ~100x stronger)."""
    from mirror_maps import NeuralMirrorMap

    maps = {t: NeuralMirrorMap.from_vector(initial_center("uniform", 3, t), param_transform=t)
            for t in ("abs", "none", "softplus")}
    params = {t: torch.cat([torch.atleast_1d(x) for x in m.parameters_for(torch.float64)]) for t, m in maps.items()}
    assert torch.equal(params["abs"], params["none"]) and 0 <= params["abs"].min() and params["abs"].max() <= 0.01
    assert torch.allclose(params["softplus"], params["abs"], rtol=1e-9, atol=1e-12)
    assert initial_center("uniform", 3, "softplus").max() < -4  # ~log(p): a perturbation of +-e scales p by e^(+-e)


def _cmaes_state_after(generations: int, cfg: dict) -> dict:
    half, _ = _run(cfg, generations)
    buffer = io.BytesIO()
    torch.save(half.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _perturb_cma_ask(monkeypatch, relative: float) -> None:
    """cma's ask as another CPU's numpy/BLAS kernels would answer it: the same draw, different last bits."""
    import cma
    import numpy as np

    original = cma.CMAEvolutionStrategy.ask

    def ask(self, *args, **kwargs):
        draws = original(self, *args, **kwargs)
        rng = np.random.default_rng(len(draws))
        return [x * (1.0 + relative * rng.standard_normal(x.shape)) for x in draws]

    monkeypatch.setattr(cma.CMAEvolutionStrategy, "ask", ask)


def test_cmaes_resumes_on_a_cpu_whose_kernels_round_differently(monkeypatch):
    """A search started on one kind of node resumes on another: the replay's last-bit differences are absorbed
    (the stored populations are told), and the resumed search continues exactly as the uninterrupted one."""
    cfg = {"name": "cmaes", "radius": 0.01, "diagonal": False}
    reference, ref_history = _run(cfg, 5)
    state = _cmaes_state_after(3, cfg)
    restored = build_searcher(cfg, initial_center("uniform", 0), POP, 0)
    with monkeypatch.context() as patch:
        _perturb_cma_ask(patch, 1e-15)
        restored.load_state_dict(state)
    resumed, resumed_history = _run(cfg, 5, start=restored, until=3)
    assert all(torch.equal(a, b) for a, b in zip(ref_history[3:], resumed_history))
    assert torch.equal(resumed.center, reference.center)


def test_cmaes_refuses_a_replay_that_is_another_algorithm(monkeypatch):
    state = _cmaes_state_after(2, {"name": "cmaes", "radius": 0.01, "diagonal": False})
    restored = build_searcher({"name": "cmaes", "radius": 0.01, "diagonal": False}, initial_center("uniform", 0), POP, 0)
    _perturb_cma_ask(monkeypatch, 1e-3)
    with pytest.raises(ValueError, match="cma package's algorithm changed"):
        restored.load_state_dict(state)


def test_a_search_starts_from_its_init_read_through_its_divergence_transform():
    """The orchestrator, the pilot and the result table's `center` row all take meta.search.config.search_center."""
    from meta.search.config import param_transform_of, search_center
    from meta.searchers.base import SearcherSettings
    from meta.settings.schema import Inner, SearchSchema

    def config(divergence: dict) -> SearchSchema:
        return SearchSchema(population=4, generations=1, seed=5, es=SearcherSettings(name="pgpe"),
                            inner=Inner(entrypoint="unused", timeout_s=1.0), train={"steps": 1}, divergence=divergence)

    softplus = config({"name": "neural_mirror", "param_transform": "softplus"})
    assert param_transform_of(softplus.inner_config) == "softplus"
    assert torch.equal(search_center(softplus), initial_center("uniform", 5, "softplus"))
    # a synthetic objective: the vector as is
    assert torch.equal(search_center(config({})), initial_center("uniform", 5))


def _first_move(settings: dict, scale: float = 1.0) -> float:
    """L2 norm of the centre's move after one generation of a linear fitness (times ``scale``)."""
    searcher = build_searcher(settings, torch.zeros(380, dtype=torch.float64), 8, 0)
    w = torch.randn(380, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    values = searcher.ask(0)
    searcher.tell(0, values, scale * (values @ w), torch.ones(8, dtype=torch.bool))
    return float(searcher.center.norm())


@pytest.mark.parametrize("radius", [0.01, 0.1])
def test_pgpe_steps_in_radii_whatever_the_radius_and_the_fitness_scale(radius):
    """ClipUp's first step is its step size: es.step_radii x es.radius (default 1), so a search at ten times the
    radius moves ten times as far, and a fitness on another scale moves it as far."""
    assert _first_move({"name": "pgpe", "radius": radius}) == pytest.approx(radius)
    assert _first_move({"name": "pgpe", "radius": radius}, scale=100.0) == pytest.approx(radius)
    assert _first_move({"name": "pgpe", "radius": radius, "step_radii": 2.5}) == pytest.approx(2.5 * radius)
    # an absolute step (a search stored before step_radii) overrides it
    assert _first_move({"name": "pgpe", "radius": radius, "center_learning_rate": 0.005}) == pytest.approx(0.005)


def test_openai_es_elite_bounds_the_centre_move_per_generation_in_radii():
    """The authors' step grows with the fitness's scale; es.max_step_radii (default 2) caps its L2 norm at that many
    sigmas, and null restores the unbounded rule."""
    # the embedded default's radius (0.1) and pair differences of ~0.05 (pass@1's scale): the authors' step, unbound
    small = _first_move({"name": "openai_es_elite", "radius": 0.1}, scale=0.0125)
    assert small < 0.5 * 2 * 0.1
    assert _first_move({"name": "openai_es_elite", "radius": 0.01}, scale=1e4) == pytest.approx(2 * 0.01)
    assert _first_move({"name": "openai_es_elite", "radius": 0.01, "max_step_radii": None}, scale=1e4) > 1.0
    assert _first_move({"name": "openai_es_elite", "radius": 0.01, "max_step_radii": 0.5}, scale=1e4) == \
        pytest.approx(0.5 * 0.01)


@pytest.mark.parametrize("settings, key", [({"name": "pgpe", "radius": 0.01, "step_radii": 0}, "es.step_radii"),
                                           ({"name": "openai_es_elite", "radius": 0.01, "max_step_radii": -1},
                                            "es.max_step_radii")])
def test_a_step_in_radii_that_is_not_positive_is_refused_naming_the_key(settings, key):
    with pytest.raises(ValueError, match=key):
        build_searcher(settings, torch.zeros(380, dtype=torch.float64), 8, 0)


def _plain_searcher_class():
    """A searcher that declares no settings class (a third-party one written before them)."""
    from meta.searchers import Searcher

    class PlainSearcher(Searcher):
        name = "plain_toy"

        def __init__(self, center_init: torch.Tensor, popsize: int, seed: int, *, radius: float, jump: float = 0.5,
                     label: str | None = None, extra: dict | None = None) -> None:
            super().__init__(center_init, popsize, seed)
            self.settings = {"radius": radius, "jump": jump, "label": label, "extra": extra}
            self._center = center_init.clone()

        def ask(self, generation):
            return self._center.repeat(self.popsize, 1)

        def tell(self, generation, values, fitness, ok, late=None):
            raise NotImplementedError

        @property
        def center(self):
            return self._center

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    return PlainSearcher


def test_a_searcher_without_a_settings_class_gets_one_from_its_constructor(monkeypatch, tmp_path):
    """A plug-in searcher that declares no settings class still has a typed home for its settings: derived once from
    its constructor's keywords (type and default), registered as es/<name>_schema, which its YAML names; a typo or
    a value of the wrong type is refused naming the key."""
    import dataclasses

    import core.entry_points
    from meta.compose import compose
    from meta.search.config import ConfigError
    from meta.searchers import read_settings, settings_class_of

    plain = _plain_searcher_class()
    monkeypatch.setattr(core.entry_points, "entry_point_objects",
                        lambda registry, *_: {"plain_toy": plain} if registry == "searchers" else {})
    settings = settings_class_of(plain)
    assert settings is settings_class_of(plain)  # derived once
    assert {f.name: f.default for f in dataclasses.fields(settings)} == {
        "name": "", "radius": 0.01, "member_steps": None, "jump": 0.5, "label": None, "extra": None}
    with pytest.raises(ValueError, match=r"es\.jump must be a number"):
        read_settings({"name": "plain_toy", "jump": "far"})
    with pytest.raises(ValueError, match=r"es\.hop is not a setting of es=plain_toy; known settings: \['extra', "
                                         r"'jump', 'label', 'radius'\]"):
        read_settings({"name": "plain_toy", "hop": 1})
    (tmp_path / "es").mkdir()
    (tmp_path / "es" / "plain_toy.yaml").write_text("defaults:\n  - plain_toy_schema\n  - _self_\njump: 0.25\n")
    where = f"hydra.searchpath=[file://{tmp_path}]"
    es = compose(["es=plain_toy", where])["es"]
    assert es == {"name": "plain_toy", "radius": 0.1, "member_steps": None, "jump": 0.25, "label": None,
                  "extra": None}  # radius: the embedded default preset's
    searcher = build_searcher({k: v for k, v in es.items() if k != "member_steps"}, initial_center("uniform", 0), 2, 0)
    assert searcher.settings == {"radius": 0.1, "jump": 0.25, "label": None, "extra": None}
    with pytest.raises(ConfigError, match=r"es\.jump=far: Value 'far' of type 'str' could not be converted to Float"):
        compose(["es=plain_toy", where, "es.jump=far"])

"""Ties, failed and late members in every searcher's tell (issue 16): an all-tied generation moves nothing, tied
members are interchangeable, late members and broken antithetic pairs carry no weight."""
from __future__ import annotations

import pytest
import torch

from meta.searchers import build_searcher
from meta.searchers.utilities import tie_averaged_utilities
from meta.synthetic import objective

DIM = 380
POP = 8
NAMES = ["pgpe", "snes", "cem", "cmaes", "openai_es_elite"]


def _searcher(name: str, pop: int = POP):
    return build_searcher({"name": name, "radius": 0.01}, torch.full((DIM,), 0.005, dtype=torch.float64), pop, 0)


def _ok(pop: int = POP) -> torch.Tensor:
    return torch.ones(pop, dtype=torch.bool)


@pytest.mark.parametrize("name", NAMES)
def test_an_all_tied_generation_leaves_the_search_where_it_was(name):
    searcher = _searcher(name)
    values = searcher.ask(0)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in searcher.state_dict().items()}
    centre = searcher.center
    summary = searcher.tell(0, values, torch.full((POP,), 0.25, dtype=torch.float64), _ok())
    assert torch.equal(searcher.center, centre), f"{name} moved its centre on a generation where all members tied"
    if name in ("pgpe", "snes", "cem"):  # their whole state (stdev included) is unchanged
        after = searcher.state_dict()
        if "functional" in before:
            assert repr(after["functional"]) == repr(before["functional"])
        else:
            assert all(torch.equal(after[k], before[k]) for k in before)
    assert summary.no_information or name == "openai_es_elite"  # raw differences of tied pairs are exactly 0


@pytest.mark.parametrize("name", ["pgpe", "snes", "cem"])
def test_the_order_of_tied_members_does_not_matter(name):
    """Presenting the same population in another order, where only tied members change places, gives the same
    update (evotorch's distinct ranks would hand the tied members different weights by position)."""
    # five members tie at 0.5 across the top-4 boundary (CEM), in pairs (0,1), (4,5) and (6,7) with 0.25 partners
    fitness = torch.tensor([0.5, 0.25, 0.75, 0.5, 0.5, 0.25, 0.5, 0.25], dtype=torch.float64)
    # pgpe: swap whole pairs (0,1) <-> (6,7), both (0.5, 0.25); the others: swap tied members 0 and 6
    order = [6, 7, 2, 3, 4, 5, 0, 1] if name == "pgpe" else [6, 1, 2, 3, 4, 5, 0, 7]
    a, b = _searcher(name), _searcher(name)
    values = a.ask(0)
    b.ask(0)
    a.tell(0, values, fitness, _ok())
    b.tell(0, values[order], fitness[order], _ok())
    assert torch.allclose(a.center, b.center, rtol=0, atol=1e-12)
    assert not torch.equal(a.center, _searcher(name).center)  # it did move


def test_average_ranks_are_evotorchs_ranks_averaged_within_each_tie_group():
    fitness = torch.tensor([0.5, 0.25, 0.5, 0.75], dtype=torch.float64)
    # distinct ranks 0..3 -> centered (-0.5, -1/6, 1/6, 0.5); ranks of the two 0.5s are 1 and 2 -> both 1.5
    u = tie_averaged_utilities(fitness, "centered")
    assert u.tolist() == pytest.approx([0.0, -0.5, 0.0, 0.5])
    assert tie_averaged_utilities(fitness, "raw").tolist() == fitness.tolist()
    assert not tie_averaged_utilities(torch.full((5,), 0.3, dtype=torch.float64), "nes").any()


def test_pgpe_with_ties_moves_as_its_average_rank_utilities_say():
    """The PGPE update with ties equals evotorch's own PGPE fed the tie-averaged utilities as raw fitness."""
    from evotorch.algorithms.functional import pgpe, pgpe_tell

    searcher = _searcher("pgpe")
    values = searcher.ask(0)
    fitness = torch.tensor([0.5, 0.5, 0.25, 0.75, 0.5, 0.5, 0.25, 0.0], dtype=torch.float64)
    # ClipUp's step at its default: es.step_radii 1 x es.radius 0.01
    reference = pgpe(center_init=torch.full((DIM,), 0.005, dtype=torch.float64), center_learning_rate=0.01,
                     stdev_learning_rate=0.1, objective_sense="max", ranking_method="raw", optimizer="clipup",
                     optimizer_config={}, stdev_init=0.01, stdev_max_change=0.2, symmetric=True)
    want = pgpe_tell(reference, values, tie_averaged_utilities(fitness, "centered"))
    searcher.tell(0, values, fitness, _ok())
    assert torch.allclose(searcher.center, want.optimizer_state.center)
    # ... and differs from evotorch's distinct-rank "centered" ranking, which orders the tied by position
    distinct = pgpe_tell(reference._replace(ranking_method="centered"), values, fitness)
    assert not torch.allclose(searcher.center, distinct.optimizer_state.center)


@pytest.mark.parametrize("name", ["pgpe", "openai_es_elite"])
def test_pair_based_searchers_drop_a_pair_with_a_late_or_failed_half(name):
    searcher = _searcher(name)
    values = searcher.ask(0)
    fitness = torch.tensor([objective(v.tolist()) for v in values], dtype=torch.float64)
    late = torch.zeros(POP, dtype=torch.bool)
    ok = _ok()
    pairs = ([(0, 1), (2, 3)] if name == "pgpe" else [(0, 4), (1, 5)])  # pgpe interleaves, openai_es blocks
    late[pairs[0][1]] = True
    ok[pairs[1][0]] = False
    summary = searcher.tell(0, values, fitness, ok, late)
    assert summary.dropped_pairs == 2
    # The dropped members' fitness does not matter at all: change it, get the same update.
    other = _searcher(name)
    assert torch.equal(other.ask(0), values)
    changed = fitness.clone()
    for i, j in pairs:
        changed[i], changed[j] = 123.0, -7.0
    other.tell(0, values, changed, ok, late)
    assert torch.equal(searcher.center, other.center)


@pytest.mark.parametrize("name", ["snes", "cem", "cmaes"])
def test_late_members_are_left_out_and_failed_ones_rank_at_the_bottom(name):
    searcher, other = _searcher(name), _searcher(name)
    values = searcher.ask(0)
    assert torch.equal(values, other.ask(0))
    fitness = torch.tensor([objective(v.tolist()) for v in values], dtype=torch.float64)
    late = torch.zeros(POP, dtype=torch.bool)
    late[3] = True
    searcher.tell(0, values, fitness, _ok(), late)
    changed = fitness.clone()
    changed[3] = 99.0  # a late member's placeholder is never read
    other.tell(0, values, changed, _ok(), late)
    assert torch.equal(searcher.center, other.center)
    no_late = _searcher(name)
    no_late.ask(0)
    no_late.tell(0, values, changed, _ok())
    assert not torch.equal(no_late.center, searcher.center)


def test_cmaes_resumes_exactly_across_untold_and_partly_told_generations():
    searcher = _searcher("cmaes")
    ok = _ok()
    late = torch.zeros(POP, dtype=torch.bool)
    late[2] = True
    searcher.tell(0, searcher.ask(0), torch.full((POP,), 0.5, dtype=torch.float64), ok)  # all tied: not told
    values = searcher.ask(1)
    searcher.tell(1, values, torch.tensor([objective(v.tolist()) for v in values], dtype=torch.float64), ok, late)
    resumed = _searcher("cmaes")
    resumed.load_state_dict(searcher.state_dict())
    assert torch.equal(resumed.center, searcher.center)
    assert torch.equal(resumed.ask(2), searcher.ask(2))


def test_openai_es_step_after_a_rejected_generation_is_on_the_scale_of_a_normal_step():
    """The reported case: population 180, one rejected generation keeps 44 elites; the next accepted step came out
    0.506 (0.499 of it from the elites) against ~0.04 for a normal step. Elites are out of the gradient now."""
    pop = 180
    searcher = _searcher("openai_es_elite", pop)
    ok = _ok(pop)

    def fitness(values, shift=0.0):
        return torch.tensor([objective(v.tolist()) + shift for v in values], dtype=torch.float64)

    start = searcher.center
    values = searcher.ask(0)
    searcher.tell(0, values, fitness(values), ok)
    normal = float((searcher.center - start).norm())
    values = searcher.ask(1)
    searcher.tell(1, values, fitness(values, -0.5), ok)  # worse mean: rejected, elites kept
    assert searcher.accepted == [True, False]
    values = searcher.ask(2)
    assert searcher._num_elites() == 44
    before = searcher.center
    searcher.tell(2, values, fitness(values, 0.3), ok)  # the level shift must not leak into the step
    step = float((searcher.center - before).norm())
    assert searcher.accepted[-1]
    assert 0.5 * normal < step < 2.0 * normal, (step, normal)

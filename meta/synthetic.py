"""A synthetic objective over the 380-vector that stands in for NM-GRPO training in tests and benchmarks.

Used through ``inner.entrypoint=meta.synthetic:program`` (a MemberProgram; ``meta.synthetic:member``, its older name,
loads the same program); its behaviour is steered by ``inner.options``:
  target (0.02), width (0.01): fitness = exp(-mean((x - target)^2) / (2 width^2)), in (0, 1], max at x = target,
      so 0 (the default fitness_on_failure) is the worst value, as for pass@1;
  sleep_s: sleep before answering (benchmark members);
  fail / nan_fitness / hang: lists of member indices (or "generation:index") that raise, return NaN, or sleep forever;
  fail_attempts: those injected failures only happen on attempts below this number (tests retries);
  count_calls: append a line to <work_dir>/calls.log per call (tests that no member runs twice);
  steps, step_s: "train" for `steps` steps of `step_s` seconds, checkpointing the step counter in
      <work_dir>/synthetic_ckpt.json after each step and resuming from it (tests requeue and preemption);
  env_log: write the SLURM_*/SBATCH_* variables the member sees to <work_dir>/env.json;
  noise: standard deviation of a Gaussian seed noise added to the fitness, drawn from the member's seed (a
      training run's seed-to-seed spread: same seed and params, same fitness);
  slope, base (0.5): a linear objective instead, fitness = base + slope * w.(x - target) with w a fixed unit vector
      (drawn from a fixed seed): the fitness difference of c + e and c - e is 2 slope w.e, a known signal (meta.pilot);
  short_steps, short_slope: a horizon-dependent linear objective: a member whose train.steps is at most short_steps
      scores slope short_slope instead of slope (short_slope -slope: a short run ranks maps in the opposite order of a
      long one, the short-horizon bias; equal: the two horizons agree; meta.pilot's horizon check);
  radial: adds radial * sqrt(mean((x - target)^2)) to the linear objective (slope 0 when only radial is given): a
      gain with the perturbation's size whatever its direction, c + e and c - e alike (meta.pilot's scale effect);
  param_noise: standard deviation of a second Gaussian noise, drawn from (seed, params): two inits trained on the
      same seed share the `noise` part and differ by this one (paired but not identical, as real training runs);
  val_size (1): the validation size the record reports;
  baseline_fitness: {divergence name or "base": fitness} of a run without a map (a result-table baseline), default 0;
  evaluation_shift: {evaluation name: shift}: each inner ``extra_evaluations`` entry is recorded as the fitness
      plus its shift (default 0), as the test split and transfer tasks of a reporting run;
  intermediate_noise: with train.eval_every set, write <work_dir>/intermediate.jsonl at every eval_every-th step
      below train.steps, each score the final fitness plus this much Gaussian noise drawn from (seed, params, step),
      written at step/steps of the member's running time (time_median_s), so it can be stopped early meanwhile;
  time_median_s, time_sigma (0.5), slow_fraction (0), slow_factor (5), time_tracks_fitness (0): a member's running
      time, log-normal around the median, a slow_fraction of members slow_factor times longer (a slow node, a
      requeue), and x exp(time_tracks_fitness x (fitness - 0.5)) so time can track fitness (GRPO: long completions
      take longer); drawn from (generation, index, attempt) alone, so two searches see the same times
      (bench/bench_stragglers.py).
  unrolled: {problem (rate_floor), ...its settings}: an unrolled inner problem of meta/unrolled.py's family instead
      (rate_floor: SGD on a noisy quadratic with a known short-horizon bias, {floor (0.5), scale (30)}; opposed;
      plateau, measured as pass@1 on 90 problems; many): a run of train.steps steps from the problem's initial state
      under the member's vector, scored as the problem measures it (unrolled_optimum gives rate_floor's optima).
  es=nres truncations (spec.truncation, results/store/truncation.py): a member continues its particle's run from
      its boundary checkpoint (the loss there) for steps [start, stop) with its own vector and reports the change of
      the score over them; step_s sleeps per step, checkpointing the loss in <work_dir>/synthetic_ckpt.json so a
      requeue resumes mid-truncation (diagnostic resumed_at: the step its last start continued from); an ``unrolled``
      problem's state is carried and measured at each boundary (the same measurement for the truncation that ends
      there and the one that starts there). Objectives other than ``unrolled`` score a run at step t as fitness x
      t/horizon.
Deliberately free of torch so that hundreds of member processes start quickly.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import struct
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from meta.unrolled import RateFloor, UnrolledProblem, problem_from_options, sigmoid, unit_direction
from results.store.atomic import atomic_write_json
from results.store.member_files import append_intermediate
from core.member_program import MemberProgram, named_by
from core.records import MemberSpec
from results.store.truncation import (END_SCORE, START_SCORE, START_STEP, STOP_STEP, Truncation, publish_boundary,
                                      read_boundary)

#: the seed of the slope option's direction w: one fixed direction for every member and run
SLOPE_DIRECTION_SEED = "synthetic-slope-direction"  # meta/unrolled.py's DIRECTION_SEED: rate_floor's direction


def objective(params: Sequence[float], target: float = 0.02, width: float = 0.01) -> float:
    """The known optimum is the constant vector ``target``; higher is better."""
    if not params:
        raise ValueError("synthetic objective needs a non-empty parameter vector")
    mse = sum((float(x) - target) ** 2 for x in params) / len(params)
    return math.exp(-mse / (2.0 * width * width))


def slope_direction(dim: int) -> tuple[float, ...]:
    """The fixed unit vector w of the ``slope`` option (the same for every member of every run; rate_floor's
    direction in meta/unrolled.py)."""
    return unit_direction(dim, SLOPE_DIRECTION_SEED)


def linear_objective(params: Sequence[float], slope: float, base: float = 0.5, target: float = 0.02,
                     radial: float = 0.0) -> float:
    """base + slope * w.(x - target) + radial * rms(x - target): a straight ramp along w, so antithetic differences
    are known exactly, plus (``radial``) a gain with the distance from ``target`` that every direction shares."""
    w = slope_direction(len(params))
    ramp = base + slope * sum(wi * (float(x) - target) for wi, x in zip(w, params))
    if not radial:
        return ramp
    return ramp + radial * math.sqrt(sum((float(x) - target) ** 2 for x in params) / len(params))


def unrolled_rate(params: Sequence[float], scale: float = 30.0, target: float = 0.02) -> float:
    """rate_floor's rate r in (0, 1) that the vector sets: sigmoid(scale * w.(x - target))."""
    return sigmoid(scale * sum(wi * (float(x) - target) for wi, x in zip(slope_direction(len(params)), params)))


def unrolled_loss(rate: float, steps: int, floor: float = 0.5, loss: float = 1.0) -> float:
    """rate_floor's loss after ``steps`` steps at a constant ``rate`` from ``loss`` (1 - its score)."""
    problem = RateFloor(floor=floor)
    for _ in range(steps):
        loss = problem.advance_loss(loss, rate)
    return loss


def unrolled_optimum(steps: int, floor: float = 0.5) -> float:
    """The logit z* = scale * w.(x - target) of the best constant rate for a run of ``steps`` steps of rate_floor."""
    problem = RateFloor(floor=floor)
    return problem.z(problem.optimum_cached(steps))


def params_digest(params: Sequence[float]) -> str:
    """A stable digest of a parameter vector (its float64 bytes): equal vectors, equal digests."""
    return hashlib.sha256(struct.pack(f"<{len(params)}d", *(float(x) for x in params))).hexdigest()[:16]


#: The longest a member waits for its ``wait_for_file`` option's file: a test that never creates it ends, not hangs.
WAIT_FOR_FILE_MAX_S = 300.0


def _selected(spec: MemberSpec, entries: Sequence[Any] | None) -> bool:
    for entry in entries or ():
        if isinstance(entry, str) and ":" in entry:
            gen, _, idx = entry.partition(":")
            if int(gen) == spec.generation and int(idx) == spec.index:
                return True
        elif int(entry) == spec.index:
            return True
    return False


class SyntheticProgram(MemberProgram):
    """The synthetic objective as a member program: nothing to validate, stage or check on the host; it keeps a
    step counter for a retry, which ``finalize`` drops."""

    def train(self, spec: MemberSpec | Mapping[str, Any], save_final: bool = False) -> dict[str, Any]:
        """A result record as a dict (see the module docstring); ``save_final``: no model to keep."""
        if not isinstance(spec, MemberSpec):
            spec = MemberSpec.from_dict(spec)
        options = dict(spec.inner.get("options") or {})
        start = time.monotonic()
        if options.get("count_calls"):
            with open(Path(spec.work_dir) / "calls.log", "a") as handle:
                handle.write(f"attempt {spec.attempt}\n")
        if options.get("env_log"):
            seen = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SBATCH_", "MIRROR_ES_"))}
            atomic_write_json(Path(spec.work_dir) / "env.json", seen)
        if options.get("sleep_s"):
            time.sleep(float(options["sleep_s"]))
        if options.get("wait_for_file") and not _selected(spec, options.get("wait_skip")):
            # A test's gate: these members stay running until the test creates the file (at most WAIT_FOR_FILE_MAX_S),
            # so it can act on live jobs however slow the machine is.
            deadline = time.monotonic() + WAIT_FOR_FILE_MAX_S
            while not Path(options["wait_for_file"]).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        if spec.truncation is not None:
            return _truncation(spec, options, start)
        steps_done = _train_steps(Path(spec.work_dir), int(options.get("steps", 0)), float(options.get("step_s", 0.0)))
        injected = spec.attempt < int(options.get("fail_attempts", 1 << 30))
        if injected and _selected(spec, options.get("fail")):
            raise RuntimeError(f"injected failure for member {spec.generation}:{spec.index}")
        if injected and _selected(spec, options.get("hang")):
            while True:
                time.sleep(0.05)
        if not spec.params:  # a result-table row without a map (KL, ProbL2, Dr. GRPO, the base model)
            fitness = _baseline_fitness(spec, options)
        elif options.get("unrolled") is not None:
            problem = problem_from_options(options["unrolled"])
            steps = spec.work.horizon  # a run of its own: its segment is the whole schedule
            state, features = problem.initial(), problem.features(spec.params)
            for t in range(steps):
                state = problem.step(state, features, t, steps)
            fitness = problem.measure(state, f"whole:{spec.seed}:{params_digest(spec.params)}")
        elif options.get("slope") is not None or options.get("radial") is not None:
            fitness = linear_objective(spec.params, _slope(spec, options), float(options.get("base", 0.5)),
                                       float(options.get("target", 0.02)), float(options.get("radial") or 0.0))
        else:
            fitness = objective(spec.params, float(options.get("target", 0.02)), float(options.get("width", 0.01)))
        running_s = member_time_s(spec, options, fitness) if options.get("time_median_s") else 0.0
        if options.get("noise"):
            fitness += float(options["noise"]) * random.Random(spec.seed).gauss(0.0, 1.0)
        if options.get("param_noise"):
            digest = params_digest(spec.params)
            fitness += float(options["param_noise"]) * random.Random(f"{spec.seed}:{digest}").gauss(0.0, 1.0)
        if options.get("intermediate_noise") is not None:
            running_s = _write_intermediate(spec, fitness, float(options["intermediate_noise"]), running_s)
        time.sleep(running_s)
        if injected and _selected(spec, options.get("nan_fitness")):
            fitness = float("nan")
        return {
            "status": "ok",
            "fitness": fitness,
            "val_size": int(options.get("val_size", 1)),
            "wall_time_s": time.monotonic() - start,
            "steps_done": steps_done or 1,
            "evaluations": _evaluations(spec, options, fitness),
        }

    def finalize(self, spec: MemberSpec | Mapping[str, Any]) -> None:
        """A settled member's step-counter checkpoint goes, as the inner loop's checkpoints do."""
        if not isinstance(spec, MemberSpec):
            spec = MemberSpec.from_dict(spec)
        (Path(spec.work_dir) / CHECKPOINT_FILE).unlink(missing_ok=True)


program = SyntheticProgram()


@named_by(program)
def member(spec: MemberSpec | Mapping[str, Any]) -> dict[str, Any]:
    """``program.train``, by the name earlier searches stored as ``inner.entrypoint`` (and tests call)."""
    return program.train(spec)


def _truncation(spec: MemberSpec, options: Mapping[str, Any], started: float) -> dict[str, Any]:
    """One truncation of a particle's run (the module docstring): the loss at ``start`` from the particle's boundary
    (1 at step 0), ``stop - start`` steps with this member's vector, the boundary at ``stop`` published, the change of
    the score reported. A boundary this generation already published is the result (a kill after it, before the
    result was written)."""
    piece = Truncation.of_spec(spec)
    assert piece is not None  # called for a member continuing a particle's run
    done = read_boundary(piece.boundary(piece.stop))
    if piece.start == 0:
        start_score = _score_at(spec, options, _initial(options), piece, 0)
    else:
        boundary = read_boundary(piece.boundary(piece.start))
        if boundary is None:
            raise RuntimeError(f"particle {piece.particle}: no checkpoint at step {piece.start} of run {piece.episode} "
                               f"in {piece.particle_dir}")
        start_score = float(boundary["score"])
    if done is not None and done.get("generation") == spec.generation:
        end_score = float(done["score"])
    else:
        work = Path(spec.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        path = work / CHECKPOINT_FILE
        initial = (_initial(options) if piece.start == 0
                   else json.loads((piece.boundary(piece.start) / CHECKPOINT_FILE).read_text()))
        state = (json.loads(path.read_text()) if path.exists()
                 else {"step": piece.start, "state": initial, "starts": []})
        state["starts"].append(state["step"])
        atomic_write_json(path, state)
        while state["step"] < piece.stop:  # one step at a time, checkpointed: a requeue resumes mid-truncation
            time.sleep(float(options.get("step_s", 0.0)))
            state["state"] = _advance(spec, options, state["state"], state["step"], piece.horizon)
            state["step"] += 1
            atomic_write_json(path, state)
        end_score = _score_at(spec, options, state["state"], piece, piece.stop)
        resumed_at = float(state["starts"][-1])  # the step its last start continued from (a requeue's: > start)
        publish_boundary(piece, end_score, spec.generation,
                         lambda folder: atomic_write_json(folder / CHECKPOINT_FILE, state["state"]))
    injected = spec.attempt < int(options.get("fail_attempts", 1 << 30))
    if injected and _selected(spec, options.get("fail")):
        raise RuntimeError(f"injected failure for member {spec.generation}:{spec.index}")
    diagnostics = {START_SCORE: start_score, END_SCORE: end_score, START_STEP: float(piece.start),
                   STOP_STEP: float(piece.stop)}
    if done is None or done.get("generation") != spec.generation:
        diagnostics["resumed_at"] = resumed_at
    return {"status": "ok", "fitness": end_score - start_score, "val_size": int(options.get("val_size", 1)),
            "wall_time_s": time.monotonic() - started, "steps_done": piece.stop - piece.start,
            "diagnostics": diagnostics}


def _advance(spec: MemberSpec, options: Mapping[str, Any], state: Any, step: int, horizon: int) -> Any:
    """One step of the ``unrolled`` problem with this member's vector (other objectives carry no state)."""
    if options.get("unrolled") is None:
        return state
    problem = problem_from_options(options["unrolled"])
    return problem.step(state, problem.features(spec.params), step, horizon)


def _initial(options: Mapping[str, Any]) -> Any:
    """A particle's state at step 0: the ``unrolled`` problem's, else a placeholder."""
    return problem_from_options(options["unrolled"]).initial() if options.get("unrolled") is not None else 1.0


def _score_at(spec: MemberSpec, options: Mapping[str, Any], state: Any, piece: Truncation, step: int) -> float:
    """A particle's validation score at ``step`` of its run: the ``unrolled`` problem's measurement (one per
    particle, run and step), else the objective x step / horizon."""
    if options.get("unrolled") is not None:
        problem: UnrolledProblem = problem_from_options(options["unrolled"])
        return problem.measure(state, f"{spec.seed}:{piece.particle}:{piece.episode}:{step}")
    return (objective(spec.params, float(options.get("target", 0.02)), float(options.get("width", 0.01)))
            * step / piece.horizon)


def _slope(spec: MemberSpec, options: Mapping[str, Any]) -> float:
    """The linear objective's slope at the member's horizon (``short_steps``, ``short_slope``)."""
    slope = float(options.get("slope") or 0.0)
    short = options.get("short_steps")
    if short is not None and spec.work.horizon <= int(short):
        return float(options.get("short_slope", slope))
    return slope


def _baseline_fitness(spec: MemberSpec, options: Mapping[str, Any]) -> float:
    """``baseline_fitness``: {divergence name or "base": fitness} for rows trained without a map (default 0)."""
    name = "base" if spec.work.steps == 0 else str((spec.inner.get("divergence") or {}).get("name"))
    return float((options.get("baseline_fitness") or {}).get(name, 0.0))


def _evaluations(spec: MemberSpec, options: Mapping[str, Any], fitness: float) -> dict[str, dict[str, Any]]:
    """The inner ``extra_evaluations`` as a training run records them: each the fitness plus
    ``evaluation_shift[name]`` (default 0), so a test can tell them apart."""
    shifts = options.get("evaluation_shift") or {}
    evaluations = {}
    for entry in spec.inner.get("extra_evaluations") or ():
        name = str(entry["name"])
        task = (entry.get("task") or spec.inner.get("task") or {}).get("name")
        evaluations[name] = {"task": task, "split": "test", "pass_at_1": fitness + float(shifts.get(name, 0.0)),
                             "size": 1, "mean_response_tokens": 1.0}
    return evaluations


def _write_intermediate(spec: MemberSpec, fitness: float, noise: float, running_s: float) -> float:
    """Intermediate scores as train.eval_every would leave them: the final fitness, blurred by ``noise``, each
    written at its step's share of the member's running time (so early_stop can stop it with the rest of its
    time unspent). Returns the running time left after the last one."""
    train = spec.inner.get("train") or {}
    every, steps = train.get("eval_every"), spec.work.horizon
    if not every or steps <= 0:
        return running_s
    digest = params_digest(spec.params)
    spent = 0.0
    for step in range(int(every), steps, int(every)):
        time.sleep(max(0.0, running_s * step / steps - spent))
        spent = max(spent, running_s * step / steps)
        blur = noise * random.Random(f"{spec.seed}:{digest}:{step}").gauss(0.0, 1.0)
        append_intermediate(spec.work_dir, step, fitness + blur, int(train.get("eval_subset") or 1))
    return running_s - spent


def member_time_s(spec: MemberSpec, options: Mapping[str, Any], fitness: float) -> float:
    """The member's synthetic running time (see the module docstring); deterministic in (generation, index)."""
    rng = random.Random(f"time:{spec.generation}:{spec.index}:{spec.attempt}")
    seconds = float(options["time_median_s"]) * math.exp(float(options.get("time_sigma", 0.5)) * rng.gauss(0.0, 1.0))
    if rng.random() < float(options.get("slow_fraction", 0.0)):
        seconds *= float(options.get("slow_factor", 5.0))
    return seconds * math.exp(float(options.get("time_tracks_fitness", 0.0)) * (fitness - 0.5))


CHECKPOINT_FILE = "synthetic_ckpt.json"




def _train_steps(work_dir: Path, steps: int, step_s: float) -> int:
    """Fake training with a resumable step counter: a restarted member continues where it stopped, and
    each start is recorded (step at start) so a test can see that the counter continued."""
    if steps <= 0:
        return 0
    path = work_dir / CHECKPOINT_FILE
    state = json.loads(path.read_text()) if path.exists() else {"step": 0, "starts": []}
    state["starts"].append(state["step"])
    atomic_write_json(path, state)
    while state["step"] < steps:
        time.sleep(step_s)
        state["step"] += 1
        atomic_write_json(path, state)
    return state["step"]

"""The generation state machine of NM-GRPO-ES.

Per generation: ask -> write population.pt -> submit (jobs.json right after) -> collect outcomes (retries,
fitness_on_failure, abort past max_failed_fraction) -> tell -> tables -> state file with checksum.
Each step's output is a file, and each step first looks for its file, so the orchestrator can be killed at
any instant and resumed: the newest valid state says which generations are done; a written population is
re-used (never re-asked); finished members are read, live jobs re-attached, and only lost ones resubmitted.
Tables are written before the state, so a crash in between only repeats idempotent table upserts.

Besides the population, a generation trains a control member (index ``population``: the unperturbed centre with
the generation's seed; recorded, never told to the searcher) and may close at its quorum (meta/search/generation/generation_close.py:
the decision is a file written before any cancellation, so a resume settles the same members as late). Who is which,
and how many each rule counts, is the config's one GenerationShape (meta/search/generation/generation_shape.py), which the
dry-run plan reads too.
"""
from __future__ import annotations

import dataclasses

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from launch.base import Launcher
from launch.factory import launcher_class, launcher_options, runner_policy
from launch.runner import ArrayProgress, MemberArrayRunner
from meta.search.config import early_stop_step, generation_shape, search_center
from meta.settings.schema import SearchSchema
from meta.search.generation.early_stop import STOPPED_STATUS, EarlyStopJudge, reported_score, update_fitness
from meta.search.generation.generation_close import QuorumClock
from meta.search.generation.generation_shape import GenerationShape
from meta.search.generation.live_watch import LiveWatch, all_same_warning, format_duration
from meta.searchers import Searcher, build_searcher
from meta.searchers.base import MemberWork
from core.seeding import member_seed
from results.store.gpu_share import read_gpu_share, share_text
from core.records import (MEMBER_SEEDS_KEY, NODE_FAILED, UNMEASURED_STATUSES, MemberSpec, ResultRecord, Segment,
                          device_text)
from results.store.member_files import read_result
from results.store.run_store import RunStore
from results.report.search.online import AVERAGED_CENTER, SearchMeasure, measure_of
from results.report.search.run_ends import diagnostic_column
from results.store.truncation import NEXT_SEGMENTS_KEY, SEGMENTS_KEY, Truncation, prune_boundaries, work_entry

logger = logging.getLogger(__name__)

STATE_FORMAT = 1


@dataclass
class RunSummary:
    generations_done: int
    best: dict[str, Any] | None
    center: torch.Tensor


class Orchestrator:
    """Runs generations [next unfinished, cfg.generations) of one run directory."""

    def __init__(self, cfg: SearchSchema, store: RunStore, launcher: Launcher, run_id: str) -> None:
        self.cfg = cfg
        self.store = store
        self.launcher = launcher
        self.run_id = run_id
        self.policy = runner_policy(cfg.retries, cfg.search_timeout_s, cfg.launcher_node)  # search members' own
        self.shape: GenerationShape = generation_shape(cfg)
        self.searcher: Searcher = build_searcher(cfg.searcher_settings, search_center(cfg), self.shape.population,
                                                 cfg.seed)
        self.best: dict[str, Any] | None = None
        self.next_generation = 0
        self._durations: list[float] = []
        self._early_scores: dict[tuple[int, int], float] = {}  # (generation, member) -> score at the decision step
        divergence = cfg.inner_config.get("divergence") or {}
        slots = launcher_class(cfg.launcher_node).parallel_slots(launcher_options(cfg.launcher_node))
        self._live = LiveWatch(self.shape, grad_share_floor=divergence.get("grad_share_floor"),
                               parallel_slots=slots)
        self._restore()

    def _restore(self) -> None:
        latest = self.store.latest_state()
        if latest is None:
            return
        generation, state = latest
        self.searcher.load_state_dict(state["searcher"])
        self.best = state.get("best")
        self.next_generation = generation + 1
        logger.info("resuming after generation %d (state %s)", generation, self.store.state_path(generation))
        self._log_tensorboard()  # a crash between a state and its event file: that generation's points come now

    # ------------------------------------------------------------------ run
    def run(self) -> RunSummary:
        for generation in range(self.next_generation, self.cfg.generations):
            self.run_generation(generation)
        return RunSummary(self.next_generation, self.best, self.searcher.center)

    def run_generation(self, generation: int) -> None:
        started = time.monotonic()
        center = self.searcher.center  # the centre this generation's population is sampled around
        values = self._population(generation)
        specs = self._specs(generation, values, center)
        clock = QuorumClock(self.shape, self.cfg.straggler_grace)
        self._prune_particles(generation)
        closed = self.store.read_closed(generation)
        decided = _late_records(closed) if closed else {}
        if closed:
            logger.info("generation %d closed at its quorum before the restart: %d member(s) stay late",
                        generation, len(decided))
        judge = self._early_stop_judge(generation)
        if judge is not None:
            decided.update(self._stopped_records(judge))
        runner = MemberArrayRunner(
            launcher=self.launcher,
            entrypoint=self.cfg.inner.entrypoint,
            specs=specs,
            jobs=self.store.read_jobs(generation),
            save_jobs=lambda jobs: self.store.write_jobs(generation, jobs),
            launcher_folder=self.store.launcher_dir(generation),
            policy=self._policy(specs),
            on_final=self._log_member,
            should_abort=lambda final: self._abort_message(generation, final),
            on_tick=lambda active: self._tick(generation, active, clock, closed is not None, judge),
            decided=decided,
        )
        records = runner.run()
        self._finalize_members(specs)
        members = self.shape.members
        ok = torch.tensor([records[i].ok for i in members], dtype=torch.bool)
        # no measurement of the init: closed as late, or no node could run it (never charged fitness_on_failure)
        late = torch.tensor([records[i].status in UNMEASURED_STATUSES for i in members], dtype=torch.bool)
        stopped = torch.tensor([records[i].status == STOPPED_STATUS for i in members], dtype=torch.bool)
        # stopped members: tied below every other member, the bottom ranks their final fitness would have had
        fitness = torch.tensor(update_fitness(
            [records[i].fitness if records[i].ok else self.cfg.fitness_on_failure for i in members],
            stopped.tolist()), dtype=torch.float64)
        # a stopped member is no failure: it is measured (at the bottom), so the searcher's note counts it as ok
        summary = self.searcher.tell(generation, values, fitness, ok | stopped, late)
        if summary is not None and getattr(summary, "note", ""):
            logger.info("generation %d update: %s", generation, summary.note)
        measure = measure_of(specs[0])  # what its fitness measures: a whole run's score or a truncation's change
        gen_best = self._update_best(generation, specs[:self.shape.population], records, measure)
        same = all_same_warning(generation, [records[i].fitness for i in members if records[i].ok])
        if same:
            logger.warning("%s", same)
        self._write_tables(generation, specs, records, measure, fitness, ok, late, time.monotonic() - started)
        averaged = self.searcher.averaged_center  # nominated beside the centre (meta/search/after/reevaluate.py)
        self.store.write_state(
            generation,
            {
                "format": STATE_FORMAT,
                "generation": generation,
                "run_id": self.run_id,
                "es": self.cfg.es.name,
                "searcher": self.searcher.state_dict(),
                "center": self.searcher.center,
                **({AVERAGED_CENTER: averaged.clone()} if averaged is not None else {}),
                "best": self.best,
                "mean_fitness": _measured_mean(fitness, late | stopped),
                # what each job trained, and what the next generation's will (meta.status reads them)
                SEGMENTS_KEY: [work_entry(spec.work, spec.truncation) for spec in specs],
                NEXT_SEGMENTS_KEY: [work_entry(w.segment(), _run_of(w))
                                    for w in self.shape.member_work(self.searcher, self.cfg.member_steps)],
            },
        )
        self.next_generation = generation + 1
        self._prune_particles(None)
        self._log_tensorboard()
        self._log_generation(generation, measure, fitness, ok, late, stopped, gen_best, time.monotonic() - started)

    # -------------------------------------------------------------- pieces
    def _policy(self, specs: list[MemberSpec]) -> Any:
        """The runner's policy for this generation: its members are limited to this generation's longest segment
        (a staggered online search's first generation reaches far into the run, later ones train one piece each)."""
        longest = max(spec.work.steps for spec in specs)
        return dataclasses.replace(self.policy, timeout_s=self.cfg.member_timeout_s(longest))

    def _finalize_members(self, specs: list[MemberSpec]) -> None:
        """Every member of the generation is settled for good: the member program's ``finalize(spec)`` for each
        (the inner loop's deletes the checkpoints a failed member kept for a retry that will not come). A failure
        here is logged: the search's results do not depend on it."""
        from launch.member import load_program

        program = load_program(self.cfg.inner.entrypoint)
        for spec in specs:
            try:
                program.finalize(spec)
            except Exception as exc:  # housekeeping must never stop a search
                logger.warning("gen %d member %03d: finalize failed: %s", spec.generation, spec.index, exc)

    def _prune_particles(self, generation: int | None) -> None:
        """es=nres: each particle keeps only the checkpoint it stands on (after a state is written: ``None``), and,
        while ``generation`` runs, the ones that generation's members wrote. Idempotent, so a kill between a state
        and its pruning is mended at the next start; a failure is logged, never fatal."""
        kept = self.searcher.kept_boundaries()
        if kept is None:
            return
        for index, (episode, step) in enumerate(kept):
            def keep(e: int, s: int, record: Mapping[str, Any] | None) -> bool:
                written_now = generation is not None and record is not None and record.get("generation") == generation
                return (e, s) == (episode, step) or written_now
            try:
                prune_boundaries(self.store.particle_dir(index), keep)
            except OSError as exc:
                logger.warning("particle %03d: could not delete its old checkpoints: %s", index, exc)

    def _population(self, generation: int) -> torch.Tensor:
        values = self.store.read_population(generation)
        if values is not None:
            logger.info("generation %d: re-using the population written before the restart", generation)
            return values.to(torch.float64)
        values = self.searcher.ask(generation)
        self.store.write_population(generation, values)
        return values

    def _log_tensorboard(self) -> None:
        """Per-generation scalars under run_dir/tensorboard (results/report/search/tensorboard.py); never stops a search."""
        from results.report.search.tensorboard import log_missing

        try:
            log_missing(self.store)
        except Exception as exc:  # an observer's failure must not cost a generation
            logger.warning("could not write the TensorBoard scalars: %s", exc)

    def _early_stop_judge(self, generation: int) -> EarlyStopJudge | None:
        """early_stop's judge for this generation, with the decisions a previous process wrote (None: off)."""
        step = early_stop_step(self.cfg)
        if step is None:
            return None
        judge = EarlyStopJudge(self.cfg.early_stop, step, self.shape)
        previous = self.store.read_early_stop(generation)
        if previous:
            judge.load(previous)
            logger.info("generation %d: %d early decision(s) from before the restart, %d stopped", generation,
                        len(judge.decisions), len(judge.stopped()))
        return judge

    def _stopped_records(self, judge: EarlyStopJudge) -> dict[int, ResultRecord]:
        """The records of the members ``judge`` stopped: their early score and the share of training not run."""
        steps = self.cfg.member_steps
        records = {}
        for index in judge.stopped():
            decision = judge.decisions[index]
            records[index] = ResultRecord(
                status=STOPPED_STATUS,
                error=(f"stopped early at step {judge.step}: score {decision.score:.4f} below the median "
                       f"{decision.median:.4f} of {decision.reported} reported by more than "
                       f"{judge.config.margin:g} x noise {judge.config.noise:g}"),
                diagnostics={"early_score": decision.score, "early_step": float(judge.step),
                             "early_median": decision.median, "training_not_run": 1.0 - judge.step / steps},
            )
        return records

    def _early_stop_tick(self, generation: int, runner: MemberArrayRunner, judge: EarlyStopJudge) -> None:
        """Decide the members that reported at the decision step; write the decisions, then stop the losers."""
        open_members = {i for i in runner.specs if self.shape.is_member(i) and i not in runner.final
                        and i not in judge.decisions}
        if not open_members:
            return
        scores = {}
        for index in self.shape.members:
            # decided members carry their score in the judge; a member never submitted has reported nothing
            if index in judge.decisions or not (index in runner.in_flight or index in runner.final):
                continue
            score = self._early_scores.get((generation, index))
            if score is None:
                score = reported_score(runner.specs[index].work_dir, judge.step, self.cfg.seeds_per_member)
                if score is None:
                    continue
                self._early_scores[(generation, index)] = score
            scores[index] = score
        # A member whose result is already on disk finished: the next poll reads it, it is not stopped.
        finished = {i for i in open_members if i in scores and read_result(runner.specs[i].work_dir) is not None}
        new = judge.decide(scores, open_members - finished)
        if not new:
            return
        self.store.write_early_stop(generation, judge.to_dict())
        stop = [d.index for d in new if d.stop]
        if not stop:
            return
        logger.info("generation %d: stopping %d member(s) early at step %d (median %.4f of %d reported): %s",
                    generation, len(stop), judge.step, new[0].median, new[0].reported,
                    ", ".join(f"{i:03d} ({judge.decisions[i].score:.4f})" for i in stop))
        records = self._stopped_records(judge)
        runner.stop_members(stop, STOPPED_STATUS, "stopped early", records=records)

    def _tick(self, generation: int, runner: MemberArrayRunner, clock: QuorumClock, closed_before: bool,
              judge: EarlyStopJudge | None = None) -> None:
        """Once per polling round: the progress line and live warnings (rate-limited), early_stop's decisions,
        then close the generation at its quorum when the straggler grace is over."""
        self._live.tick(generation, runner)
        if judge is not None:
            self._early_stop_tick(generation, runner, judge)
        if closed_before or not clock.enabled():
            return
        pending = [i for i in runner.specs if i not in runner.final]
        late = clock.late_members(runner.final, pending)
        # A member whose result is already on disk finished in time: the next poll reads it, it is not late.
        late = [i for i in late if read_result(runner.specs[i].work_dir) is None]
        if not late:
            return
        reason = (f"generation closed at its quorum ({clock.needed} of {self.shape.population} members final, then "
                  f"straggler_grace={clock.grace:g} x their median time); cancelled before finishing")
        self.store.write_closed(generation, {
            "generation": generation, "late": late, "quorum": self.shape.quorum, "straggler_grace": clock.grace,
            "final_at_close": len(runner.final), "reason": reason,
        })
        logger.warning("generation %d: closing at the quorum; %d member(s) late: %s", generation, len(late),
                       ", ".join(f"{i:03d}" for i in late))
        runner.stop_members(late, "late", reason)

    def _specs(self, generation: int, values: torch.Tensor, center: torch.Tensor) -> list[MemberSpec]:
        """The population's members, then (the shape's control member) the centre itself as member ``population``,
        each with the segment the generation's shape and the searcher give it."""
        inner = self.cfg.search_member_inner()  # es.member_steps, not train.steps
        rows = [values[index] for index in self.shape.members]
        if self.shape.control:
            rows.append(center.to(torch.float64))
        specs = []
        for index, (row, work) in enumerate(zip(rows, self.shape.member_work(self.searcher, self.cfg.member_steps))):
            # Common random numbers: all members of a generation train with the same seed(s), so fitness
            # differences come from the mirror maps rather than from sampling noise.
            keys = ("member", generation) if self.cfg.common_random_numbers else ("member", generation, index)
            keys = work.seed_key or keys
            seeds = [member_seed(self.cfg.seed, *keys)]
            seeds += [member_seed(self.cfg.seed, *keys, "seed", k) for k in range(1, self.cfg.seeds_per_member)]
            segment, run = self._segment(index, work)
            specs.append(
                MemberSpec(
                    run_id=self.run_id,
                    generation=generation,
                    index=index,
                    seed=seeds[0],
                    params=row.tolist(),
                    work_dir=str(self.store.member_dir(generation, index)),
                    inner={**inner, MEMBER_SEEDS_KEY: seeds} if len(seeds) > 1 else inner,
                    truncation=run,
                    segment=segment,
                )
            )
        return specs

    def _segment(self, index: int, work: MemberWork) -> tuple[Segment, dict[str, Any] | None]:
        """The member's segment and, for a member continuing a particle's run, the run it continues (its folder of
        boundary checkpoints: results/store/truncation.py), from which it resumes at its start."""
        run = _run_of(work)
        if run is None:
            return work.segment(), None
        run["particle_dir"] = str(self.store.particle_dir(index))
        return work.segment(Truncation.of(run, work.segment()).resume_from), run

    def _abort_message(self, generation: int, final: Mapping[int, ResultRecord]) -> str | None:
        # Population members only (the control member is information, not the search); late is not a failure.
        failed = [i for i, r in final.items()
                  if not r.ok and r.status not in ("late", STOPPED_STATUS) and self.shape.is_member(i)]
        if len(failed) <= self.cfg.max_failed_fraction * self.shape.population:
            return None
        last = final[failed[-1]]
        return (
            f"generation {generation}: {len(failed)} of {self.shape.population} members failed, more than "
            f"max_failed_fraction={self.cfg.max_failed_fraction}; last failure (member {failed[-1]}, "
            f"{last.status}): {last.error.strip()[-500:]}\nFix the cause, then resume with "
            f"`python -m meta.run run_dir={self.store.root}` (raising retries= or max_failed_fraction= is allowed)"
        )

    def _update_best(self, generation: int, specs: list[MemberSpec], records: Mapping[int, ResultRecord],
                     measure: SearchMeasure) -> dict | None:
        """The generation's best member, and the search's best so far (best_member.json) when it beats it: by
        fitness, or for an online searcher by the end score of a particle whose run ended at its horizon in this
        generation (a real full-run pass@1; a truncation's change is no score: a generation where no run ended has
        no best)."""
        scores = {index: score for index, spec in enumerate(specs) if records[index].ok
                  and (score := measure.score(spec, records[index])) is not None}
        if not scores:
            return None
        index = max(scores, key=lambda i: (scores[i], -i))
        gen_best = {
            "run_id": self.run_id,
            "generation": generation,
            "index": index,
            "fitness": scores[index],
            "params": list(specs[index].params),
        }
        gen_best.update(measure.best_fields(specs[index]))
        if self.best is None or gen_best["fitness"] > self.best["fitness"]:
            self.best = gen_best
            self.store.write_best(gen_best)
        return gen_best

    def _write_tables(
        self, generation: int, specs: list[MemberSpec], records: Mapping[int, ResultRecord], measure: SearchMeasure,
        fitness: torch.Tensor, ok: torch.Tensor, late: torch.Tensor, wall: float,
    ) -> None:
        shape = self.shape
        saved = _seconds_saved(records, shape)
        control = records.get(shape.control_index) if shape.control else None
        rows = []
        for index, record in records.items():
            is_member = shape.is_member(index)
            row = {
                "generation": generation,
                "index": index,
                "role": shape.role(index),
                "status": record.status,
                "fitness": record.fitness,
                # what the searcher was told; None for the control member and late or node-failed members (no
                # measurement)
                "fitness_used": float(fitness[index]) if is_member and record.status not in UNMEASURED_STATUSES
                else None,
                "fitness_vs_control": record.fitness - control.fitness if record.ok and control and control.ok else None,
                "val_size": record.val_size,
                "mean_response_tokens": record.mean_response_tokens,
                "wall_time_s": record.wall_time_s,
                "steps_done": record.steps_done,
                "disk_peak_bytes": record.disk_peak_bytes,
                "error": record.error[-500:],
                # early_stop: the member's training time not run (an estimate; None for members not stopped)
                "seconds_saved": saved.get(index),
                # how it generated (inner_loop/generation/backends.py): a search mixing backends mixes noise levels
                "generation_backend": record.generation.get("backend"),
                # HF generate's KV cache (train.decode_cache; None with other backends): mixed caches, mixed numerics
                "decode_cache": record.generation.get("decode_cache"),
                # where it trained (inner_loop/member/device.py): a GPU's name and memory, or the CPU's; and its peak GPU use
                "device": device_text(record.device),
                "peak_gpu_memory_bytes": record.device.get("peak_memory_bytes"),
                # the task and GPU it shared with other members (resources.members_per_gpu >= 2; "" alone): its time,
                # memory and an out-of-memory failure depend on them
                "gpu_share": share_text(read_gpu_share(self.store.member_dir(generation, index))),
            }
            row.update({diagnostic_column(k): v for k, v in record.diagnostics.items()})
            row.update(measure.row_fields(specs[index]))  # an online member: the particle run it belongs to
            rows.append(row)
        self.store.upsert_members(rows)
        ok_fitness = fitness[ok]
        stopped = torch.tensor([records[i].status == STOPPED_STATUS for i in shape.members], dtype=torch.bool)
        # the mean over members with a measurement of their own (not late, not stopped early)
        self.store.upsert_generation(
            {
                "generation": generation,
                "done": int(ok.sum()),
                "failed": int((~ok & ~late & ~stopped).sum()),
                "late": sum(1 for i in shape.members if records[i].status == "late"),
                "node_failed": sum(1 for i in shape.members if records[i].status == NODE_FAILED),
                "stopped_early": int(stopped.sum()),
                "member_seconds_saved": sum(saved.values()),
                "best_fitness": float(ok_fitness.max()) if len(ok_fitness) else float("nan"),
                "mean_fitness": _measured_mean(fitness, late | stopped),
                "control_fitness": control.fitness if control is not None and control.ok else float("nan"),
                "center_norm": float(self.searcher.center.norm()),
                "wall_time_s": wall,
            }
        )

    # ------------------------------------------------------------- progress
    def _log_member(self, spec: MemberSpec, record: ResultRecord, progress: ArrayProgress) -> None:
        if record.ok:
            detail = f"fitness {record.fitness:.4f}"
        else:
            lines = record.error.strip().splitlines()
            detail = lines[-1][:160] if lines else ""
        logger.info(
            "gen %d member %03d %s %s (%.1f s) | done %d/%d, failed %d, in flight %d",
            spec.generation, spec.index, record.status, detail, record.wall_time_s,
            progress.done, progress.total, progress.failed, progress.in_flight,
        )

    def _log_generation(
        self, generation: int, measure: SearchMeasure, fitness: torch.Tensor, ok: torch.Tensor, late: torch.Tensor,
        stopped: torch.Tensor, gen_best: dict | None, wall: float,
    ) -> None:
        self._durations.append(wall)
        remaining = self.cfg.generations - generation - 1
        eta = remaining * sum(self._durations) / len(self._durations)
        best = f"{gen_best['fitness']:.4f} (member {gen_best['index']:03d})" if gen_best else "n/a"
        early = f", stopped early {int(stopped.sum())}" if bool(stopped.any()) else ""
        logger.info(
            "generation %d/%d: done %d, failed %d, late %d%s | %s %s, mean %s %.4f | %.1f s, ETA %s",
            generation + 1, self.cfg.generations, int(ok.sum()), int((~ok & ~late & ~stopped).sum()), int(late.sum()),
            early, measure.best_word, best, measure.mean_word,
            _measured_mean(fitness, late | stopped), wall, format_duration(eta),
        )


def _run_of(work: MemberWork) -> dict[str, Any] | None:
    """The particle run a member's work continues, as the state keeps it (its folder is the store's)."""
    return None if work.run is None else {"particle": work.run[0], "episode": work.run[1]}



def _seconds_saved(records: Mapping[int, ResultRecord], shape: GenerationShape) -> dict[int, float]:
    """Training time early_stop saved, per stopped member: the share of training it did not run times the median
    wall time of the population's full (ok) runs; an estimate, since a member's time varies with its completions."""
    walls = [r.wall_time_s for i, r in records.items() if shape.is_member(i) and r.ok and r.wall_time_s > 0]
    median = statistics.median(walls) if walls else 0.0
    return {i: median * r.diagnostics.get("training_not_run", 0.0)
            for i, r in records.items() if shape.is_member(i) and r.status == STOPPED_STATUS}


def _measured_mean(fitness: torch.Tensor, late: torch.Tensor) -> float:
    """Mean over members with a measurement (failures at fitness_on_failure; late members have none)."""
    measured = fitness[~late]
    return float(measured.mean()) if len(measured) else float("nan")


def _late_records(closed: Mapping[str, Any]) -> dict[int, ResultRecord]:
    """The late members a generation's closed.json names, as the records they were settled with."""
    reason = str(closed.get("reason") or "generation closed at its quorum")
    return {int(i): ResultRecord(status="late", error=reason) for i in closed.get("late", [])}

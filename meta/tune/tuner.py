"""The tuning loop: ask trials, run them as members, feed intermediate scores to the pruner, tell the outcomes.

One MemberArrayRunner runs every trial's runs (same launchers, result records, retries, re-attach as ES members);
the tuner fills it up to ``tune.parallel`` trials from ``on_final`` (a trial ended) and prunes from ``on_tick``.

The Optuna storage is the truth about trials, the trial files the truth about their runs, so a tuner killed
anywhere resumes from them (``recover``):
- RUNNING in the study with a trial.json: its runs are re-attached (a live job), read (a finished one) or
  resubmitted (a lost one), and the trial is told once they are final;
- RUNNING without a trial.json (killed between ask and the file): FAIL with user attr ``lost``, not counted toward
  ``tune.trials``, and replaced by a trial in the same slot (the same sampler seed, so the same params where the
  sampler's draws do not depend on finished trials, e.g. random);
- PRUNED with runs still going (killed between the tell and the cancel): those runs are cancelled and recorded
  ``pruned``. Every decision is told to the study before it is acted on, so no trial is told twice.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna
from optuna.trial import TrialState

from launch.base import Launcher
from launch.factory import runner_policy
from launch.runner import MemberArrayRunner
from meta.search.config import ConfigError
from core.seeding import derive_seed
from meta.settings.schema import TuneSchema
from meta.tune.config import build_sampler, study_space
from meta.tune.space import suggest, trial_overrides
from meta.tune.trials import TrialPlan, member_indices, objective, plan_trial, read_trial, trials_dir, write_trial
from results.store.atomic import CorruptFileError
from results.store.member_files import read_intermediate, read_progress, read_result
from results.store.layout import JOBS_FILE, LAUNCHER_DIR
from core.records import MemberSpec, ResultRecord
from results.store.run_store import read_jobs_file, write_jobs_file
from results.store.study_store import (ERROR_ATTR, LOST_ATTR, PRUNED_STEP_ATTR, RUN_VALUES_ATTR, SAVED_ATTR,
                                       SLOT_ATTR, best_complete_trial, state_counts)

logger = logging.getLogger(__name__)

#: seconds between reads of the running trials' intermediate scores
SCAN_INTERVAL_S = 2.0
#: stop (exit 1, resumable) when this many trials ended in this tuner's run and every one of them failed: a cause
#: shared by all trials (a data path, a driver, out of memory at every setting) would otherwise fail every trial of
#: the study. Counted per tuner process, so the resume after the fix goes on.
ABORT_AFTER_FAILED = 3


@dataclass
class ActiveTrial:
    plan: TrialPlan
    trial: optuna.Trial
    reported: int = -1  # the last step reported to the study

    @property
    def indices(self) -> list[int]:
        return [s.index for s in self.plan.specs]


@dataclass
class TuneSummary:
    counts: dict[str, int] = field(default_factory=dict)
    best_number: int | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    saved_member_s: float = 0.0


class Tuner:
    """Runs ``cfg.tune.trials`` trials of ``study`` (resuming whatever the run dir and the study already hold)."""

    def __init__(self, cfg: TuneSchema, run_dir: Path, launcher: Launcher, run_id: str, study: optuna.Study,
                 trial_inner: Callable[[list[str]], dict[str, Any]]) -> None:
        """``trial_inner(overrides)``: a trial member's inner config for its overrides (ConfigError if invalid)."""
        self.cfg = cfg
        self.dims = study_space(cfg)
        self.run_dir = run_dir
        self.launcher = launcher
        self.run_id = run_id
        self.study = study
        self.trial_inner = trial_inner
        self.active: dict[int, ActiveTrial] = {}
        self.trial_of: dict[int, int] = {}  # member index -> trial number
        self.counted = 0  # trials toward tune.trials (every trial but the lost ones)
        self.runner: MemberArrayRunner | None = None
        self._last_scan = 0.0
        self.ended = {"failed": 0, "other": 0}  # trials this process told: FAIL, and COMPLETE or PRUNED
        self.first_error = ""

    # ------------------------------------------------------------------ main
    def run(self) -> TuneSummary:
        decided = self.recover()
        specs = [s for a in self.active.values() for s in a.plan.specs] + [s for s, _ in decided]
        specs += [s for plan in self._ask_more() for s in plan.specs]
        folder = trials_dir(self.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        jobs_path = folder / JOBS_FILE
        while specs:
            self.runner = MemberArrayRunner(
                launcher=self.launcher, entrypoint=self.cfg.inner.entrypoint, specs=specs,
                jobs=read_jobs_file(jobs_path), save_jobs=lambda jobs: write_jobs_file(jobs_path, jobs),
                launcher_folder=folder / LAUNCHER_DIR,
                policy=runner_policy(self.cfg.retries, self.cfg.inner.timeout_s, self.cfg.launcher_node),
                on_final=self._on_final, on_tick=self._on_tick, decided={s.index: r for s, r in decided},
                should_abort=lambda final: self._all_failed(),
            )
            self.runner.run()
            decided = []
            # Normally trials are asked as others end (on_final); this only catches a round that ended with none
            # in flight, e.g. when every trial asked at the end failed its config check.
            specs = [s for plan in self._ask_more() for s in plan.specs]
        self.runner = None  # the runner holds our callbacks: no cycle left for the interpreter's exit
        return self.summary()

    # ---------------------------------------------------------------- resume
    def recover(self) -> list[tuple[MemberSpec, ResultRecord]]:
        """Read the study and the trial files: activate RUNNING trials that have runs, fail the lost ones, and
        return (spec, decided record) for runs of PRUNED trials that never ended (to be cancelled)."""
        decided: list[tuple[MemberSpec, ResultRecord]] = []
        for frozen in self.study.get_trials(deepcopy=False):
            lost = frozen.state == TrialState.FAIL and frozen.user_attrs.get(LOST_ATTR)
            if frozen.state == TrialState.RUNNING:
                plan, damage = self._read_plan(frozen.number)
                if plan is None:
                    self._fail_lost(frozen, damage)
                    continue
                reported = max(frozen.intermediate_values, default=-1)
                self._activate(plan, optuna.trial.Trial(self.study, frozen._trial_id), reported)
                logger.info("trial %d: resumed (%s)", frozen.number, ", ".join(plan.overrides))
            elif frozen.state == TrialState.PRUNED:
                plan, damage = self._read_plan(frozen.number)
                if damage:
                    logger.warning("trial %d (pruned): %s; its runs cannot be checked", frozen.number, damage)
                for spec in plan.specs if plan else []:
                    if read_result(spec.work_dir) is None:
                        decided.append((spec, ResultRecord(status="pruned", error=(
                            f"trial {frozen.number} was pruned at step {frozen.user_attrs.get(PRUNED_STEP_ATTR)} "
                            "before the tuner stopped; its run was cancelled on resume"))))
            if not lost:
                self.counted += 1
        return decided

    def _read_plan(self, number: int) -> tuple[TrialPlan | None, str | None]:
        """(the trial's trial.json or None where it was never written, what is wrong with it where it is damaged)."""
        try:
            return read_trial(self.run_dir, number), None
        except CorruptFileError as exc:
            return None, str(exc)

    def _fail_lost(self, frozen: optuna.trial.FrozenTrial, damage: str | None) -> None:
        """FAIL a RUNNING trial whose runs cannot be followed; it is not counted and its slot is drawn again."""
        cause = ("the tuner stopped between asking for this trial and recording its runs" if damage is None else
                 f"{damage}, so its runs cannot be followed (any still queued are not cancelled: check the queue)")
        trial = optuna.trial.Trial(self.study, frozen._trial_id)
        trial.set_user_attr(LOST_ATTR, f"{cause}; replaced by a new trial in the same slot")
        self.study.tell(frozen.number, state=TrialState.FAIL)
        logger.warning("trial %d: %s; marked FAIL and replaced", frozen.number, cause)

    def _all_failed(self) -> str | None:
        if self.ended["failed"] < ABORT_AFTER_FAILED or self.ended["other"]:
            return None
        return (f"the first {self.ended['failed']} trials that ended in this run all failed (first error: "
                f"{self.first_error}); this looks like a cause shared by every trial. Fix it and resume with the same "
                "run_dir")

    # ------------------------------------------------------------------ asks
    def _ask_more(self) -> list[TrialPlan]:
        plans = []
        while len(self.active) < self.cfg.tune.parallel and self.counted < self.cfg.tune.trials:
            plan = self._ask()
            if plan is not None:
                plans.append(plan)
        return plans

    def _ask(self) -> TrialPlan | None:
        """A new trial in the next slot, its runs written down before anything is submitted; None when its
        settings are refused (the trial is told FAIL with the reason and counts: its params caused it)."""
        slot = self.counted
        # Seeded per slot, not once: a resumed tuner (or a replaced lost trial) draws what an uninterrupted one did.
        self.study.sampler = build_sampler(self.cfg.tune.sampler, self.cfg.tune.sampler_options,
                                           derive_seed(self.cfg.seed, "tune_sampler", slot) % (2**32))
        trial = self.study.ask()
        self.counted += 1
        trial.set_user_attr(SLOT_ATTR, slot)
        params = suggest(trial, self.dims)
        overrides = trial_overrides(params)
        try:
            inner = self.trial_inner(overrides)
        except (ConfigError, ValueError, FileNotFoundError) as exc:
            trial.set_user_attr(ERROR_ATTR, f"settings refused: {exc}"[:2000])
            self.study.tell(trial, state=TrialState.FAIL)
            logger.warning("trial %d (%s): settings refused, marked FAIL: %s", trial.number, " ".join(overrides), exc)
            return None
        plan = plan_trial(self.run_dir, self.run_id, self.cfg.seed, trial.number, slot, params, overrides, inner,
                          self.cfg.tune.seeds)
        write_trial(self.run_dir, plan)
        self._activate(plan, trial)
        logger.info("trial %d (slot %d): %s, %d run(s)", trial.number, slot, " ".join(overrides), len(plan.specs))
        return plan

    def _activate(self, plan: TrialPlan, trial: optuna.Trial, reported: int = -1) -> None:
        self.active[plan.number] = ActiveTrial(plan, trial, reported)
        for index in member_indices(plan.number, len(plan.specs)):
            self.trial_of[index] = plan.number

    # -------------------------------------------------------------- outcomes
    def _on_final(self, spec: MemberSpec, record: ResultRecord, progress: Any) -> None:
        active = self.active.get(self.trial_of.get(spec.index, -1))
        if active is None:
            return  # a run of a trial already decided (pruned, failed early)
        assert self.runner is not None
        final = self.runner.final
        pending = [i for i in active.indices if i not in final]
        if pending and record.ok:
            return
        if pending:  # one run failed for good: the trial cannot get a value; stop its other runs now
            self._tell(active, [final[i] for i in active.indices if i in final])
            self.runner.stop_members(pending, "cancelled", f"trial {active.plan.number} failed: run {spec.index} "
                                                           f"ended {record.status}")
        else:
            self._tell(active, [final[i] for i in active.indices])
        self.runner.add_members([s for plan in self._ask_more() for s in plan.specs])

    def _tell(self, active: ActiveTrial, records: Sequence[ResultRecord]) -> None:
        number = active.plan.number
        del self.active[number]
        value, reason = objective(records) if len(records) == len(active.indices) else (None, "")
        if value is None:
            bad = next((r for r in records if not r.ok), None)
            reason = reason or (f"a run ended {bad.status}: {(bad.error or '').strip()[-300:]}" if bad else "")
            active.trial.set_user_attr(ERROR_ATTR, reason[:2000])
            self.study.tell(number, state=TrialState.FAIL)
            logger.warning("trial %d: FAIL (%s)", number, reason)
            self.ended["failed"] += 1
            self.first_error = self.first_error or reason[:300]
            return
        self.ended["other"] += 1
        # Scores written since the last scan (a run may finish within one): the pruner judges later trials
        # against these, so a complete trial must carry them all, however fast its runs were.
        self._report(active, prune=False)
        active.trial.set_user_attr(RUN_VALUES_ATTR, [r.fitness for r in records])
        self.study.tell(number, value)
        logger.info("trial %d: %.4f (%s)", number, value, " ".join(active.plan.overrides))

    # --------------------------------------------------------------- pruning
    def _on_tick(self, runner: MemberArrayRunner) -> None:
        now = time.monotonic()
        if now - self._last_scan < SCAN_INTERVAL_S:
            return
        self._last_scan = now
        for active in list(self.active.values()):
            self._report(active)

    def _report(self, active: ActiveTrial, prune: bool = True) -> None:
        """Report the trial's mean intermediate score at every step all its runs have scored and that is not
        reported yet; prune on the pruner's word (``prune``: not for a trial whose runs all ended)."""
        series = [read_intermediate(spec.work_dir) for spec in active.plan.specs]
        steps = set(series[0]).intersection(*series[1:])
        for step in sorted(s for s in steps if s > active.reported):
            value = sum(s[step] for s in series) / len(series)
            active.trial.report(value, step)
            active.reported = step
            if prune and active.trial.should_prune():
                self._prune(active, step, value)
                return

    def _prune(self, active: ActiveTrial, step: int, value: float) -> None:
        assert self.runner is not None
        pending = [s for s in active.plan.specs if s.index not in self.runner.final]
        if all(read_result(s.work_dir) is not None for s in pending):
            return  # every run has already finished: its final value is told on the next poll, not a prune
        saved = sum(self._remaining_s(spec) for spec in pending)
        active.trial.set_user_attr(PRUNED_STEP_ATTR, step)
        active.trial.set_user_attr(SAVED_ATTR, saved)
        number = active.plan.number
        del self.active[number]
        self.study.tell(number, state=TrialState.PRUNED)  # told first: a restart cancels what is left
        self.ended["other"] += 1
        self.runner.stop_members([s.index for s in pending], "pruned", (
            f"trial {number} pruned by tune.pruner={self.cfg.tune.pruner} after step {step} (intermediate pass@1 "
            f"{value:.4f}); about {saved:.0f} s of running time saved"))
        logger.info("trial %d: pruned after step %d (%.4f); about %.0f s of member running time saved", number, step,
                    value, saved)
        self.runner.add_members([s for plan in self._ask_more() for s in plan.specs])

    @staticmethod
    def _remaining_s(spec: MemberSpec) -> float:
        """Running time a stopped run would still have taken, from its progress file (0 when unknown)."""
        progress = read_progress(spec.work_dir)
        remaining = progress.remaining_s() if progress is not None else None
        return float(remaining or 0.0)

    # --------------------------------------------------------------- summary
    def summary(self) -> TuneSummary:
        trials = self.study.get_trials(deepcopy=False)
        summary = TuneSummary(counts=state_counts(trials), saved_member_s=sum(float(t.user_attrs.get(SAVED_ATTR, 0.0))
                                                                               for t in trials))
        best = best_complete_trial(self.study)
        if best is not None:
            summary.best_number, summary.best_value, summary.best_params = best.number, best.value, dict(best.params)
        return summary

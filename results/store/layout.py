"""The on-disk layout of an ES run directory and of a member's work directory: the one module that spells it.

Every file and directory name inside a run dir or a member dir is defined here and nowhere else, so that the
orchestrator, the launchers, the member processes and the report can never disagree about where a thing
lives (tests/test_results/test_results_layout.py fails on a layout name spelled anywhere else). ``RunStore``
(results/store/run_store.py) turns these names into paths and typed reads/writes; light modules that only know a member's
work dir (launch.member, inner_loop.member) use the names directly. Standard library only: every member
process imports it.

    run_dir/                                  (see docs/run_directory.md)
      config.yaml                             CONFIG_FILE: the resolved config
      manifest.json                           SEARCH_MANIFEST_FILE: code version, data hashes, seeds, launcher
      LOCK                                    RUN_LOCK_FILE: one orchestrator per run dir
      state/gen_0007.pt (+ .sha256)           STATE_DIR / state_file_name(7): searcher state after that tell
      gen_0008/                               generation_dir_name(8)
        population.pt (+ .sha256)             POPULATION_FILE: asked population, written before any submission
        jobs.json                             JOBS_FILE: member -> job map, written right after each submission
        closed.json                           CLOSED_FILE: members closed as late at the quorum (if it closed early)
        early_stop.json                       EARLY_STOP_FILE: early_stop's decisions (if enabled)
        member_017/                           member_dir_name(17): the member's work dir, below
        submitit/                             LAUNCHER_DIR: submitit's logs and pickles
          cancelled_by_orchestrator.json      CANCELLED_FILE: job ids the orchestrator itself cancelled
          submissions/chunk_000.json          SUBMISSIONS_DIR / chunk_marker_name(0): one marker per sbatch chunk
          gpu_slots.json                      GPU_SLOTS_FILE: launcher=local's job id -> the GPUs it holds
      reevaluation/                           REEVALUATE_DIR: re-evaluation before export (meta.reevaluate)
        candidates.json, reevaluation.json    CANDIDATES_FILE, REEVALUATION_FILE
        jobs.json, member_005/, submitit/     as in a generation dir (member index = candidate x seeds + seed)
        reporting/                            REPORTING_DIR: stage B, the exported init and the baselines on fresh
                                              seeds (member index = row x seeds + seed), same layout
          rows.json                           REPORT_ROWS_FILE: every row's divergence, params, inner config,
                                              written before any submission
          result_table.json, .md, .csv, .png  RESULT_TABLE_FILE (+ result_table_file(suffix)): the result table
          result_differences.csv              RESULT_DIFFERENCES_FILE: every paired difference with its interval
        reporting.old0/                       archived_reporting_dir_name(0): an earlier stage B, moved aside
      reevaluation.old0/                      archived_reevaluate_dir_name(0): an earlier re-evaluation, moved aside
      tables/                                 TABLES_DIR
        members.parquet, generations.parquet  MEMBERS_TABLE_FILE, GENERATIONS_TABLE_FILE
        best/best_member.json                 BEST_DIR / BEST_MEMBER_FILE
      report/                                 REPORT_DIR: where ``python -m results.report`` writes by default
      tensorboard_logs/                       TENSORBOARD_DIR: the search's scalars, one event file per generation
      particles/                              PARTICLES_DIR: es=nres, one folder per particle (its training run)
        particle_017/                         particle_dir_name(17)
          boundary_e0002_s000300/             boundary_dir_name(2, 300): its checkpoint at step 300 of its run
            boundary.json                     BOUNDARY_FILE: that step, its run (episode) and validation pass@1

    tune run_dir/  (``python -m meta.tune``; config.yaml, manifest.json, LOCK and report/ as above)
      study.json                              STUDY_FILE: the study's storage URL and name, the search space
      optuna_journal.log                      JOURNAL_FILE: the default study store (Optuna's JournalStorage)
      tuning_trials/                          TRIALS_DIR: every trial's members, one runner for all of them
        jobs.json, submitit/                  JOBS_FILE, LAUNCHER_DIR: as in a generation dir
        trial_0007/                           trial_dir_name(7): Optuna trial number 7
          trial.json                          TRIAL_FILE: its params, overrides and members, written before submission
          member_001/                         member_dir_name(seed k): one training run of the trial

    pilot run_dir/  (``python -m meta.pilot``; config.yaml, manifest.json with kind "pilot", LOCK and report/ as above)
      pilot_plan.json                         PILOT_PLAN_FILE: centre, pair directions, (radius, coef) combinations and
                                              every run's role, written before any submission
      pilot_runs/                             PILOT_RUNS_DIR: every run of the pilot, one runner for all of them
        jobs.json, submitit/, member_012/     as in a generation dir (index: meta/pilot/findings.py member_index)
      pilot.json                              PILOT_FILE: the findings (noise, pair differences, SNR, recommendation)

    member_dir/  (also a single run's work dir, ``python -m inner_loop.run work_dir=...``)
      spec.json                               SPEC_FILE: the member spec
      manifest.json                           RUN_MANIFEST_FILE: provenance of this training run
      started.json                            STARTED_FILE: the running-time ledger (launch.member)
      preflight.json                          PREFLIGHT_FILE: the node and cause of the last failed pre-flight
      .member.lock                            MEMBER_LOCK_FILE: one job per member at a time
      result.json                             RESULT_FILE: the final record
      result.attempt0.json, ...               archived_result_name(k): records of earlier (retried) attempts
      checkpoints/                            CHECKPOINT_DIR: the Trainer's output_dir (resumable checkpoints)
      .checkpoints.deleting/                  CHECKPOINT_TRASH_DIR: checkpoints being deleted
      final/                                  FINAL_MODEL_DIR: a single run's trained model
      progress.json                           PROGRESS_FILE: latest step, reward, zero-std groups, gradient share
      tensorboard_logs/                       TENSORBOARD_DIR: TRL's metrics (train.report_to: [tensorboard])
      intermediate.jsonl                      INTERMEDIATE_FILE: validation pass@1 every train.eval_every steps
      seed_01/                                seed_dir_name(1): with seeds_per_member > 1, the member's run on its
                                              seed 1, a member dir of its own (the member's result is their mean)
      evaluation_humaneval_test.json          evaluation_file_name("humaneval"): the finished run's model scored on
                                              another task's test split (python -m inner_loop.evaluate)

The ``.sha256`` sidecars are named by results/store/atomic.py (CHECKSUM_SUFFIX), which writes and verifies them.
Numbered names are padded (``gen_0008``, ``member_017``) but wider numbers are valid (``gen_12345``), and the
parse functions accept them: always build and read numbered names through the functions below.
"""
from __future__ import annotations

import operator
import re

# ------------------------------------------------------------------ run dir
CONFIG_FILE = "config.yaml"
#: the search's manifest at the run dir's root (same file name as a training run's RUN_MANIFEST_FILE)
SEARCH_MANIFEST_FILE = "manifest.json"
RUN_LOCK_FILE = "LOCK"
STATE_DIR = "state"
TABLES_DIR = "tables"
MEMBERS_TABLE_FILE = "members.parquet"
GENERATIONS_TABLE_FILE = "generations.parquet"
BEST_DIR = "best"  # inside TABLES_DIR
BEST_MEMBER_FILE = "best_member.json"
REPORT_DIR = "report"

#: es=nres: the particles' checkpoints at their truncation boundaries (results/store/truncation.py)
PARTICLES_DIR = "particles"
PARTICLE_DIR_PREFIX = "particle_"
BOUNDARY_DIR_PREFIX = "boundary_"
#: a boundary checkpoint's record: {episode, step, score}; written last, so a folder without it is incomplete
BOUNDARY_FILE = "boundary.json"

# -------------------------------------------------------- generation dir
GENERATION_DIR_PREFIX = "gen_"
POPULATION_FILE = "population.pt"
JOBS_FILE = "jobs.json"
MEMBER_DIR_PREFIX = "member_"
#: a generation closed at its quorum: which members were cancelled as late (meta/search/generation/generation_close.py)
CLOSED_FILE = "closed.json"
#: early_stop's decisions in a generation (meta/search/generation/early_stop.py), written before any stopped member is cancelled
EARLY_STOP_FILE = "early_stop.json"

# -------------------------------------------------------- re-evaluation dir (meta/search/after/reevaluate.py)
REEVALUATE_DIR = "reevaluation"
#: the inits re-evaluated (top-k members + final centre) with their params, written before any submission
CANDIDATES_FILE = "candidates.json"
#: per candidate: re-evaluated mean, std, n; the chosen init; its test-split numbers
REEVALUATION_FILE = "reevaluation.json"
#: stage B of the re-evaluation (meta/search/after/reporting.py): the exported init and the baselines retrained on fresh seeds,
#: inside REEVALUATE_DIR (member dirs and jobs.json like a generation's)
REPORTING_DIR = "reporting"
#: the reporting rows (name, divergence block and its source, params, inner config), written before any submission
REPORT_ROWS_FILE = "rows.json"
#: the result table's data; the same table as markdown/CSV/plot is result_table_file(".md" | ".csv" | ".png")
RESULT_TABLE_FILE = "result_table.json"
#: every (row, baseline) paired difference with its interval
RESULT_DIFFERENCES_FILE = "result_differences.csv"
#: the launcher's folder (submitit's logs, pickles and our markers)
LAUNCHER_DIR = "submitit"

# ---------------------------------------------------------- launcher dir
CANCELLED_FILE = "cancelled_by_orchestrator.json"
#: one marker file per submitted sbatch array chunk (launch/slurm/chunks.py)
SUBMISSIONS_DIR = "submissions"
#: launcher=local: which GPUs each local job was given (launch/local/gpu_slots.py), so a resumed orchestrator
#: hands no GPU still held by a running member to another
GPU_SLOTS_FILE = "gpu_slots.json"

# ------------------------------------------------------------ member dir
RESULT_FILE = "result.json"
SPEC_FILE = "spec.json"
#: the running-time ledger, also the orchestrator's "this attempt has started" marker
STARTED_FILE = "started.json"
#: the last failed pre-flight of a member (inner_loop/member/preflight.py): {host, cause, time}; the job ended without a
#: result, and a launcher that can exclude nodes resubmits it elsewhere
PREFLIGHT_FILE = "preflight.json"
MEMBER_LOCK_FILE = ".member.lock"
#: the output of a member that runs in its own process inside a packed task (launch/slurm/packed.py); an unpacked
#: member's output is its job's submitit log
MEMBER_LOG_FILE = "member.log"
#: which task and GPU a member shared with which other members (resources.members_per_gpu >= 2;
#: results/store/gpu_share.py): written by the launcher side before the member starts, shown in the members table
GPU_SHARE_FILE = "gpu_share.json"
#: a request to stop this one member of a packed SLURM task (launch/slurm/packed.py), naming the task it is for
CANCEL_REQUEST_FILE = "cancel_request.json"
#: a training run's provenance (results/store/provenance.py), in a member dir or a single run's work dir
RUN_MANIFEST_FILE = "manifest.json"
#: the Trainer's output_dir
CHECKPOINT_DIR = "checkpoints"
#: where a checkpoint folder goes while it is deleted, so a crash mid-delete never leaves a half-deleted folder
#: under a name that looks resumable; the next cleanup finishes the job (inner_loop/training/checkpoints.py)
CHECKPOINT_TRASH_DIR = ".checkpoints.deleting"
#: where a single run leaves its trained model, whatever train.keep_checkpoints says
FINAL_MODEL_DIR = "final"
#: the member's latest training progress (step, reward, zero-std groups, gradient share), for meta.status and the
#: orchestrator's warnings (results/store/member_files.py)
PROGRESS_FILE = "progress.json"
#: event files: TRL's metrics of a member (train.report_to tensorboard); a search's per-generation scalars
TENSORBOARD_DIR = "tensorboard_logs"

SEED_DIR_PREFIX = "seed_"

#: one line per intermediate validation (train.eval_every), read by a tuner's pruner (results/store/member_files.py)
INTERMEDIATE_FILE = "intermediate.jsonl"

# ------------------------------------------------------------ tune run dir (meta/tune/)
STUDY_FILE = "study.json"
JOURNAL_FILE = "optuna_journal.log"
TRIALS_DIR = "tuning_trials"
TRIAL_DIR_PREFIX = "trial_"
TRIAL_FILE = "trial.json"

# ------------------------------------------------------------ pilot run dir (meta/pilot/cli.py)
#: the pilot's plan: centre, pair directions, (radius, coef) combinations, seeds and every run's role
PILOT_PLAN_FILE = "pilot_plan.json"
#: every run of the pilot (jobs.json, submitit/, member dirs), laid out like a generation dir
PILOT_RUNS_DIR = "pilot_runs"
#: the pilot's findings, rewritten each time a run becomes final (``complete`` once every run is):
#: meta/pilot/findings.py computes them, results/report/pilot.py formats them
PILOT_FILE = "pilot.json"

_GENERATION_WIDTH = 4
_MEMBER_WIDTH = 3
_CHUNK_WIDTH = 3
_STATE_SUFFIX = ".pt"
_GENERATION_RE = re.compile(rf"^{GENERATION_DIR_PREFIX}(\d{{{_GENERATION_WIDTH},}})$")
_STATE_RE = re.compile(rf"^{GENERATION_DIR_PREFIX}(\d{{{_GENERATION_WIDTH},}}){re.escape(_STATE_SUFFIX)}$")
_MEMBER_RE = re.compile(rf"^{MEMBER_DIR_PREFIX}(\d{{{_MEMBER_WIDTH},}})$")
_BOUNDARY_RE = re.compile(rf"^{BOUNDARY_DIR_PREFIX}e(\d{{4,}})_s(\d{{6,}})$")
_TRIAL_RE = re.compile(rf"^{TRIAL_DIR_PREFIX}(\d{{{_GENERATION_WIDTH},}})$")
_ARCHIVED_RESULT = "result.attempt{}.json"
#: a finished run scored afterwards on a task's split (inner_loop/training/transfer.py); task names may hold underscores
_EVALUATION_FILE = "evaluation_{}_{}.json"
_EVALUATION_RE = re.compile(r"^evaluation_([A-Za-z0-9][A-Za-z0-9_.-]*)_(validation|test)\.json$")
_TASK_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_CHUNK_MARKER_RE = re.compile(r"^chunk_(\d+)\.json$")


def _number(value: int, what: str) -> int:
    """Numbered names exist only for non-negative integers (numpy's included): a negative one would not parse
    back, and a float would be formatted as something no parser reads."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return number


def _parsed(pattern: re.Pattern[str], name: str) -> int | None:
    match = pattern.match(name)
    return int(match.group(1)) if match else None


def generation_dir_name(generation: int) -> str:
    """``gen_0008``: the directory of one generation inside the run dir."""
    return f"{GENERATION_DIR_PREFIX}{_number(generation, 'generation'):0{_GENERATION_WIDTH}d}"


def parse_generation_dir_name(name: str) -> int | None:
    """The generation a directory name stands for, or None when it is not a generation dir's name."""
    return _parsed(_GENERATION_RE, name)


def state_file_name(generation: int) -> str:
    """``gen_0007.pt``: the searcher state after that generation's tell, inside STATE_DIR."""
    return generation_dir_name(generation) + _STATE_SUFFIX


def parse_state_file_name(name: str) -> int | None:
    """The generation a state file's name stands for, or None for any other file (its checksum sidecar included)."""
    return _parsed(_STATE_RE, name)


def member_dir_name(index: int) -> str:
    """``member_017``: the work dir of one member inside its generation dir."""
    return f"{MEMBER_DIR_PREFIX}{_number(index, 'member index'):0{_MEMBER_WIDTH}d}"


def parse_member_dir_name(name: str) -> int | None:
    """The member index a directory name stands for, or None when it is not a member dir's name."""
    return _parsed(_MEMBER_RE, name)


def particle_dir_name(index: int) -> str:
    """``particle_017``: the folder of es=nres particle 17 (population member 17) inside PARTICLES_DIR."""
    return f"{PARTICLE_DIR_PREFIX}{_number(index, 'particle index'):0{_MEMBER_WIDTH}d}"


def boundary_dir_name(episode: int, step: int) -> str:
    """``boundary_e0002_s000300``: a particle's checkpoint at ``step`` of its run number ``episode``."""
    return f"{BOUNDARY_DIR_PREFIX}e{_number(episode, 'episode'):04d}_s{_number(step, 'step'):06d}"


def parse_boundary_dir_name(name: str) -> tuple[int, int] | None:
    """(episode, step) of a boundary folder's name, or None for any other name."""
    match = _BOUNDARY_RE.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def result_table_file(suffix: str) -> str:
    """``result_table.md``: the result table rendered as ``suffix`` (.json, .md, .csv, .png)."""
    return RESULT_TABLE_FILE.rsplit(".", 1)[0] + suffix


def trial_dir_name(number: int) -> str:
    """``trial_0007``: the directory of Optuna trial 7 inside TRIALS_DIR."""
    return f"{TRIAL_DIR_PREFIX}{_number(number, 'trial number'):0{_GENERATION_WIDTH}d}"


def parse_trial_dir_name(name: str) -> int | None:
    """The trial number a directory name stands for, or None when it is not a trial dir's name."""
    return _parsed(_TRIAL_RE, name)


def archived_result_name(attempt: int) -> str:
    """``result.attempt<k>.json``: attempt k's record, moved aside when the member is retried. Their count IS the
    member's attempt counter (launch/runner.py), so it survives orchestrator restarts without extra state."""
    return _ARCHIVED_RESULT.format(_number(attempt, "attempt"))


def archived_reevaluate_dir_name(k: int) -> str:
    """Where an earlier re-evaluation (other settings, fewer generations) is moved aside, k = 0, 1, ..."""
    return f"{REEVALUATE_DIR}.old{_number(k, 'archive')}"


def seed_dir_name(k: int) -> str:
    """``seed_01``: a member's k-th seed run (seeds_per_member > 1), inside the member's work dir."""
    return f"{SEED_DIR_PREFIX}{_number(k, 'seed index'):02d}"


def archived_reporting_dir_name(k: int) -> str:
    """Where an earlier stage B (another exported init, other rows or seeds) is moved aside, k = 0, 1, ..."""
    return f"{REPORTING_DIR}.old{_number(k, 'archive')}"


def chunk_marker_name(chunk: int) -> str:
    """``chunk_000.json``: the marker of one submitted sbatch array chunk, inside SUBMISSIONS_DIR."""
    return f"chunk_{_number(chunk, 'chunk'):0{_CHUNK_WIDTH}d}.json"


def parse_chunk_marker_name(name: str) -> int | None:
    """The chunk number a marker file's name stands for, or None for any other file."""
    return _parsed(_CHUNK_MARKER_RE, name)


def evaluation_file_name(task: str, split: str = "test") -> str:
    """``evaluation_<task>_<split>.json``: the record of a finished run scored afterwards on ``task``'s ``split``,
    beside its result.json; one per task and split (a later evaluation replaces it)."""
    if not isinstance(task, str) or not _TASK_NAME_RE.match(task):
        raise ValueError(f"task name {task!r} cannot name a file (letters, digits, '_', '.', '-' only)")
    if split not in ("validation", "test"):
        raise ValueError(f"split {split!r} is not 'validation' or 'test'")
    return _EVALUATION_FILE.format(task, split)


def parse_evaluation_file_name(name: str) -> tuple[str, str] | None:
    """(task, split) of an evaluation record's file name, or None for any other file."""
    match = _EVALUATION_RE.match(name)
    return (match.group(1), match.group(2)) if match else None

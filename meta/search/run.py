"""``python -m meta.run [key=value ...]``: start or resume an NM-GRPO-ES search.

Hydra composes conf/config.yaml with the command-line overrides (no chdir, no Hydra output dirs: everything
goes to ``run_dir``). With ``run_dir=`` pointing at an existing run, the overrides the run was started with
are replayed under the new ones, and the result must not change the search (see meta/search/resume.py).
Every path a run records is absolute (resolved against the directory the command ran in), and the run
records its launcher kind and cluster (SLURM ClusterName, or this host for local jobs): a resume from another
directory reads the same files, and a resume with another launcher or on another cluster is refused.
``dry_run=true`` validates, prints the plan (meta/search/plan.py) and writes and submits nothing.
Exit status: 0 done, 1 aborted (too many failed members), 2 bad config, 3 run dir locked.
"""
from __future__ import annotations

import datetime as _dt
import logging
import platform
import sys
import uuid
from pathlib import Path
from typing import Any, Sequence

import yaml

from meta.search.config import (CONF_DIR, SEARCH_KEYS, ConfigError, check_members_can_start, SearchConfig,
                                absolute_overrides, absolute_paths, build_search_config, config_hash)
from meta.search.after.baselines import transfer_tasks
from meta.cli_args import run_command
from meta.compose import compose, merge_overrides
from meta.search.resume import NEW_KEY, check_job_namespace, check_resume, open_run_dir, run_dir_label
from meta.search.staging import preflight_run, stage_run
from meta.settings.upgrade import stored_config, stored_manifest
from core.config_nodes import config_groups, group_file
from results.store.provenance import code_version
from results.store.run_store import RunStore

logger = logging.getLogger("meta.run")

_GROUPS = config_groups(CONF_DIR)  # the registries' YAML side: conf/ and MIRROR_ES_CONFIG_PATH's trees
USAGE = f"""usage: python -m meta.run [key=value ...]

Start an ES search over neural-mirror-map inits, or resume one with run_dir=<existing run>.
Common keys: population, generations, seed, run_dir, es={'|'.join(_GROUPS.get('es', []))},
launcher={'|'.join(_GROUPS.get('launcher', []))}, experiment={'|'.join(_GROUPS.get('experiment', []))},
init=uniform|gaussian|<file>, inner.entrypoint, inner.timeout_s, resources.*, retries, fitness_on_failure,
max_failed_fraction, task={'|'.join(_GROUPS.get('task', []))}, model=..., train.steps=...,
es.member_steps=... (a search member's steps; null: train.steps),
dry_run=true (print the plan, submit and write nothing)
See meta/settings/schema.py (SearchSchema) for every key, its default and its range."""


def transfer_evaluations(raw: dict[str, Any], overrides: Sequence[str]) -> list[dict[str, Any]]:
    """The transfer tasks the reporting runs will score (reevaluate.transfer, composed as meta/search/after/baselines.py composes
    them), for staging; none while the list is malformed, which the config check that follows names."""
    names = (raw.get("reevaluate") or {}).get("transfer") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and group_file(CONF_DIR, "task", n) for n in names):
        return []
    return transfer_tasks(names, overrides)


def prepare(argv: Sequence[str]) -> tuple[SearchConfig, dict[str, Any], RunStore, dict[str, Any], bool]:
    """Resolve, validate and (for a resume) compare the config. Writes nothing."""
    overrides = [a for a in argv if a.strip()]
    bad = [a for a in overrides if "=" not in a]
    if bad:
        raise ConfigError(f"argument {bad[0]!r} is not key=value\n{USAGE}")
    cwd = Path.cwd()
    overrides = absolute_overrides(overrides, cwd)
    fresh = compose(overrides)
    run_dir, resuming = open_run_dir(fresh, cwd, "meta", "search")
    store = RunStore(run_dir)
    manifest: dict[str, Any] = {}
    if resuming:
        manifest = stored_manifest(store)
        if manifest.get("kind") is not None:  # e.g. "tune": a meta.tune run dir
            raise ConfigError(f"run_dir={run_dir} is a meta.{manifest['kind']} run, not an ES search; resume it with "
                              f"python -m meta.{manifest['kind']} run_dir={run_dir}")
        combined = merge_overrides(manifest.get("overrides", []), overrides)
        raw = compose(combined)
        raw.pop(NEW_KEY, None)
    else:
        raw = fresh
        manifest = {"overrides": merge_overrides([], overrides)}
    absolute_paths(raw, cwd)
    # hub names -> staged local snapshots (fetched unless a dry run), before anything reads data or compares configs;
    # the transfer tasks' datasets too, which the reporting runs read from the pins (meta/search/after/reporting.py)
    stage_run(raw, manifest, resuming, fetch=not raw.get("dry_run"),
              extra_evaluations=transfer_evaluations(raw, combined if resuming else overrides))
    if resuming:
        stored = stored_config(store)
        check_resume(stored, raw, SEARCH_KEYS, run_dir, "search")
        manifest["overrides"] = combined
    raw["run_dir"] = run_dir
    cfg = build_search_config(raw)
    return cfg, raw, store, manifest, resuming


def write_run_files(store: RunStore, raw: dict[str, Any], manifest: dict[str, Any], resuming: bool) -> dict[str, Any]:
    import torch

    store.write_config(yaml.safe_dump(raw, sort_keys=True))
    if not resuming:
        manifest.update(
            {
                "run_id": uuid.uuid4().hex[:12],
                "created": _dt.datetime.now().isoformat(timespec="seconds"),
                "seed": raw["seed"],
            }
        )
    manifest.update(
        {
            "config_hash": config_hash(raw),
            "code_version": code_version(CONF_DIR.parent),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "host": platform.node(),
        }
    )
    store.write_manifest(manifest)
    return manifest


def run(argv: Sequence[str]) -> int:
    from launch.factory import build_launcher
    from launch.runner import AbortRun
    from meta.search.lock import run_locked
    from meta.search.generation.orchestrator import Orchestrator
    from meta.search.after.reevaluate import ReevaluationError, run_reevaluation
    from meta.search.after.reporting import check_rows
    from results.report.search.result_table import render_markdown
    from results.report.search.report import format_noise
    from results.report.search.snapshot import load_run

    cfg, raw, store, manifest, resuming = prepare(argv)
    logging.getLogger().setLevel(cfg.log_level)
    check_rows(cfg, manifest.get("overrides", []))
    if cfg.dry_run:
        from meta.search.plan import build_plan

        # The plan IS this command's output (for pipes and files), hence stdout rather than the log.
        sys.stdout.write(build_plan(cfg, raw, store, resuming, manifest.get("run_id"), manifest.get("overrides", []))
                         + "\n")
        sys.stdout.flush()
        return 0
    check_members_can_start(cfg.launcher)
    # this host's checks of what the members and the reporting runs read, before anything is written or submitted
    preflight_run(cfg, manifest, transfer_evaluations(raw, manifest.get("overrides", [])))
    manifest.update(check_job_namespace(raw, manifest))

    def body() -> int:
        write_run_files(store, raw, manifest, resuming)  # updates manifest in place (run_id, hashes)
        launcher = build_launcher(cfg.launcher)
        logger.info("%s (run %s)", run_dir_label(store.root, resuming, "search"), manifest["run_id"])
        try:
            summary = Orchestrator(cfg, store, launcher, manifest["run_id"]).run()
            best = summary.best
            what = ("largest gain of validation pass@1 over one truncation (not a run's score: the runs after the "
                    "search measure that)" if cfg.searcher_online else "best member's (single-run) fitness")
            logger.info("search finished after %d generation(s); %s %s", summary.generations_done, what,
                        f"{best['fitness']:.4f}" if best else "n/a")
            if cfg.reevaluate.top_k > 0:
                reevaluation = run_reevaluation(cfg, store, launcher, manifest["run_id"],
                                                overrides=manifest.get("overrides", []))
                logger.info("exported init (selection stage): %s", reevaluation["chosen"])
                if "table" in reevaluation:
                    # The search's outcome, printed for the user as the plan is: whether members differed by more
                    # than seed noise, then the result table.
                    noise = "\n".join(format_noise(load_run(store.root)))
                    sys.stdout.write(f"\nnoise (validation pass@1):\n{noise}\n\n"
                                     + render_markdown(reevaluation["table"], all_pairs=False) + "\n")
                    sys.stdout.flush()
        except (AbortRun, ReevaluationError) as exc:
            logger.error("aborted: %s", exc)
            return 1
        finally:
            launcher.close()
        which = "best" if cfg.reevaluate.top_k > 0 else "center"
        logger.info("export with `python -m meta.export run_dir=%s which=%s out=best_mirror.safetensors`",
                    store.root, which)
        return 0

    return run_locked(store.lock_path, body)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, USAGE, run, "config error")

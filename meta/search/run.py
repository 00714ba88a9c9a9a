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
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import yaml

from meta.search import recipe
from meta.search.config import CONF_DIR, SEARCH_KEYS, build_search_config, config_hash
from meta.search.after.baselines import ReportRow, transfer_tasks
from meta.search.resume import run_dir_label
from meta.search.staging import preflight_run
from meta.settings.schema import SearchSchema
from core.config.groups import config_groups, group_file
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


def prepare(argv: Sequence[str]) -> tuple[SearchSchema, dict[str, Any], RunStore, dict[str, Any], bool]:
    """Resolve, validate and (for a resume) compare the config (meta.stage stages through here). Writes nothing."""
    prepared = recipe.prepare(SEARCH, argv)
    return prepared.cfg, prepared.raw, prepared.store, prepared.manifest, prepared.resuming


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


@dataclass
class SearchRun(recipe.Prepared[SearchSchema]):
    """A search's prepared run, with its result table's rows composed once: each row is a Hydra composition of the
    run's command line, and the check and the plan both read them (~5 s of a dry run when composed twice)."""

    @cached_property
    def report_rows(self) -> list[ReportRow]:
        """The result table's rows (none for a search without one)."""
        from meta.search.after.reporting import has_result_table, plan_rows

        return plan_rows(self.cfg, self.overrides) if has_result_table(self.cfg) else []


class SearchRecipe(recipe.Recipe):
    """What ``python -m meta.run`` states to the runner (meta/search/recipe.py): an ES search and the runs after it."""

    command = "meta.run"
    usage = USAGE
    run_dir_prefix = "meta"
    noun = resume_noun = "search"
    resume_keys = SEARCH_KEYS

    def other_kind(self, kind: str | None, run_dir: str) -> str:
        return (f"run_dir={run_dir} is a meta.{kind} run, not an ES search; resume it with python -m meta.{kind} "
                f"run_dir={run_dir}")

    def stage_options(self, raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
        # the transfer tasks' datasets too, which the reporting runs read from the pins (meta/search/after/reporting.py)
        return {"extra_evaluations": transfer_evaluations(raw, overrides)}

    def build(self, setup: recipe.Setup) -> SearchRun:
        return setup.with_config(SearchRun, cfg=build_search_config(setup.raw))

    def check(self, prepared: SearchRun) -> None:
        from meta.search.after.reporting import check_rows

        check_rows(prepared.cfg, prepared.report_rows)

    def plan(self, prepared: SearchRun) -> str:
        from meta.search.plan import build_plan

        return build_plan(prepared.cfg, prepared.store, prepared.resuming, prepared.manifest.get("run_id"),
                          report_rows=prepared.report_rows)

    def before_lock(self, prepared: SearchRun) -> None:
        # this host's checks of what the members and the reporting runs read, before anything is written or submitted
        preflight_run(prepared.cfg, prepared.manifest, transfer_evaluations(prepared.raw, prepared.overrides))

    def start(self, prepared: SearchRun) -> None:
        write_run_files(prepared.store, prepared.raw, prepared.manifest, prepared.resuming)  # run_id, hashes
        logger.info("%s (run %s)", run_dir_label(prepared.store.root, prepared.resuming, "search"),
                    prepared.manifest["run_id"])

    def execute(self, prepared: SearchRun, state: None, launcher: Any) -> None:
        from meta.search.generation.orchestrator import Orchestrator
        from meta.search.after.reevaluate import run_reevaluation
        from results.report.search.result_table import render_markdown
        from results.report.search.online import search_measure
        from results.report.search.report import format_noise
        from results.report.search.snapshot import load_run

        cfg, store, run_id = prepared.cfg, prepared.store, prepared.manifest["run_id"]
        summary = Orchestrator(cfg, store, launcher, run_id).run()
        best = summary.best
        logger.info("search finished after %d generation(s); %s %s", summary.generations_done,
                    search_measure(store).best_text,
                    f"{best['fitness']:.4f}" if best else "n/a")
        if cfg.reevaluate_settings.top_k > 0:
            reevaluation = run_reevaluation(cfg, store, launcher, run_id, overrides=prepared.overrides)
            logger.info("exported init (selection stage): %s", reevaluation["chosen"])
            if "table" in reevaluation:
                # The search's outcome, printed for the user as the plan is: whether members differed by more
                # than seed noise, then the result table.
                noise = "\n".join(format_noise(load_run(store.root)))
                sys.stdout.write(f"\nnoise (validation pass@1):\n{noise}\n\n"
                                 + render_markdown(reevaluation["table"], all_pairs=False) + "\n")
                sys.stdout.flush()

    def finish(self, prepared: SearchRun, state: None, outcome: None) -> int:
        which = "best" if prepared.cfg.reevaluate_settings.top_k > 0 else "center"
        logger.info("export with `python -m meta.export run_dir=%s which=%s out=best_mirror.safetensors`",
                    prepared.store.root, which)
        return 0

    def aborts(self) -> tuple[type[BaseException], ...]:
        from meta.search.after.reevaluate import ReevaluationError

        return (*super().aborts(), ReevaluationError)


SEARCH = recipe.register(SearchRecipe())


def main(argv: Sequence[str] | None = None) -> int:
    return recipe.main(SEARCH, argv)

"""``python -m meta.tune [key=value ...]``: tune the inner run's hyperparameters with Optuna, or resume a tuning.

Hydra composes conf/tune.yaml (the groups of ``inner_loop.run`` plus launcher and ``tune.*``) with the overrides.
With ``run_dir=`` naming an existing tune run, its recorded overrides are replayed under the new ones; changes to what
the study computes (the space, seeds, sampler, pruner, storage, the run config) are refused, ``tune.trials`` may grow.
``export=<file>`` on an existing run writes the best trial's settings as a preset YAML and runs nothing (on a new run:
after the tuning). ``dry_run=true`` validates and prints what would run and cost; it writes and submits nothing.
Exit status: 0 done, 1 no trial completed (or the launcher gave up), 2 bad input, 3 run dir locked.
"""
from __future__ import annotations

import datetime as _dt
import logging
import platform
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from inner_loop.loss.divergences import divergences
from meta.search.config import (CONF_DIR, INNER_NODES, ConfigError, check_members_can_start, absolute_overrides,
                                absolute_path, absolute_paths)
from meta.cli_args import run_command
from meta.search.resume import NEW_KEY, check_job_namespace, check_resume, open_run_dir, run_dir_label
from meta.compose import compose_with_choices, merge_overrides
from meta.search.staging import stage_run, staged_inner
from meta.tune.config import STUDY_KEYS, TuneConfig, build_pruner, build_sampler, build_tune_config, study_hash
from meta.settings.upgrade import stored_config, stored_manifest
from core.config_nodes import config_groups
from results.store.provenance import code_version
from results.store.run_store import RunStore

logger = logging.getLogger("meta.tune")

CONFIG_NAME = "tune"
#: how a tuning's missing hub items are staged on a host with network (it stages before its first trial)
STAGE_HINT = "`python -m meta.tune <the same overrides>` (it stages before its first trial)"
#: the manifest's ``kind`` of a tune run (an ES run dir has none)
TUNE_KIND = "tune"
_GROUPS = config_groups(CONF_DIR)  # the registries' YAML side: conf/ and MIRROR_ES_CONFIG_PATH's trees
_TUNED = ", ".join(name for name, entry in divergences().items() if entry.compared)  # the registry's compared rows
USAGE = f"""usage: python -m meta.tune [key=value ...]

Tune the inner run's hyperparameters (Optuna); resume with run_dir=<existing tune run>.
Common keys: tune.space='{{divergence.coef: [log, 1e-4, 1.0], divergence: [choice, {_TUNED}]}}', tune.trials,
tune.parallel, tune.seeds, tune.sampler=tpe|random|cmaes, tune.pruner=none|median|successive_halving,
tune.storage=sqlite:////abs/study.db, train.eval_every, launcher={'|'.join(_GROUPS.get('launcher', []))},
experiment={'|'.join(_GROUPS.get('experiment', []))}, run_dir=...,
export=best.yaml, dry_run=true. See conf/tune.yaml for every key and its default."""


def composed(overrides: Sequence[str], cwd: Path) -> dict[str, Any]:
    """conf/tune.yaml composed with ``overrides``, paths made absolute against ``cwd``."""
    raw, _ = compose_with_choices(overrides, CONFIG_NAME)
    absolute_paths(raw, cwd)
    return raw


@dataclass
class Prepared:
    """The validated run: config, composed dict, store, manifest, and what a trial's composition starts from."""

    cfg: TuneConfig
    raw: dict[str, Any]
    store: RunStore
    manifest: dict[str, Any]
    resuming: bool
    overrides: list[str]
    choices: dict[str, str]
    cwd: Path

    def trial_inner(self, overrides: Sequence[str]) -> dict[str, Any]:
        """A trial member's inner config: the run's composition with the trial's overrides, validated."""
        from launch.member import load_program

        raw = composed([*self.overrides, *overrides], self.cwd)
        # composed by hub name: the trial reads the snapshots the run staged and pinned before its first trial
        inner = self.cfg.member_inner({node: raw[node] for node in INNER_NODES})
        inner = staged_inner(self.cfg.inner_entrypoint, inner, self.manifest)
        load_program(self.cfg.inner_entrypoint).validate(inner)
        return inner


def prepare(argv: Sequence[str]) -> tuple[Prepared, str | None]:
    """Resolve, validate and (for a resume) compare the config; returns it and the export path. Writes nothing."""
    overrides = [a for a in argv if a.strip()]
    bad = [a for a in overrides if "=" not in a]
    if bad:
        raise ConfigError(f"argument {bad[0]!r} is not key=value\n{USAGE}")
    cwd = Path.cwd()
    export = next((a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "export"), None)
    overrides = absolute_overrides([a for a in overrides if a.split("=", 1)[0] != "export"], cwd)
    fresh, choices = compose_with_choices(overrides, CONFIG_NAME)
    run_dir, resuming = open_run_dir(fresh, cwd, "tune", "tuning run")
    store = RunStore(run_dir)
    manifest: dict[str, Any] = {}
    raw = fresh
    if resuming:
        manifest = stored_manifest(store)
        if manifest.get("kind") != TUNE_KIND:
            raise ConfigError(f"run_dir={run_dir} is not a meta.tune run (an ES search resumes with meta.run)")
        overrides = merge_overrides(manifest.get("overrides", []), overrides)
        raw, choices = compose_with_choices(overrides, CONFIG_NAME)
        raw.pop(NEW_KEY, None)
    absolute_paths(raw, cwd)
    # hub names -> staged local snapshots (fetched unless a dry run), as meta.run, before configs are compared
    stage_run(raw, manifest, resuming, fetch=not raw.get("dry_run"), hint=STAGE_HINT)
    if resuming:
        stored = stored_config(store)
        check_resume(stored, raw, STUDY_KEYS, run_dir, "study")
    manifest["overrides"] = merge_overrides([], overrides)
    raw["run_dir"] = run_dir
    raw["export"] = None
    cfg = build_tune_config(raw, CONF_DIR, lambda group, value: composed([*overrides, f"{group}={value}"], cwd))
    prepared = Prepared(cfg, raw, store, manifest, resuming, list(manifest["overrides"]), choices, cwd)
    return prepared, (absolute_path(export, cwd) if export else None)


def write_run_files(prepared: Prepared) -> dict[str, Any]:
    """config.yaml and manifest.json (run id, study, group choices, provenance), then study.json."""
    from results.store.study_store import JOURNAL, read_study_file, write_study_file

    store, manifest, cfg = prepared.store, prepared.manifest, prepared.cfg
    store.write_config(yaml.safe_dump(prepared.raw, sort_keys=True))
    if not prepared.resuming:
        run_id = uuid.uuid4().hex[:12]
        manifest.update({"kind": TUNE_KIND, "run_id": run_id, "created": _dt.datetime.now().isoformat(timespec="seconds"),
                         "seed": cfg.seed, "choices": prepared.choices, "cwd": str(prepared.cwd)})
    manifest.update({"config_hash": study_hash(prepared.raw), "code_version": code_version(CONF_DIR.parent),
                     "python": platform.python_version(), "host": platform.node()})
    store.write_manifest(manifest)
    if read_study_file(store.root) is None:
        write_study_file(store.root, {"storage": cfg.storage or JOURNAL,
                                      "study_name": cfg.study_name or f"tune_{manifest['run_id']}"})
    return manifest


def check_storage(prepared: Prepared) -> None:
    """Before anything is written: a database storage must open (and get Optuna's tables), and a new run's
    tune.study_name must not be taken there (the new run would otherwise resume into another run's study)."""
    import optuna

    from results.store.study_store import open_storage

    cfg = prepared.cfg
    if cfg.storage is None:
        return
    try:
        storage = open_storage(".", cfg.storage)
    except Exception as exc:  # SQLAlchemy's and the drivers' errors have no common base worth naming
        raise ConfigError(f"tune.storage={cfg.storage}: cannot open it ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''})") from None
    if not prepared.resuming and cfg.study_name in optuna.study.get_all_study_names(storage):
        raise ConfigError(f"tune.study_name={cfg.study_name}: the storage {cfg.storage} already holds a study of that "
                          "name; choose a new name, or resume the run dir that created it")


def open_study(prepared: Prepared) -> Any:
    """Create the study on a new run (refused if the storage already holds one of that name), load it on a resume."""
    import optuna

    from results.store.study_store import RUN_ID_ATTR, open_storage, read_study_file

    info = read_study_file(prepared.store.root)
    assert info is not None
    storage = open_storage(prepared.store.root, info["storage"])
    name = info["study_name"]
    run_id = prepared.manifest["run_id"]
    cfg = prepared.cfg
    sampler = build_sampler(cfg.sampler, cfg.sampler_options, cfg.seed)
    pruner = build_pruner(cfg.pruner, cfg.pruner_options)
    if name in optuna.study.get_all_study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        owner = study.user_attrs.get(RUN_ID_ATTR, run_id)
        if not prepared.resuming or owner != run_id:
            raise ConfigError(f"the study {name!r} in {info['storage']} belongs to run {owner}, not to this run "
                              f"({run_id}, {prepared.store.root}); its trials are not this run's to continue")
        return study
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=sampler, pruner=pruner)
    study.set_user_attr("run_dir", str(prepared.store.root))
    study.set_user_attr(RUN_ID_ATTR, run_id)
    study.set_user_attr("space", {d.key: [d.kind, *([d.low, d.high] if d.kind != "choice" else d.choices)]
                                  for d in cfg.dims})
    return study


def run(argv: Sequence[str]) -> int:
    from launch.factory import build_launcher
    from launch.runner import AbortRun
    from meta.search.lock import run_locked
    from meta.tune.export import ExportError, export_preset
    from meta.tune.plan import build_plan
    from meta.tune.tuner import Tuner

    prepared, export = prepare(argv)
    cfg = prepared.cfg
    logging.getLogger().setLevel(cfg.log_level)
    if cfg.dry_run:
        sys.stdout.write(build_plan(cfg, prepared.store.root, prepared.resuming) + "\n")
        return 0
    check_members_can_start(cfg.launcher)
    if export and prepared.resuming:
        from results.store.study_store import load_study

        try:
            path = export_preset(prepared.store.root, load_study(prepared.store.root), prepared.manifest["choices"],
                                 cfg.resources, export)
        except ExportError as exc:
            logger.error("%s", exc)
            return 1
        logger.info("wrote the best trial's settings to %s", path)
        return 0
    check_storage(prepared)
    prepared.manifest.update(check_job_namespace(prepared.raw, prepared.manifest))

    def body() -> int:
        manifest = write_run_files(prepared)
        study = open_study(prepared)
        launcher = build_launcher(cfg.launcher)
        logger.info("%s (run %s, study %s)", run_dir_label(prepared.store.root, prepared.resuming, "tuning run"),
                    manifest["run_id"], study.study_name)
        try:
            summary = Tuner(cfg, prepared.store.root, launcher, manifest["run_id"], study, prepared.trial_inner).run()
        except AbortRun as exc:
            logger.error("aborted: %s", exc)
            return 1
        finally:
            launcher.close()
        logger.info("trials: %s; member running time saved by pruning: about %.0f s",
                    ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())), summary.saved_member_s)
        if summary.best_number is None:
            logger.error("no trial completed; see the runs' result.json under %s", prepared.store.root)
            return 1
        logger.info("best trial %d: %.4f with %s", summary.best_number, summary.best_value, summary.best_params)
        if export:
            path = export_preset(prepared.store.root, study, manifest["choices"], cfg.resources, export)
            logger.info("wrote the best trial's settings to %s", path)
        return 0

    return run_locked(prepared.store.lock_path, body)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, USAGE, run, "config error")

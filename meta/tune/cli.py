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
import uuid
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from inner_loop.loss.divergences import divergences
from meta.search import recipe
from meta.search.config import CONF_DIR, INNER_NODES, ConfigError
from meta.search.resume import run_dir_label
from meta.search.staging import staged_inner
from meta.settings.schema import TuneSchema
from meta.tune.config import STUDY_KEYS, build_pruner, build_sampler, build_tune_config, study_hash, study_space
from core.config.groups import config_groups
from results.store.provenance import code_version

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


@dataclass
class Prepared(recipe.Prepared[TuneSchema]):
    """The validated run: the runner's setup, the config, and what a trial's composition starts from."""

    def trial_inner(self, overrides: Sequence[str]) -> dict[str, Any]:
        """A trial member's inner config: the run's composition with the trial's overrides, validated."""
        from launch.member import load_program

        raw = self.compose(overrides)
        # composed by hub name: the trial reads the snapshots the run staged and pinned before its first trial
        inner = self.cfg.member_inner({node: raw[node] for node in INNER_NODES})
        inner = staged_inner(self.cfg.inner.entrypoint, inner, self.manifest)
        load_program(self.cfg.inner.entrypoint).validate(inner)
        return inner


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
        write_study_file(store.root, {"storage": cfg.tune.storage or JOURNAL,
                                      "study_name": cfg.tune.study_name or f"tune_{manifest['run_id']}"})
    return manifest


def check_storage(prepared: Prepared) -> None:
    """Before anything is written: a database storage must open (and get Optuna's tables), and a new run's
    tune.study_name must not be taken there (the new run would otherwise resume into another run's study)."""
    import optuna

    from results.store.study_store import open_storage

    cfg = prepared.cfg
    if cfg.tune.storage is None:
        return
    try:
        storage = open_storage(".", cfg.tune.storage)
    except Exception as exc:  # SQLAlchemy's and the drivers' errors have no common base worth naming
        raise ConfigError(f"tune.storage={cfg.tune.storage}: cannot open it ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''})") from None
    if not prepared.resuming and cfg.tune.study_name in optuna.study.get_all_study_names(storage):
        raise ConfigError(f"tune.study_name={cfg.tune.study_name}: the storage {cfg.tune.storage} already holds a study of that "
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
    sampler = build_sampler(cfg.tune.sampler, cfg.tune.sampler_options, cfg.seed)
    pruner = build_pruner(cfg.tune.pruner, cfg.tune.pruner_options)
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
                                  for d in study_space(cfg)})
    return study


class TuneRecipe(recipe.Recipe):
    """What ``python -m meta.tune`` states to the runner (meta/search/recipe.py): an Optuna study of trials."""

    command = "meta.tune"
    usage = USAGE
    config_name = CONFIG_NAME
    kind = TUNE_KIND
    run_dir_prefix = "tune"
    noun = "tuning run"
    resume_noun = "study"
    resume_keys = STUDY_KEYS

    def other_kind(self, kind: str | None, run_dir: str) -> str:
        return f"run_dir={run_dir} is not a meta.tune run (an ES search resumes with meta.run)"

    def take_arguments(self, overrides: list[str]) -> tuple[list[str], str | None]:
        export = next((a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "export"), None)
        return [a for a in overrides if a.split("=", 1)[0] != "export"], export

    def take_settings(self, raw: dict[str, Any], export: str | None) -> str | None:
        raw["export"] = None
        return export

    def stage_options(self, raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
        return {"hint": STAGE_HINT}

    def build(self, setup: recipe.Setup) -> Prepared:
        cfg = build_tune_config(setup.raw, CONF_DIR, lambda group, value: setup.compose([f"{group}={value}"]))
        return setup.with_config(Prepared, cfg=cfg)

    def plan(self, prepared: Prepared) -> str:
        from meta.tune.plan import build_plan

        return build_plan(prepared.cfg, prepared.store.root, prepared.resuming)

    def before_lock(self, prepared: Prepared) -> int | None:
        from meta.tune.export import ExportError, export_preset

        if prepared.export and prepared.resuming:  # the best trial's settings of a run that exists: nothing runs
            from results.store.study_store import load_study

            try:
                path = export_preset(prepared.store.root, load_study(prepared.store.root),
                                     prepared.manifest["choices"], dataclasses.asdict(prepared.cfg.resources), prepared.export)
            except ExportError as exc:
                logger.error("%s", exc)
                return 1
            logger.info("wrote the best trial's settings to %s", path)
            return 0
        check_storage(prepared)
        return None

    def start(self, prepared: Prepared) -> Any:
        manifest = write_run_files(prepared)
        study = open_study(prepared)
        logger.info("%s (run %s, study %s)", run_dir_label(prepared.store.root, prepared.resuming, "tuning run"),
                    manifest["run_id"], study.study_name)
        return study

    def execute(self, prepared: Prepared, study: Any, launcher: Any) -> Any:
        from meta.tune.tuner import Tuner

        return Tuner(prepared.cfg, prepared.store.root, launcher, prepared.manifest["run_id"], study,
                     prepared.trial_inner).run()

    def finish(self, prepared: Prepared, study: Any, summary: Any) -> int:
        from meta.tune.export import export_preset

        logger.info("trials: %s; member running time saved by pruning: about %.0f s",
                    ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())), summary.saved_member_s)
        if summary.best_number is None:
            logger.error("no trial completed; see the runs' result.json under %s", prepared.store.root)
            return 1
        logger.info("best trial %d: %.4f with %s", summary.best_number, summary.best_value, summary.best_params)
        if prepared.export:
            path = export_preset(prepared.store.root, study, prepared.manifest["choices"], dataclasses.asdict(prepared.cfg.resources),
                                 prepared.export)
            logger.info("wrote the best trial's settings to %s", path)
        return 0


TUNE = recipe.register(TuneRecipe())


def main(argv: Sequence[str] | None = None) -> int:
    return recipe.main(TUNE, argv)

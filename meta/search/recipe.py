"""One runner for the programs that start or resume a run dir: ``python -m meta.run``, ``meta.pilot`` and ``meta.tune``.

Each of them composes its config with the command line, replays a resumed run's overrides and checks what the resume
changes, stages the members' hub repositories, validates, prints a dry run's plan, takes the run dir's lock and builds
(and closes) the launcher. The runner does these steps once, in one order, with one set of messages and exit codes
(0 done, 1 aborted, 2 bad config, 3 locked); a program states only what differs, as a :class:`Recipe`: its config's
name, the manifest kind of its run dir, what a resume may change, how it builds its config, what it plans and what it
runs.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, Sequence, TypeVar

from meta.cli_args import run_command
from meta.compose import compose_with_choices, merge_overrides
from meta.search.config import ConfigError, absolute_overrides, absolute_path, absolute_paths, check_members_can_start
from meta.search.lock import run_locked
from meta.search.resume import NEW_KEY, check_job_namespace, check_resume, open_run_dir
from meta.search.staging import stage_run
from meta.settings.upgrade import stored_config, stored_manifest
from results.store.run_store import RunStore

P = TypeVar("P", bound="Setup")
C = TypeVar("C")


@dataclass
class Setup:
    """What the runner composed and checked for a program, before the program builds its own config from ``raw``:
    the run's store and manifest (``manifest["overrides"]``: the command line it records and a resume replays)."""

    raw: dict[str, Any]
    store: RunStore
    manifest: dict[str, Any]
    resuming: bool
    #: the option Hydra chose in each config group
    choices: dict[str, str]
    cwd: Path
    #: an output path given on the command line that is no setting of the run (never recorded nor replayed)
    export: str | None
    config_name: str

    @property
    def overrides(self) -> list[str]:
        return list(self.manifest["overrides"])

    def compose(self, extra: Sequence[str] = ()) -> dict[str, Any]:
        """The run's composition with ``extra`` overrides after its own, paths made absolute (a tuned choice, a
        trial)."""
        raw, _ = compose_with_choices([*self.overrides, *extra], self.config_name)
        absolute_paths(raw, self.cwd)
        return raw

    def with_config(self, prepared: type[P], **extra: Any) -> P:
        """This setup as a program's prepared run (a subclass adding its config and what else it derives)."""
        return prepared(**{f.name: getattr(self, f.name) for f in fields(Setup)}, **extra)


@dataclass
class Prepared(Setup, Generic[C]):
    """A program's validated run: the setup and the program's config (``cfg``: log_level, dry_run, launcher)."""

    cfg: C


class Recipe:
    """What one program states; the runner (:func:`run`) does the rest. The defaults are the search's."""

    #: the program's name, its logger's and its command's (``python -m <command>``)
    command: str = ""
    usage: str = ""
    #: conf/<config_name>.yaml is composed
    config_name: str = "config"
    #: the manifest's ``kind`` of the program's run dir (an ES search's has none)
    kind: str | None = None
    #: a new run's default run dir: outputs/<run_dir_prefix>_<timestamp>
    run_dir_prefix: str = ""
    #: what the program starts, in its messages ("new <noun> in ...")
    noun: str = ""
    #: what a resume that changes ``resume_keys`` would start instead, in the refusal
    resume_noun: str = ""
    #: what the run computes: a resume refuses to change these keys
    resume_keys: Sequence[str] = ()

    def other_kind(self, kind: str | None, run_dir: str) -> str:
        """The refusal of a resume of a run dir that another program made (manifest kind ``kind``)."""
        raise NotImplementedError

    def take_arguments(self, overrides: list[str]) -> tuple[list[str], str | None]:
        """(the overrides, the export path) of a command line whose export argument is no setting of the run."""
        return overrides, None

    def take_settings(self, raw: dict[str, Any], export: str | None) -> str | None:
        """The export path, after the composed config says its own (which is then cleared: never recorded)."""
        return export

    def stage_options(self, raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
        """stage_run's keyword arguments besides the run's own (meta/search/staging.py)."""
        return {}

    def build(self, setup: Setup) -> Prepared:
        """The program's validated config from ``setup.raw``; ConfigError naming the key. Writes nothing."""
        raise NotImplementedError

    def check(self, prepared: Any) -> None:
        """Checks after the log level is set and before the dry run's plan."""

    def plan(self, prepared: Any) -> str:
        """The dry run's output: what would run and cost."""
        raise NotImplementedError

    def before_lock(self, prepared: Any) -> int | None:
        """Checks of a real run before the lock; an exit status ends the command there (nothing to run)."""
        return None

    def start(self, prepared: Any) -> Any:
        """Under the lock, before the launcher: the run files; what execute and finish read."""
        raise NotImplementedError

    def execute(self, prepared: Any, state: Any, launcher: Any) -> Any:
        """The runs, through ``launcher``; an exception of :meth:`aborts` ends the command with exit 1."""
        raise NotImplementedError

    def finish(self, prepared: Any, state: Any, outcome: Any) -> int:
        """After the launcher is closed: the outcome told, the exit status."""
        return 0

    def aborts(self) -> tuple[type[BaseException], ...]:
        from launch.runner import AbortRun

        return (AbortRun,)


#: every program the runner starts, by command
RECIPES: dict[str, Recipe] = {}


def register(recipe: Recipe) -> Recipe:
    RECIPES[recipe.command] = recipe
    return recipe


def prepare(recipe: Recipe, argv: Sequence[str]) -> Any:
    """Compose, resume (replay and compare), stage and build the program's config. Writes nothing."""
    overrides = [a for a in argv if a.strip()]
    bad = [a for a in overrides if "=" not in a]
    if bad:
        raise ConfigError(f"argument {bad[0]!r} is not key=value\n{recipe.usage}")
    cwd = Path.cwd()
    overrides, export = recipe.take_arguments(overrides)
    overrides = absolute_overrides(overrides, cwd)
    raw, choices = compose_with_choices(overrides, recipe.config_name)
    run_dir, resuming = open_run_dir(raw, cwd, recipe.run_dir_prefix, recipe.noun)
    store = RunStore(run_dir)
    manifest: dict[str, Any] = {}
    if resuming:
        manifest = stored_manifest(store)  # as every reader reads it: upgraded from its earlier layout
        if manifest.get("kind") != recipe.kind:
            raise ConfigError(recipe.other_kind(manifest.get("kind"), run_dir))
        overrides = merge_overrides(manifest.get("overrides", []), overrides)
        raw, choices = compose_with_choices(overrides, recipe.config_name)
        raw.pop(NEW_KEY, None)
    absolute_paths(raw, cwd)
    export = recipe.take_settings(raw, export)
    # hub names -> staged local snapshots (fetched unless a dry run), before anything reads data or compares configs
    stage_run(raw, manifest, resuming, fetch=not raw.get("dry_run"), **recipe.stage_options(raw, overrides))
    if resuming:
        stored = stored_config(store)
        check_resume(stored, raw, recipe.resume_keys, run_dir, recipe.resume_noun)
    manifest["overrides"] = merge_overrides([], overrides)
    raw["run_dir"] = run_dir
    return recipe.build(Setup(raw, store, manifest, resuming, choices, cwd,
                              absolute_path(export, cwd) if export else None, recipe.config_name))


def run(recipe: Recipe, argv: Sequence[str]) -> int:
    """The program's run: prepared, planned (dry run) or run under the run dir's lock through one launcher."""
    from launch.factory import build_launcher

    logger = logging.getLogger(recipe.command)
    prepared = prepare(recipe, argv)
    cfg = prepared.cfg
    logging.getLogger().setLevel(cfg.log_level)
    recipe.check(prepared)
    if cfg.dry_run:
        # The plan IS this command's output (for pipes and files), hence stdout rather than the log.
        sys.stdout.write(recipe.plan(prepared) + "\n")
        sys.stdout.flush()
        return 0
    check_members_can_start(cfg.launcher_node)
    done = recipe.before_lock(prepared)
    if done is not None:
        return done
    prepared.manifest.update(check_job_namespace(prepared.raw, prepared.manifest))

    def body() -> int:
        state = recipe.start(prepared)
        launcher = build_launcher(cfg.launcher_node)
        try:
            outcome = recipe.execute(prepared, state, launcher)
        except recipe.aborts() as exc:
            logger.error("aborted: %s", exc)
            return 1
        finally:
            launcher.close()
        return recipe.finish(prepared, state, outcome)

    return run_locked(prepared.store.lock_path, body)


def main(recipe: Recipe, argv: Sequence[str] | None = None) -> int:
    """The program's command line: help, logging and exit 2 on bad input (meta/cli_args.py), then :func:`run`."""
    return run_command(argv, recipe.usage, lambda args: run(recipe, args), "config error")

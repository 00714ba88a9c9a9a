"""One upgrade step for what an earlier version stored in a run dir, and the rule for when each part of it may go.

Why one: a search, pilot or tuning resumes, reports and exports long after it started, under code whose keys and
module paths moved on. Every reader of a run dir's config.yaml and manifest.json (meta.run, meta.pilot and meta.tune
on resume, meta.status, meta.export, meta.reevaluate, the pilot's findings and early cuts) reads them through
:func:`stored_config` and :func:`stored_manifest`, which apply :data:`CONFIG_STEPS` in order; none renames on its own.

The registry lists every way this version reads an earlier layout, each entry dated by the change (``since``, the day
its ``commit`` landed; a run created before that day stored the earlier layout):

- :data:`CONFIG_STEPS`, applied to a stored config (and its stored command line): a key renamed, a key added since
  (with the value that reproduces a run from before it), a schema's defaults filled in;
- :data:`STORED_NAMES`, the module paths and entry points that pickled jobs and stored ``inner.entrypoint`` values
  name: they must import at their old path, so they stay where Python looks for them (an alias module, a package's
  ``__getattr__``, results/store/__init__.py's ``MOVED`` table), listed here under the same rule;
- :data:`EARLIER_READERS`, the code that reads an earlier layout of a file other than the config (a searcher's
  state, a member table, a pilot's plan) where it is read.

The rule: an entry may go once no supported stored run needs it, that is once :data:`OLDEST_SUPPORTED_LAYOUT` (the
day of the oldest layout this version reads) is later than its ``since``. Raising OLDEST_SUPPORTED_LAYOUT is the
decision to stop reading older runs; a run created before it is refused naming the date (:func:`stored_manifest`),
and tests/test_meta/settings/test_stored_upgrade.py fails on every entry it made removable, so that none outlives its last reader.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from meta.settings.early_stop import EarlyStopConfig
from meta.searchers.radius import RADIUS_KEY
from core.config.dotted_keys import parent_of
from core.config.horizon import MEMBER_STEPS_KEY
from core.config.plain_data import plain
from results.store import MOVED

if TYPE_CHECKING:
    from results.store.run_store import RunStore

#: the day of the oldest stored layout this version reads (the first commit's: every run ever stored)
OLDEST_SUPPORTED_LAYOUT = "2026-11-22"
#: the root config a run dir's config.yaml was composed from, by its manifest's kind (none: a search)
ROOT_OF_KIND = {None: "config", "pilot": "config", "tune": "tune"}
#: both root configs (conf/config.yaml and conf/tune.yaml)
BOTH_ROOTS = ("config", "tune")


class UnsupportedLayout(ValueError):
    """A run dir stored before the oldest layout this version reads."""


@dataclass(frozen=True)
class Upgrade:
    """One change of what a run dir stores: the day it landed (``since``, ISO date), its commit and what it was."""

    since: str
    commit: str
    what: str

    def removable(self, oldest_supported: str | None = None) -> bool:
        """Whether no supported run needs this entry: every one (created on or after ``oldest_supported``, by default
        OLDEST_SUPPORTED_LAYOUT) was created after the day it landed."""
        return self.since < (oldest_supported or OLDEST_SUPPORTED_LAYOUT)


@dataclass(frozen=True)
class ConfigStep(Upgrade):
    """A step of the upgrade of a stored config; ``roots``: the root configs whose runs it applies to."""

    roots: tuple[str, ...] = BOTH_ROOTS
    #: whether the config hash reads the config after this step (a rename: the same search under today's name)
    renames: bool = False

    def apply(self, raw: dict[str, Any]) -> None:  # pragma: no cover (every step overrides it)
        raise NotImplementedError

    def apply_to_override(self, override: str) -> str:
        """A stored command-line override under today's names (unchanged unless the step renames a key)."""
        return override


@dataclass(frozen=True)
class AddedKey(ConfigStep):
    """A key added after runs existed, with the value that reproduces them: a config that lacks it gets it (inside
    its node where the node exists). The config hash drops the key where it holds this value (or null), so a run
    from before the key hashes as it did (meta/settings/keys.py)."""

    key: str = ""
    value: Any = None

    def apply(self, raw: dict[str, Any]) -> None:
        node, leaf = parent_of(raw, self.key)
        if node is not None:
            node.setdefault(leaf, copy.deepcopy(self.value))


#: the searchers' own keys for es.radius before it (pgpe, snes, cem: stdev_init; cmaes: sigma_init;
#: openai_es_elite, nres: sigma)
FORMER_RADIUS_KEYS = ("stdev_init", "sigma_init", "sigma")
#: the root key the presets set the radius through then (each es YAML read ``${oc.select:search_radius,0.01}``)
FORMER_ROOT_RADIUS_KEY = "search_radius"


@dataclass(frozen=True)
class RadiusRenamed(ConfigStep):
    """es.radius under a searcher's former key (or the former root ``search_radius``, the radius where the es node
    had none, as in a tuning's config), and a stored command line's override of either."""

    def apply(self, raw: dict[str, Any]) -> None:
        root_radius = raw.pop(FORMER_ROOT_RADIUS_KEY, None)
        es = raw.get("es")
        if isinstance(es, Mapping):
            es = dict(es)
            former = next((key for key in FORMER_RADIUS_KEYS if key in es), None)
            if RADIUS_KEY not in es and former is not None:
                es[RADIUS_KEY] = es.pop(former)
            elif RADIUS_KEY not in es and root_radius is not None:
                es[RADIUS_KEY] = root_radius
            raw["es"] = es
        elif root_radius is not None:
            raw["es"] = {RADIUS_KEY: root_radius}

    def apply_to_override(self, override: str) -> str:
        if former_radius_key(override) is None:
            return override
        key, sep, value = override.partition("=")
        prefix = key[: len(key) - len(key.lstrip("+~"))].replace("+", "")  # es.radius exists: set, never add
        return f"{prefix}es.{RADIUS_KEY}{sep}{value}"


def former_radius_key(override: str) -> str | None:
    """The former radius key an override sets (``es.stdev_init=0.1``, ``search_radius=0.1``, ``+es.sigma=...``)."""
    key = override.partition("=")[0].strip().lstrip("+~")
    if key == FORMER_ROOT_RADIUS_KEY or key in (f"es.{k}" for k in FORMER_RADIUS_KEYS):
        return key
    return None


@dataclass(frozen=True)
class DivergenceSchemaDefaults(ConfigStep):
    """A divergence node stored before its YAML composed on its config class (conf/divergence/none.yaml had no
    ``form``) with the fields it lacks at the class's defaults: the values it ran with. The hash reads the node as
    stored (a run hashes as it did when it started)."""

    def apply(self, raw: dict[str, Any]) -> None:
        from inner_loop.loss.divergences import divergences

        node = raw.get("divergence")
        entry = divergences().get(node.get("name")) if isinstance(node, dict) else None
        if entry is None or not dataclasses.is_dataclass(entry.config_class):
            return
        for f in dataclasses.fields(entry.config_class):
            if f.default is not dataclasses.MISSING:
                node.setdefault(f.name, f.default)


def schema_default(f: dataclasses.Field) -> Any:
    """A schema field's default value (a fresh one from its factory)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def searcher_schema(node: Any) -> type | None:
    """The settings class of the searcher an es node names (None: no node, or a name this Python does not know)."""
    from meta.searchers import searchers, settings_class_of

    cls = searchers().get(node.get("name")) if isinstance(node, dict) else None
    return settings_class_of(cls) if cls is not None else None


def model_schema(node: Any) -> type | None:
    """The model group's schema (ModelConfig) for a model node; None without one."""
    from inner_loop.config import ModelConfig

    return ModelConfig if isinstance(node, dict) else None


@dataclass(frozen=True)
class GroupSchemaDefaults(ConfigStep):
    """A group's node (``group``: es or model) stored before its YAML composed on its registry entry's schema
    (conf/es/pgpe.yaml had no ``optimizer_config``, conf/model/tiny.yaml no ``lora_alpha``) with the fields it lacks at
    the schema's defaults: the values it ran with. The keys every searcher has (es.radius, a former radius key's
    today; es.member_steps, an added key) are left to their own steps; a default that only composing fills (an
    interpolation) is not written."""

    group: str = ""

    def apply(self, raw: dict[str, Any]) -> None:
        from meta.searchers import composed_only
        from meta.searchers.base import SearcherSettings

        node = raw.get(self.group)
        schema = searcher_schema(node) if self.group == "es" else model_schema(node)
        if not isinstance(node, dict) or schema is None:
            return
        shared = {f.name for f in dataclasses.fields(SearcherSettings)} if self.group == "es" else set()
        for f in dataclasses.fields(schema):
            if f.name in shared or f.name in node:
                continue
            if f.default_factory is not dataclasses.MISSING or (f.default is not dataclasses.MISSING
                                                                 and not composed_only(f.default)):
                node[f.name] = schema_default(f)


#: the steps of the upgrade of a stored config, oldest first
CONFIG_STEPS: tuple[ConfigStep, ...] = (
    AddedKey("2026-11-25", "01f13bf", "seeds_per_member: a member on several seeds; runs before trained one",
             roots=("config",), key="seeds_per_member", value=1),
    AddedKey("2026-11-25", "a260f70", "early_stop: stopping clear losers; runs before ran with its defaults (off)",
             roots=("config",), key="early_stop", value=dataclasses.asdict(EarlyStopConfig())),
    AddedKey("2026-11-28", "2b536e0", f"es.{MEMBER_STEPS_KEY}: a member's own steps; runs before trained train.steps",
             roots=("config",), key=f"es.{MEMBER_STEPS_KEY}", value=None),
    RadiusRenamed("2026-11-28", "0544840", f"es.{RADIUS_KEY}: every searcher's one radius key, once stored under "
                  "each searcher's own name and the root search_radius", renames=True),
    AddedKey("2026-11-28", "6b519fa", "divergence.estimator: the learned map's YAML lacked it until its config class "
             "became its schema (it has no KL estimator: the value changes nothing)", key="divergence.estimator",
             value="k3"),
    DivergenceSchemaDefaults("2026-11-28", "6b519fa", "a divergence's YAML composed on its config class: a node "
                             "stored before lacks the fields it ran at their defaults"),
    GroupSchemaDefaults("2026-12-07", "24082d7", "a searcher's YAML composed on its settings class: an es node stored "
                        "before lacks the settings it ran at their defaults", roots=("config",), group="es"),
    GroupSchemaDefaults("2026-12-07", "03d604c", "a model's YAML composed on ModelConfig: a model node stored before "
                        "lacks the keys it ran at their defaults (the hash leaves them out there: "
                        "meta/settings/keys.py UNWRITTEN_MODEL_KEYS)", group="model"),
)

#: the search keys added after runs existed, with the value that reproduces those runs (what the config hash drops)
ADDED_SEARCH_KEYS: dict[str, Any] = {step.key: step.value for step in CONFIG_STEPS if isinstance(step, AddedKey)}


@dataclass(frozen=True)
class StoredName(Upgrade):
    """An old module path or entry point that stored runs name (a pickled job's class, ``inner.entrypoint``): it
    loads what ``new`` names; ``kept_by`` is the file that keeps it importable."""

    old: str = ""
    new: str = ""
    kept_by: str = ""


_MOVED_TO_CORE = "a module of results/store/ that moved to core/ (or into member_files): pickled jobs name it"
#: every old name a stored run may hold, oldest first
STORED_NAMES: tuple[StoredName, ...] = (
    StoredName("2026-11-24", "55ac7e8", "inner.entrypoint before the member entry module (the default then)",
               old="inner_loop.member:train_member", new="inner_loop.member.entry:program",
               kept_by="inner_loop/member/__init__.py"),
    StoredName("2026-11-25", "d04e34d", "the SLURM member's pickled class before launch/slurm/",
               old="launch.slurm_member:CheckpointableMember", new="launch.slurm.member:CheckpointableMember",
               kept_by="launch/slurm_member.py"),
    StoredName("2026-11-27", "59fcbf9", "inner.entrypoint before member/ became a package",
               old="inner_loop.member_entry:train_member", new="inner_loop.member.entry:program",
               kept_by="inner_loop/member_entry.py"),
    StoredName("2026-11-28", "9a95102", "the member program's name at the package door before the contract class",
               old="inner_loop:train_member", new="inner_loop.member.entry:program", kept_by="inner_loop/__init__.py"),
    StoredName("2026-11-28", "9a95102", "the entry function before the member program (a name of its program)",
               old="inner_loop.member.entry:train_member", new="inner_loop.member.entry:program",
               kept_by="inner_loop/member/entry.py"),
    StoredName("2026-11-28", "9a95102", "the synthetic objective's function before the member program",
               old="meta.synthetic:member", new="meta.synthetic:program", kept_by="meta/synthetic.py"),
    StoredName("2026-11-28", "9a95102", "the tuning's synthetic objective's function before the member program",
               old="meta.tune.synthetic:run", new="meta.tune.synthetic:program", kept_by="meta/tune/synthetic.py"),
    *(StoredName("2026-11-28", "dfe1202", _MOVED_TO_CORE, old=old, new=new, kept_by="results/store/__init__.py")
      for old, new in MOVED.items()),
)


@dataclass(frozen=True)
class EarlierReader(Upgrade):
    """Code that reads an earlier layout of a stored file other than the config, where that file is read
    (``where``: ``module:qualified name``)."""

    where: str = ""


#: the readers of earlier layouts of a run dir's other files, oldest first
EARLIER_READERS: tuple[EarlierReader, ...] = (
    EarlierReader("2026-11-23", "69dd128", "a cmaes state without its told populations: replayed and checked bit "
                  "for bit", where="meta.searchers.cmaes:CMAESSearcher.load_state_dict"),
    EarlierReader("2026-11-24", "0d99af8", "a cmaes state without told masks: every member was told",
                  where="meta.searchers.cmaes:CMAESSearcher.load_state_dict"),
    EarlierReader("2026-11-24", "0d99af8", "a pgpe state whose ranking said centered (before tie averaging)",
                  where="meta.searchers.pgpe:PGPESearcher.tell"),
    EarlierReader("2026-11-24", "d801302", "member rows without a role (before the control member): population "
                  "members", where="meta.search.after.reevaluate:choose_candidates"),
    EarlierReader("2026-11-26", "68de646", "a manifest without staged pins (before staging): left as it was",
                  where="meta.search.staging:stage_run"),
    EarlierReader("2026-12-06", "5aecdc6", "a pilot plan without the truncation check: none",
                  where="meta.pilot.cli:_check_plan"),
    EarlierReader("2026-12-06", "9b2c821", "an es=nres pilot config without es.update: every truncation moved the "
                  "centre", where="meta.pilot.findings:_truncation_settings"),
)

@dataclass(frozen=True)
class RetiredSetting(Upgrade):
    """A searcher's setting that a change of its algorithm retired (``key`` of ``es=<option>``): a search stored with
    it ran an update that no longer exists, so no step can upgrade it. Its typed read (meta/settings/schema.py) refuses
    it saying when and why, where it would otherwise read as a mistyped key."""

    option: str = ""
    key: str = ""


#: the settings a change of their searcher's algorithm retired, oldest first
RETIRED_SETTINGS: tuple[RetiredSetting, ...] = (
    RetiredSetting("2026-12-06", "61f9129", "es=nres moved its centre by Adam (es.center_learning_rate) after every "
                   "truncation; since, it moves it by each pair's whole-run difference (es.update, es.step_radii)",
                   option="nres", key="center_learning_rate"),
)


def retired_setting_refusal(es: Mapping[str, Any]) -> str | None:
    """Why an es node holding a retired setting of its searcher (a search stored before the change) cannot run under
    this version; None when it holds none."""
    for retired in RETIRED_SETTINGS:
        if es.get("name") == retired.option and retired.key in es:
            return (f"es.{retired.key} is a setting of es={retired.option} before {retired.since} (commit "
                    f"{retired.commit}): {retired.what}. A search stored with it cannot continue under this version: "
                    f"resume it with a checkout from before {retired.commit}, or start a new search")
    return None


#: every entry of the registry, each under the rule of the module docstring
REGISTRY: tuple[Upgrade, ...] = (*CONFIG_STEPS, *STORED_NAMES, *EARLIER_READERS, *RETIRED_SETTINGS)


def upgraded(raw: Mapping[str, Any], root: str = "config") -> dict[str, Any]:
    """A stored config (a run dir's config.yaml, composed from conf/<root>.yaml) as this version reads it: every
    step of CONFIG_STEPS for that root applied, in order, to a copy. A config of today's layout comes back equal."""
    out = copy.deepcopy(plain(dict(raw)))
    for step in CONFIG_STEPS:
        if root in step.roots:
            step.apply(out)
    return out


def renamed(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What the config hash reads of a config: the renaming steps applied (the same value under today's name);
    added keys and schema defaults left as stored, so that a run hashes as it did when it started."""
    out = dict(raw)
    for step in CONFIG_STEPS:
        if step.renames:
            step.apply(out)
    return out


def upgraded_overrides(overrides: Sequence[str]) -> list[str]:
    """A run's stored command line under today's key names (``es.stdev_init=0.1`` -> ``es.radius=0.1``)."""
    out = []
    for override in overrides:
        for step in CONFIG_STEPS:
            override = step.apply_to_override(override)
        out.append(override)
    return out


def refuse_former_names(overrides: Sequence[str]) -> None:
    """ValueError naming today's key for a new command line that sets a key under a name it had before (a stored
    command line comes upgraded: :func:`stored_manifest`)."""
    for override in overrides:
        key = former_radius_key(override)
        if key is not None:
            value = override.partition("=")[2]
            raise ValueError(f"{key} is now es.{RADIUS_KEY}, the one key of every searcher's search radius: set "
                             f"es.{RADIUS_KEY}={value or '0.01'} instead of {override.strip()}")


def check_supported(manifest: Mapping[str, Any], where: Any = "") -> None:
    """UnsupportedLayout when a run was created (manifest ``created``) before the oldest layout this version reads."""
    oldest_supported = OLDEST_SUPPORTED_LAYOUT
    created = str(manifest.get("created") or "")[:10]
    if created and created < oldest_supported:
        raise UnsupportedLayout(
            f"{where or 'the run'} was created on {created}, before {oldest_supported}, the oldest stored layout this "
            f"version reads (meta/settings/upgrade.py); resume or read it with a checkout from then "
            f"(its code_version: {manifest.get('code_version', 'unknown')})")


def stored_manifest(store: "RunStore") -> dict[str, Any]:
    """A run dir's manifest.json ({} where none) as this version reads it: its stored command line under today's
    key names; UnsupportedLayout for a run older than the oldest supported layout."""
    manifest = store.read_manifest()
    check_supported(manifest, store.root)
    if "overrides" in manifest:
        manifest["overrides"] = upgraded_overrides(manifest["overrides"])
    return manifest


def stored_config(store: "RunStore") -> dict[str, Any]:
    """A run dir's config.yaml as this version reads it ({} for an empty file): :func:`upgraded` for the root config
    its manifest's kind was composed from."""
    import yaml

    manifest = stored_manifest(store)
    return upgraded(yaml.safe_load(store.read_config_text()) or {}, ROOT_OF_KIND.get(manifest.get("kind"), "config"))

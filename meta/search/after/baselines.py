"""The rows of the result table: the exported init and the baselines it is compared with, each as a training run.

A baseline is only fair when it is trained like the searched init (same task, model, training settings, seeds)
and with its OWN regularization strength. So a row's divergence block is composed by Hydra from the run's own
command line with ``divergence=<name>`` and every ``divergence.*`` override dropped: a preset's or the user's
neural-map coefficient never reaches the KL row (its coefficient comes from ``coef_by_divergence.<name>`` when a
preset or the command line sets it, else from conf/divergence/<name>.yaml; the row records which).

Rows (``reevaluate.baselines`` picks the baselines; the exported init is always the first row):
  exported   NM-GRPO-ES: the init chosen on the selection seeds
  center     the search's starting centre (``init``), the map every member was a perturbation of
  nm_random  NM-GRPO: the authors' random map, parameters U(0, 0.01) drawn with seed 42, whatever the transform
  radius_random  maps drawn at the search's radius around its start as its first generation draws them, no
             selection: one per reporting seed (what a search's step buys before it has read any fitness)
  <divergence>  each divergence whose registry entry declares a baseline row (inner_loop/loss/divergences.py:
             kl, prob_l2, none and any added one), trained from its own conf/divergence/<name>.yaml, with its label
  base       the model before any RL step (train.steps = 0: scored untrained)

A baseline written ``<row>@<preset file>`` (``kl@kl_tuned.yaml``) is that row trained with the divergence and train
settings of a preset file (what ``meta.tune ... export=`` writes, or a YAML of overrides of those nodes): a tuned
KL, ProbL2 or starting map beside the search. The row names its file.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from meta.search.config import ConfigError, param_transform_of, search_center
from meta.settings.reevaluate import PRESET_MARK, UNTRAINED_BASELINE, baselines as known_baselines
from meta.settings.schema import SearchSchema
from results.report.search.result_table import ROLE_BASE, ROLE_COMPARED, ROLE_RADIUS, ROLE_START

EXPORTED = "exported"
RADIUS_RANDOM = "radius_random"
#: the purpose the radius_random row's searcher seeds are derived under: derive_seed(run seed, this, seed index)
RADIUS_RANDOM_PURPOSE = "radius_random"
#: the nodes a preset file may set for a row: what a tune tunes
PRESET_NODES = ("divergence", "train")
#: nodes a preset may carry but must agree with the search on: a row on another task or model compares nothing
PRESET_FIXED = ("task", "model")
#: the labels of the rows that are not a divergence's own (a divergence's row takes its registry entry's label)
_LABELS = {
    EXPORTED: "NM-GRPO-ES (exported init)",
    "center": "NM-GRPO-ES start (search centre)",
    "nm_random": "NM-GRPO (random init, seed 42)",
    RADIUS_RANDOM: "random maps at the search's radius (no selection)",
    UNTRAINED_BASELINE: "base model (no RL)",
}
#: rows that train the search's own divergence with a map
_MAP_ROWS = (EXPORTED, "center", "nm_random", RADIUS_RANDOM)
#: what each row that is not a divergence's is to the verdict below the table (a divergence's row: ROLE_COMPARED
#: when its entry says ``compared``; a row with a preset is a tuned row: ROLE_COMPARED)
_ROLES = {"center": ROLE_START, RADIUS_RANDOM: ROLE_RADIUS, UNTRAINED_BASELINE: ROLE_BASE}


def _divergence_rows() -> dict[str, Any]:
    """The divergences with a baseline row, by name (their registry entries)."""
    from inner_loop.loss.divergences import divergences

    return {name: entry for name, entry in divergences().items() if entry.baseline}


def row_label(name: str) -> str:
    """The label of a result-table row."""
    rows = _divergence_rows()
    return rows[name].label if name in rows else _LABELS[name]


def _roles() -> dict[str, str]:
    return {**_ROLES, **{name: ROLE_COMPARED for name, entry in _divergence_rows().items() if entry.compared}}


@dataclass(frozen=True)
class ReportRow:
    """One row to train on the reporting seeds: what it is, its resolved divergence and where its coefficient
    comes from, the map vector (None: no map), and the full inner config each of its runs gets.
    ``params_per_seed``: one map per reporting seed instead of one for all (the radius_random row)."""

    name: str
    label: str
    divergence: dict[str, Any]
    coef_source: str
    params: list[float] | None
    inner: dict[str, Any]
    params_per_seed: list[list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _drops(override: str, group: str) -> bool:
    key = _key(override)
    return key == group or key.startswith(group + ".")


@dataclass(frozen=True)
class Composed:
    """A config group set to one option under the run's overrides: the group's block, the whole resolved config,
    and the option Hydra chose in each group (the preset among them)."""

    block: dict[str, Any]
    raw: dict[str, Any]
    choices: dict[str, str]


def group_block(group: str, option: str, overrides: Sequence[str]) -> Composed:
    """Config group ``group`` set to ``option`` under the run's overrides with that group's own overrides dropped."""
    from meta.compose import compose_with_choices

    kept = [o for o in overrides if not _drops(o, group)]
    raw, choices = compose_with_choices([*kept, f"{group}={option}"])
    return Composed(dict(raw[group]), raw, choices)


@dataclass(frozen=True)
class Coef:
    """A divergence's coefficient and where it came from (the plan and the table show both)."""

    value: float | None
    source: str


def resolve_coef(composed: Composed, overrides: Sequence[str], *, own: bool = False) -> Coef:
    """The coefficient of ``composed``'s divergence and its source: ``divergence.coef`` on the command line (``own``:
    the run's own divergence, which keeps its ``divergence.*`` overrides), else ``coef_by_divergence.<name>`` as the
    command line or the preset Hydra composed sets it, else the registry's default_coef (or a number the
    divergence's own YAML writes)."""
    from inner_loop.loss.divergences import COEF_PRESETS, coef_key, divergence

    name, value = str(composed.block.get("name")), composed.block.get("coef")
    key = coef_key(name)
    if own and any(_key(o) == "divergence.coef" for o in overrides):
        return Coef(value, "divergence.coef (command line)")
    if any(_key(o) == key for o in overrides):
        return Coef(value, f"{key} (command line)")
    if name in (composed.raw.get(COEF_PRESETS) or {}):
        return Coef(value, f"{key} (experiment={composed.choices.get('experiment')})")
    if value == divergence(name).default_coef:
        return Coef(value, f"default_coef of divergence={name}")
    return Coef(value, f"conf/divergence/{name}.yaml")


def nm_random_vector(param_transform: str) -> list[float]:
    """The search vector of the authors' random map under ``param_transform``."""
    import torch

    from mirror_maps import AUTHORS_INIT_SEED, NeuralMirrorMap, vector_for_parameters

    params = NeuralMirrorMap.random_init(AUTHORS_INIT_SEED, param_transform="none", dtype=torch.float64).to_vector()
    return vector_for_parameters(params, param_transform).tolist()


def transfer_tasks(names: Sequence[str], overrides: Sequence[str]) -> list[dict[str, Any]]:
    """The ``extra_evaluations`` entries of a reporting run for the transfer tasks (each a conf/task/ group,
    composed under the run's overrides with its own task.* overrides dropped)."""
    entries = []
    for name in names:
        block = group_block("task", name, overrides).block
        entries.append({"name": f"transfer/{block.get('name', name)}", "task": block})
    return entries


def radius_random_vectors(cfg: SearchSchema, count: int) -> list[list[float]]:
    """``count`` maps drawn as the search's first generation draws them: map s is the first member that the search's
    own searcher (its es settings, so its radius key; its start centre) asks for generation 0 when seeded with
    derive_seed(run seed, RADIUS_RANDOM_PURPOSE, s). The vectors go through the search's ``param_transform`` in the
    member like any member's. No selection and no update: what a step of the search's size gives by itself."""
    from meta.searchers import build_searcher
    from core.seeding import derive_seed

    centre, es = search_center(cfg), cfg.searcher_settings
    return [build_searcher(es, centre, cfg.population, derive_seed(cfg.seed, RADIUS_RANDOM_PURPOSE, s))
            .ask(0)[0].tolist() for s in range(count)]


def split_baseline(entry: str) -> tuple[str, str | None]:
    """``kl@kl_tuned.yaml`` -> ("kl", "kl_tuned.yaml"); a plain name -> (name, None)."""
    name, mark, preset = entry.partition(PRESET_MARK)
    return name, (preset if mark else None)


def read_preset(path: str, name: str, cfg: SearchSchema) -> dict[str, dict[str, Any]]:
    """The ``divergence`` and ``train`` settings a preset file gives the ``name`` row. ConfigError when the file is
    missing or not YAML, sets nothing the row can use, names another divergence than the row's, or trains on
    another task or model than the search (the row would compare nothing)."""
    import yaml

    where = f"reevaluate.baselines: {name}{PRESET_MARK}{path}"
    try:
        body = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the preset file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not a YAML file ({str(exc).splitlines()[0]})") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: the file must be a mapping of config nodes (divergence: {{coef: ...}})")
    nodes = {node: body[node] for node in PRESET_NODES if node in body}
    if not nodes or not all(isinstance(v, dict) for v in nodes.values()):
        raise ConfigError(f"{where}: the file sets no {' or '.join(PRESET_NODES)} mapping for the row to train with")
    for node in PRESET_FIXED:
        given = body.get(node)
        if isinstance(given, dict) and given.get("name") != cfg.inner_config[node].get("name"):
            raise ConfigError(f"{where}: the preset trains {node} {given.get('name')!r}, the search "
                              f"{cfg.inner_config[node].get('name')!r}; a row must train on the search's {node}")
    return nodes


def _merged(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _apply_preset(row: ReportRow, path: str, cfg: SearchSchema) -> ReportRow:
    """The row trained with a preset file's settings; its name and label name the file."""
    nodes = read_preset(path, row.name, cfg)
    divergence = _merged(row.divergence, nodes.get("divergence", {}))
    if divergence.get("name") != row.divergence.get("name"):
        raise ConfigError(f"reevaluate.baselines: {row.name}{PRESET_MARK}{path}: the preset's divergence is "
                          f"{divergence.get('name')!r}, the row's {row.divergence.get('name')!r}")
    inner = copy.deepcopy(row.inner)
    inner["divergence"] = divergence
    inner["train"] = _merged(inner["train"], nodes.get("train", {}))
    return dataclasses.replace(row, name=f"{row.name}{PRESET_MARK}{path}",
                               label=f"{row.label}, tuned ({path})", divergence=dict(divergence),
                               coef_source=f"preset {path}", inner=inner)


def verdict_roles(baselines: Sequence[str]) -> dict[str, str]:
    """Baseline -> its role in the verdict, for the baselines the verdict speaks of (tuned rows included)."""
    roles, known = {}, _roles()
    for entry in baselines:
        name, preset = split_baseline(entry)
        if preset is not None or name in known:
            roles[entry] = ROLE_COMPARED if preset is not None else known[name]
    return roles


def unregularized() -> str:
    """The divergence with no term, as the registry declares it (the untrained model's row uses its block)."""
    from inner_loop.loss.divergences import unregularized as name

    return name()


def build_rows(cfg: SearchSchema, overrides: Sequence[str], exported_params: Sequence[float] | None,
               baselines: Sequence[str], transfer: Sequence[str], test: bool, seeds: int) -> list[ReportRow]:
    """Every row of the result table, the exported init first. ``exported_params`` None: a plan (dry run), where
    the exported init is not known yet. ``seeds``: the reporting seeds (the radius_random row draws one map each)."""
    search_block = dict(cfg.inner_config["divergence"])
    search_name = str(search_block.get("name"))
    composed = group_block("divergence", search_name, overrides)
    search = resolve_coef(dataclasses.replace(composed, block=search_block), overrides, own=True)
    extra = ([{"name": "test", "task": None}] if test else []) + transfer_tasks(transfer, overrides)
    base_inner = cfg.member_inner()
    if extra:
        base_inner["extra_evaluations"] = extra
    transform = param_transform_of(cfg.inner_config)
    rows = []
    group_rows = _divergence_rows()
    for entry in (EXPORTED, *baselines):
        name, preset = split_baseline(entry)
        inner = copy.deepcopy(base_inner)
        params: list[float] | None = None
        per_seed: list[list[float]] | None = None
        if name in group_rows:
            composed = group_block("divergence", name, overrides)
            block = composed.block
            source = resolve_coef(composed, overrides).source if group_rows[name].regularizes else "no regularizer"
        elif name == UNTRAINED_BASELINE:
            block, source = group_block("divergence", unregularized(), overrides).block, "no training"
            inner["train"] = {**inner["train"], "steps": 0}
        elif name in _MAP_ROWS:
            block, source = search_block, search.source
            if name == "center":
                params = search_center(cfg).tolist()
            elif name == "nm_random":
                params = nm_random_vector(transform)
            elif name == RADIUS_RANDOM:
                per_seed = radius_random_vectors(cfg, seeds)
            elif exported_params is not None:
                params = [float(x) for x in exported_params]
        else:
            raise ConfigError(f"reevaluate.baselines: {name!r} is not a baseline; known: "
                              f"{', '.join(known_baselines())}")
        inner["divergence"] = copy.deepcopy(block)
        row = ReportRow(name=name, label=row_label(name), divergence=dict(block), coef_source=source, params=params,
                        inner=inner, params_per_seed=per_seed)
        rows.append(_apply_preset(row, preset, cfg) if preset is not None else row)
    return rows

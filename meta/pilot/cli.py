"""``python -m meta.pilot [key=value ...]``: before a big spend, can a search at these settings see anything?

Takes the same overrides as meta.run. For every (radius, coef) combination of ``pilot.radii`` x ``pilot.coefs`` it
trains the search's starting centre c (meta/search/config.py ``search_center``) with k seeds and m antithetic pairs
c + e_i, c - e_i with e_i ~ N(0, radius^2 I), every init on the same k seeds (common random numbers), so a pair's
difference on seed s is paired. The directions e_i / radius are drawn once (from derive_seed(seed, "pilot", "direction", i)) and
shared by all combinations, so combinations are compared on the same directions too. meta/pilot/findings.py turns
the runs into the findings: the seed noise of one init and its binomial/training parts, the pairs' differences, the
signal-to-noise ratio of one generation's ES step at the configured population, how early intermediate scores rank
runs, and the smallest population / seeds per member / validation size that reach ``pilot.target_snr``. For an
online searcher (es=nres) every run is one of its particles' whole runs, validated every es.truncation_steps steps on
the whole validation set: the truncation check (meta/pilot/truncation.py) measures each phase's signal and noise and
recommends nres's population, truncation length and step.

The runs go through the search's launchers, lock, records and resume: a pilot has its own run dir (manifest kind
"pilot"); the plan (pilot_plan.json) is written before any submission, jobs.json after each, and
``run_dir=<pilot dir>`` resumes it without retraining a finished run. A resume refuses changes to what the runs compute
(seed, init, es, the inner config, pilot.seeds/pairs/radii/coefs); population, seeds_per_member, generations and
pilot.target_snr only change the conclusions and may change. ``pilot.export=<file>`` writes the recommendation as a
preset YAML.
``dry_run=true`` prints the plan and writes nothing.
Exit status: 0 done, 1 aborted (too many failed runs, launcher gave up) or nothing to export, 2 bad input, 3 locked.
"""
from __future__ import annotations

import copy
import logging
import math
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from inner_loop.loss.divergences import coef_key
from meta.search import recipe
from meta.search.config import (INNER_NODES, SEARCH_KEYS, ConfigError, build_search_config, check_member_launch,
                                member_sharing, search_center)
from meta.search.resume import run_dir_label
from meta.pilot.findings import CENTRE, FULL_HORIZON, PLUS, horizon_index, map_roles, member_index
from meta.pilot.truncation import STEP_KEY, TRUNCATION_KEY, WHOLE_VALIDATION, boundaries
from results.report.pilot import PILOT_KIND
from meta.searchers.radius import RADIUS_KEY
from meta.settings.schema import PilotConfig, SearchSchema, typed_config
from results.store.layout import JOBS_FILE, LAUNCHER_DIR, member_dir_name
from core.records import MemberSpec

logger = logging.getLogger("meta.pilot")

#: search keys that only enter the SNR and the recommendation (recomputed on resume), not the pilot's runs
CONCLUSION_KEYS = ("population", "seeds_per_member")
#: keys that change what the pilot's runs compute: a resume refuses to change them
PILOT_KEYS = (*(k for k in SEARCH_KEYS if k not in CONCLUSION_KEYS), "pilot.seeds", "pilot.pairs", "pilot.radii",
              "pilot.coefs")
#: the ``generation`` the pilot's runs carry (job names, logs); a pilot dir has no generations of its own
PILOT_GENERATION = 0
EXPORT_KEY = "pilot.export"

USAGE = """usage: python -m meta.pilot [key=value ...]

Before a search: train the starting centre with pilot.seeds seeds and pilot.pairs antithetic pairs around it, for
every (radius, coef) in pilot.radii x pilot.coefs, and report the seed noise, the signal-to-noise ratio of one ES
generation and the population that reaches pilot.target_snr. Takes meta.run's overrides (experiment=, es=, launcher=,
population=, ...) plus pilot.seeds, pilot.pairs, pilot.radii=[..], pilot.coefs=[..], pilot.target_snr,
pilot.export=<preset.yaml>, run_dir= (resume), dry_run=true. See meta/settings/schema.py (PilotConfig) and docs/pilot.md."""


class ExportError(RuntimeError):
    """Nothing to export (no combination showed signal), or a different file is in the way."""


def _numbers(key: str, value: list[float] | None, positive: bool) -> list[float] | None:
    """A scan list (pilot.radii, pilot.coefs; the schema made its items numbers): not empty, each finite and above 0
    (``positive``) or >= 0, no value twice."""
    if value is None:
        return None
    bound = "above 0" if positive else ">= 0"
    if not value:
        raise ConfigError(f"{key}=[] is empty: give a list such as {key}=[0.5,1.0], or null")
    for item in value:
        if not math.isfinite(item) or (item <= 0 if positive else item < 0):
            raise ConfigError(f"{key}={value!r}: every value must be a finite number {bound}, got {item!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{key}={value!r} repeats a value: each would be the same combination twice")
    return list(value)


def build_pilot_config(raw: Mapping[str, Any]) -> PilotConfig:
    """The ``pilot:`` node read through its schema (meta/settings/schema.py: types, defaults, ranges, unknown keys
    refused), plus what one key cannot say; ConfigError naming the key."""
    node = raw.get("pilot")
    if node is not None and not isinstance(node, Mapping):
        raise ConfigError(f"pilot={node!r} must be a mapping (its keys: meta/settings/schema.py PilotConfig)")
    pilot = typed_config(PilotConfig, node or {}, "pilot")
    if not 0 < pilot.target_snr < math.inf:
        raise ConfigError(f"pilot.target_snr={pilot.target_snr!r} must be a number above 0")
    return dataclasses.replace(pilot, radii=_numbers("pilot.radii", pilot.radii, positive=True),
                               coefs=_numbers("pilot.coefs", pilot.coefs, positive=False))


def combinations(cfg: SearchSchema, pilot: PilotConfig) -> list[dict[str, float | None]]:
    """Every (radius, coef) the pilot scans, radius-major; ConfigError when a default is missing or unusable."""
    radii = pilot.radii
    if radii is None:
        value = cfg.searcher_settings.get(RADIUS_KEY)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"es.{RADIUS_KEY}={value!r} is the pilot's radius (pilot.radii=null) and must be a "
                              "number above 0; or set pilot.radii=[...]")
        radii = (float(value),)
    divergence = cfg.inner_config["divergence"]
    if pilot.coefs is not None and "coef" not in divergence:
        raise ConfigError(f"pilot.coefs: divergence={divergence.get('name')} has no coef to scan; set pilot.coefs=null")
    coefs = pilot.coefs if pilot.coefs is not None else (divergence.get("coef"),)
    return [{"radius": r, "coef": None if c is None else float(c)} for r in radii for c in coefs]


def _inner(cfg: SearchSchema, coef: float | None, full: bool = False) -> dict[str, Any]:
    """A pilot run's inner config: a search member's (es.member_steps), or with ``full`` the horizon check's twin at
    train.steps."""
    inner = copy.deepcopy(cfg.member_inner() if full else cfg.search_member_inner())
    if coef is not None:
        inner["divergence"]["coef"] = coef
    return inner


@dataclass
class Prepared(recipe.Prepared[SearchSchema]):
    """The validated pilot: the runner's setup, the search config it speaks for, its own settings and combinations."""

    pilot: PilotConfig
    combinations: list[dict[str, float | None]]


def _split_export(overrides: Sequence[str]) -> tuple[list[str], str | None]:
    """pilot.export is not a setting of the runs: taken off the overrides (never recorded, never replayed)."""
    kept, export = [], None
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == EXPORT_KEY:
            export = None if value.strip() in ("", "null", "None") else value
        else:
            kept.append(override)
    return kept, export


def build(setup: recipe.Setup) -> Prepared:
    """The search config the pilot speaks for, its own settings and combinations, each checked before anything
    runs; ConfigError naming the key."""
    raw = setup.raw
    cfg = build_search_config(raw)
    pilot = build_pilot_config(raw)
    combos = combinations(cfg, pilot)
    _check_truncation(cfg)
    if pilot.coefs is not None:  # each scanned coef must be a valid run config, checked before anything runs
        for coef in pilot.coefs:
            check_member_launch(raw, cfg.launcher_node, cfg.inner.timeout_s, cfg.inner.entrypoint, _inner(cfg, coef),
                                cfg.resources_node, where=f" (pilot.coefs: divergence.coef={coef:g})")
    return setup.with_config(Prepared, cfg=cfg, pilot=pilot, combinations=combos)


# ------------------------------------------------------------------ the truncation check
def truncation_design(cfg: SearchSchema) -> dict[str, int] | None:
    """For an online searcher (es=nres), the truncation check's design: T (es.truncation_steps, the searcher's own
    reading of it), the runs' steps and the train.eval_subset that validates the whole validation set; None for a
    searcher of whole runs."""
    if not cfg.searcher_online:
        return None
    from meta.searchers.nres import truncation_length

    val_size = cfg.inner_config["train"].get("val_size")
    steps = truncation_length(cfg.full_steps, cfg.searcher_settings.get(TRUNCATION_KEY))
    return {"steps": steps, "horizon": cfg.full_steps,
            "eval_subset": int(val_size) if val_size else WHOLE_VALIDATION}


def _check_truncation(cfg: SearchSchema) -> None:
    """What the truncation check needs of the config: no other intermediate validation, and the step it scales."""
    design = truncation_design(cfg)
    if design is None:
        return
    name, every = cfg.es.name, cfg.inner_config["train"].get("eval_every")
    if every is not None and int(every) != design["steps"]:
        raise ConfigError(f"train.eval_every={every}: with es={name} the pilot validates its runs every "
                          f"es.{TRUNCATION_KEY}={design['steps']} steps on the whole validation set (the truncation "
                          f"check, docs/pilot.md); set train.eval_every=null")
    if STEP_KEY not in cfg.searcher_settings:
        raise ConfigError(f"es.{STEP_KEY} is not in the es={name} config (conf/es/{name}.yaml): the truncation check "
                          f"recommends that step (meta/pilot/truncation.py STEP_KEY names it)")


# ------------------------------------------------------------------ the plan and the runs
def runs_per_combination(pilot: PilotConfig) -> int:
    """k centre runs + 2 m k pair runs."""
    return pilot.seeds * (1 + 2 * pilot.pairs)


def make_plan(prepared: Prepared) -> dict[str, Any]:
    """Centre, directions, seeds, combinations and every run's role and work dir: the pilot's fixed design."""
    import torch

    from meta.search.init import VECTOR_LENGTH
    from core.seeding import generator, member_seed

    cfg, pilot, store = prepared.cfg, prepared.pilot, prepared.store
    centre = search_center(cfg).to(torch.float64)
    directions = [torch.randn(VECTOR_LENGTH, generator=generator(cfg.seed, "pilot", "direction", i),
                              dtype=torch.float64).tolist() for i in range(pilot.pairs)]
    members = []
    main = len(prepared.combinations) * runs_per_combination(pilot)
    horizon = has_horizon_check(cfg)
    for j in range(len(prepared.combinations)):
        for role, pair in map_roles(pilot.pairs):
            for s in range(pilot.seeds):
                index = member_index(j, role, pair, s, pilot.seeds, pilot.pairs)
                members.append({"index": index, "combination": j, "role": role, "pair": pair, "seed_index": s,
                                "work_dir": str(store.pilot_runs_dir / member_dir_name(index))})
                if horizon and j == 0:  # its twin at train.steps, for the horizon check
                    twin = horizon_index(role, pair, s, pilot.seeds, pilot.pairs, main)
                    members.append({"index": twin, "combination": 0, "role": role, "pair": pair, "seed_index": s,
                                    "horizon": FULL_HORIZON,
                                    "work_dir": str(store.pilot_runs_dir / member_dir_name(twin))})
    return {
        "seed": cfg.seed, "init": cfg.init, "es": cfg.es.name, "radius_key": RADIUS_KEY,
        "seeds": [member_seed(cfg.seed, "pilot", "seed", s) for s in range(pilot.seeds)],
        "centre": centre.tolist(), "directions": directions, "combinations": prepared.combinations,
        "members": sorted(members, key=lambda m: m["index"]),
        "horizon": {"member_steps": cfg.member_steps, "steps": cfg.full_steps} if horizon else None,
        "truncation": truncation_design(cfg),
    }


def has_horizon_check(cfg: SearchSchema) -> bool:
    """Whether the pilot checks the members' horizon: they train es.member_steps, fewer than train.steps."""
    return cfg.member_steps < cfg.full_steps


def _check_plan(plan: Mapping[str, Any], prepared: Prepared) -> None:
    """A stored plan must be the one these settings make (it is, unless it was written by other code)."""
    want = (prepared.pilot.seeds, prepared.pilot.pairs, prepared.combinations, has_horizon_check(prepared.cfg),
            truncation_design(prepared.cfg) if "truncation" in plan else None)  # a plan from before the check: none
    have = (len(plan["seeds"]), len(plan["directions"]), plan["combinations"], bool(plan.get("horizon")),
            plan.get("truncation"))
    if have != want:
        raise ConfigError(f"{prepared.store.pilot_plan_path} was made for seeds/pairs/combinations {have}, not "
                          f"{want}; start a new pilot with another run_dir")


def member_specs(plan: Mapping[str, Any], cfg: SearchSchema, run_id: str) -> list[MemberSpec]:
    """One spec per run of the plan: its combination's coef, its params (c, c + radius z_i or c - radius z_i) and
    its seed (the same seed list for every init)."""
    centre = plan["centre"]
    inners = [_inner(cfg, c["coef"]) for c in plan["combinations"]]
    full = _inner(cfg, plan["combinations"][0]["coef"], full=True)  # the horizon check's runs
    truncation = plan.get("truncation")
    if truncation:  # validated every T steps on the whole validation set: the truncation check's scores
        for inner in inners:
            inner["train"].update(eval_every=int(truncation["steps"]), eval_subset=int(truncation["eval_subset"]))
    specs = []
    for m in plan["members"]:
        combo = plan["combinations"][m["combination"]]
        if m["role"] == CENTRE:
            params = list(centre)
        else:
            step = combo["radius"] * (1.0 if m["role"] == PLUS else -1.0)
            params = [c + step * z for c, z in zip(centre, plan["directions"][m["pair"]])]
        specs.append(MemberSpec(run_id=run_id, generation=PILOT_GENERATION, index=m["index"],
                                seed=plan["seeds"][m["seed_index"]], params=params, work_dir=m["work_dir"],
                                inner=copy.deepcopy(full if m.get("horizon") else inners[m["combination"]])))
    return specs


#: seconds between two writings of an unfinished pilot's findings (pilot.json) as its runs become final
PARTIAL_FINDINGS_EVERY_S = 60.0


def run_members(prepared: Prepared, specs: list[MemberSpec], launcher: Any) -> None:
    """Every run to a final record through one runner (resumable: jobs.json after each submission), pilot.json
    rewritten with the findings so far as runs become final, at most every PARTIAL_FINDINGS_EVERY_S (what the report
    of an unfinished pilot shows); AbortRun
    when more than max_failed_fraction of the runs failed."""
    from launch.factory import runner_policy
    from launch.runner import MemberArrayRunner
    from meta.pilot.findings import summarize_run_dir
    from results.store.run_store import read_jobs_file, write_jobs_file

    cfg, folder = prepared.cfg, prepared.store.pilot_runs_dir
    folder.mkdir(parents=True, exist_ok=True)
    jobs_path = folder / JOBS_FILE

    def abort(final: Mapping[int, Any]) -> str | None:
        failed = [i for i, r in final.items() if not r.ok]
        if len(failed) <= cfg.max_failed_fraction * len(specs):
            return None
        last = final[failed[-1]]
        return (f"{len(failed)} of {len(specs)} pilot runs failed, more than max_failed_fraction="
                f"{cfg.max_failed_fraction}; last failure (run {failed[-1]}, {last.status}): "
                f"{last.error.strip()[-500:]}"
                f"\nFix the cause, then resume with `python -m meta.pilot run_dir={prepared.store.root}`")

    last_written = [float("-inf")]

    def on_final(spec: MemberSpec, record: Any, progress: Any) -> None:
        logger.info("pilot run %03d (seed %d): %s %s (%d/%d)", spec.index, spec.seed, record.status,
                    f"{record.fitness:.4f}" if record.ok else record.error.strip()[-160:], progress.done,
                    progress.total)
        # the findings so far, for the report of an unfinished pilot: each writing reads every result and recomputes
        # every statistic, so runs that end together (short members, a resumed batch) write them once a while; the
        # caller writes the complete findings when the last run is final
        if time.monotonic() - last_written[0] >= PARTIAL_FINDINGS_EVERY_S:
            prepared.store.write_pilot(summarize_run_dir(prepared.store.root))
            last_written[0] = time.monotonic()

    MemberArrayRunner(
        launcher=launcher, entrypoint=cfg.inner.entrypoint, specs=specs, jobs=read_jobs_file(jobs_path),
        save_jobs=lambda jobs: write_jobs_file(jobs_path, jobs), launcher_folder=folder / LAUNCHER_DIR,
        policy=runner_policy(cfg.retries, cfg.inner.timeout_s, cfg.launcher_node), should_abort=abort,
        on_final=on_final,
    ).run()


# ------------------------------------------------------------------ dry run
def build_dry_run_plan(prepared: Prepared) -> str:
    """What the pilot would run and cost, from the validated config alone: nothing is read from a scheduler."""
    from results.store.member_files import read_result

    cfg, pilot, raw = prepared.cfg, prepared.pilot, prepared.raw
    k, m = pilot.seeds, pilot.pairs
    combos = prepared.combinations
    runs = len(combos) * runs_per_combination(pilot)
    alone_min = cfg.run_alone_min(cfg.member_steps)  # a pilot run trains es.member_steps (es=nres: whole runs)
    sharing = member_sharing(raw)
    minutes = sharing.member_time(alone_min)
    gpus, cpus = int(cfg.resources.gpus or 0), int(cfg.resources.cpus or 1)
    hours = runs * minutes / 60.0
    per_member = raw.get("seeds_per_member")
    finished = ""
    plan = prepared.store.read_pilot_plan() if prepared.resuming else None
    if plan is not None:
        done = sum(1 for mem in plan["members"] if read_result(mem["work_dir"]) is not None)
        finished = f" (resume: {done} of {runs} runs already final, never trained again)"
    lines = [
        f"DRY RUN (meta.pilot): nothing is submitted or written. {run_dir_label(cfg.run_dir or '', prepared.resuming, 'pilot')}"
        f"{finished}",
        f"centre: init={cfg.init}, seed={cfg.seed}; k={k} seeds per init (the same for every init), m={m} antithetic "
        f"pairs c +- e_i, e_i ~ N(0, radius^2 I), directions shared by every combination",
        f"radius: es.{RADIUS_KEY} of es={cfg.es.name}"
        + ("" if pilot.radii is None else " (scanned: pilot.radii)")
        + f"; coef: divergence.coef of divergence={cfg.inner_config['divergence'].get('name')}"
        + ("" if pilot.coefs is None else " (scanned: pilot.coefs)"),
        f"combinations (radius x coef): {len(combos)}",
        *(f"  {j}: radius {c['radius']:g}, coef {'n/a' if c['coef'] is None else format(c['coef'], 'g')}"
          for j, c in enumerate(combos)),
        f"training runs: {len(combos)} combination(s) x (k + 2 m k) = {len(combos)} x ({k} + 2 x {m} x {k}) = {runs}",
        f"each run: ~{round(minutes, 1):g} min ("
        + ("resources.member_time_min" if cfg.member_steps == cfg.full_steps else
           f"a search member of es.member_steps={cfg.member_steps} steps")
        + (f" {alone_min:g} x slowdown {sharing.slowdown:g}" if sharing.shared else "") + f"), {gpus} GPU, {cpus} "
        f"CPU; launcher="
        f"{cfg.launcher.name}, retries={cfg.retries}, limit inner.timeout_s={cfg.inner.timeout_s:g} s",
        f"GPU-hours: {runs} runs x {sharing.hours_text(alone_min / 60, gpus)} = "
        f"{sharing.gpu_hours(runs, alone_min / 60, gpus):,.2f} GPU-h",
        *sharing.plan_lines(runs, "pilot array"),
        f"CPU-hours: {runs} runs x {minutes / 60:.2f} h x {cpus} CPU = {hours * cpus:,.2f} CPU-h",
        f"then: SNR of one generation's ES step at population={cfg.population}, seeds_per_member="
        + (f"{per_member}" if per_member is not None else "1 (not a setting of this config)")
        + f"; recommendation for pilot.target_snr={pilot.target_snr:g} over generations={cfg.generations}",
        *horizon_plan_lines(cfg, pilot, sharing, gpus, cpus),
        *truncation_plan_lines(cfg, runs),
        "early intermediate vs final ranks: " + (f"measured (train.eval_every={raw['train'].get('eval_every')})"
                                                if raw["train"].get("eval_every") else
                                                "measured (the truncation check's validations)"
                                                if truncation_design(cfg) else
                                                "not measured (train.eval_every is null)"),
    ]
    if prepared.export:
        lines.append(f"export: the recommendation as a preset to {prepared.export}")
    return "\n".join(lines)


def horizon_plan_lines(cfg: SearchSchema, pilot: PilotConfig, sharing: Any, gpus: int, cpus: int) -> list[str]:
    """The dry run's lines on the horizon check: its runs and their cost, or why there is none."""
    if not has_horizon_check(cfg):
        return [f"horizon check: none (members train train.steps={cfg.full_steps}; with es.member_steps=T below it the "
                "pilot checks whether T-step members rank maps as full runs do)"]
    runs = runs_per_combination(pilot)
    full_h = cfg.member_alone_min / 60.0
    return [f"horizon check: the first combination's {1 + 2 * pilot.pairs} maps x {pilot.seeds} seeds again at "
            f"train.steps={cfg.full_steps} (the runs above train es.member_steps={cfg.member_steps}): {runs} runs x "
            + (f"{sharing.hours_text(full_h, gpus)} = {sharing.gpu_hours(runs, full_h, gpus):,.2f} GPU-h" if gpus else
               f"{sharing.member_time(full_h):.2f} h x {cpus} CPU = {runs * sharing.member_time(full_h) * cpus:,.2f} "
               "CPU-h")
            + "; then the Spearman rank correlation of the maps at the two horizons, its bootstrap interval and a "
            "verdict (docs/pilot.md \"The horizon check\")"]


def truncation_plan_lines(cfg: SearchSchema, runs: int) -> list[str]:
    """The dry run's line on the truncation check: its extra validations ([] for a searcher of whole runs)."""
    design = truncation_design(cfg)
    if design is None:
        return []
    name, every, steps = cfg.es.name, design["steps"], design["horizon"]
    extra = len(boundaries(steps, every)) - 1
    val_size = cfg.inner_config["train"].get("val_size")
    problems = f"train.val_size={val_size}" if val_size else "train.val_size=null: every validation problem"
    return [f"truncation check (es={name}): every run is validated every es.{TRUNCATION_KEY}={every} of its "
            f"train.steps={steps} steps on the whole validation set ({problems}) besides its final validation: "
            f"{extra} per run x {runs} runs = {extra * runs} extra validations, whose time the hours above leave out "
            "(resources.member_time_min prices one validation per run); then per phase the pairs' differences, the "
            f"SNR per update and per episode, and the population, es.{TRUNCATION_KEY} and es.{STEP_KEY} for "
            f"es={name} (docs/pilot.md \"The truncation check\")"]


# ------------------------------------------------------------------ export
def preset_key(group: str, choice: str | None, leaf: str) -> str:
    """The dotted key a preset sets to change ``group.leaf``: ``group.leaf`` itself, but for a divergence's
    coefficient the key the divergence registry names (``coef_by_divergence.<name>``)."""
    if group == "divergence" and leaf == "coef" and choice is not None:
        return coef_key(str(choice))
    return f"{group}.{leaf}"


def _set_value(body: dict[str, Any], group: str, choice: str | None, leaf: str, value: Any) -> None:
    """Set ``group.leaf`` in a preset body where the presets' convention wants it (see preset_key)."""
    key = preset_key(group, choice, leaf)
    if key != f"{group}.{leaf}":
        body[group].pop(leaf, None)  # a value written into the node would shadow the key it selects from
    *parents, last = key.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def preset_text(summary: Mapping[str, Any], raw: Mapping[str, Any], choices: Mapping[str, str]) -> str:
    """The recommendation as a self-contained preset of conf/experiment/ style: the pilot's config groups and inner
    nodes, the best combination's radius and coef, and the smallest population that reached the target SNR."""
    rec = summary["recommendation"]
    if not rec["reachable"]:
        raise ExportError(f"nothing to export: {rec['reason']}")
    nres = rec.get("nres")
    if nres is not None and not nres["visible"]:
        raise ExportError(f"nothing to export for es={summary['es']}: {nres['reason']}")
    groups = [g for g in (*INNER_NODES, "es") if g in choices]
    body: dict[str, Any] = {"defaults": [{f"override /{g}": choices[g]} for g in groups]}
    for node in INNER_NODES:
        body[node] = copy.deepcopy(dict(raw[node]))
    body["train"]["eval_every"] = None
    body["es"] = copy.deepcopy(dict(raw["es"]))
    if rec["coef"] is not None:
        _set_value(body, "divergence", choices.get("divergence"), "coef", rec["coef"])
    _set_value(body, "es", choices.get("es"), RADIUS_KEY, rec["radius"])  # a pilot's from before es.radius too
    body["population"] = rec["population"]
    if nres is not None:  # the truncation check's population, truncation length and step
        body["population"] = nres["population"]
        _set_value(body, "es", choices.get("es"), TRUNCATION_KEY, nres["truncation_steps"])
        if nres["step"] is not None:
            _set_value(body, "es", choices.get("es"), STEP_KEY, nres["step"])
    body["generations"] = int(raw["generations"])
    body["resources"] = dict(raw["resources"])
    snr = ("unbounded (no seed noise)" if rec["noise_free"] else
           f"{rec['snr']:.3g} at population {summary['population']}")
    header = [
        "# @package _global_",
        f"# Exported by python -m meta.pilot from {summary['run_dir']} (run {summary['run_id']}): combination "
        f"{rec['combination']} of {len(summary['combinations'])},",
        f"# radius es.{RADIUS_KEY}={rec['radius']:g}, divergence.coef={rec['coef']}, SNR of one generation "
        f"{snr}; population {rec['population']} reaches the target SNR {rec['target_snr']:g}",
        f"# with {summary['seeds_per_member']} seed(s) per member (k={summary['seeds']} seeds, m={summary['pairs']} "
        "pairs: an estimate, see docs/pilot.md). Intermediate validation (train.eval_every) is off.",
        *([f"# es={summary['es']}: population {nres['population']}, es.{TRUNCATION_KEY}={nres['truncation_steps']}, "
           f"es.{STEP_KEY}={nres['step']:.3g} from the truncation check"]
          if nres is not None and nres["step"] is not None else []),
        "# Use: save as conf/experiment/<name>.yaml, then python -m meta.run experiment=<name>",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


def export_preset(summary: Mapping[str, Any], prepared: Prepared, out: str | Path) -> Path:
    """Write the preset to ``out``; a different file already there is never overwritten (ExportError)."""
    from results.store.atomic import atomic_write_text

    text = preset_text(summary, prepared.raw, prepared.manifest.get("choices") or prepared.choices)
    path = Path(out)
    if path.exists() and path.read_text() != text:
        raise ExportError(f"pilot.export={path} already exists with other content; remove it or choose another name")
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, text)


# ------------------------------------------------------------------ command
class PilotRecipe(recipe.Recipe):
    """What ``python -m meta.pilot`` states to the runner (meta/search/recipe.py): the pilot's fixed design of runs."""

    command = "meta.pilot"
    usage = USAGE
    kind = PILOT_KIND
    run_dir_prefix = noun = resume_noun = "pilot"
    resume_keys = PILOT_KEYS

    def other_kind(self, kind: str | None, run_dir: str) -> str:
        return (f"run_dir={run_dir} is not a meta.pilot run; resume it with python -m meta.{kind or 'run'} "
                f"run_dir={run_dir}")

    def take_arguments(self, overrides: list[str]) -> tuple[list[str], str | None]:
        return _split_export(overrides)

    def take_settings(self, raw: dict[str, Any], export: str | None) -> str | None:
        if isinstance(raw.get("pilot"), dict):
            export = export or raw["pilot"].get("export")
            raw["pilot"]["export"] = None
        return export

    def build(self, setup: recipe.Setup) -> Prepared:
        return build(setup)

    def plan(self, prepared: Prepared) -> str:
        return build_dry_run_plan(prepared)

    def start(self, prepared: Prepared) -> list[MemberSpec]:
        from meta.search.run import write_run_files

        store = prepared.store
        prepared.manifest.setdefault("kind", PILOT_KIND)
        prepared.manifest.setdefault("choices", prepared.choices)
        manifest = write_run_files(store, prepared.raw, prepared.manifest, prepared.resuming)
        plan = store.read_pilot_plan()
        if plan is None:
            plan = make_plan(prepared)
            store.write_pilot_plan(plan)
        _check_plan(plan, prepared)
        logger.info("%s (run %s): %d combination(s) x %d runs", run_dir_label(store.root, prepared.resuming, "pilot"),
                    manifest["run_id"], len(plan["combinations"]), runs_per_combination(prepared.pilot))
        return member_specs(plan, prepared.cfg, manifest["run_id"])

    def execute(self, prepared: Prepared, specs: list[MemberSpec], launcher: Any) -> None:
        run_members(prepared, specs, launcher)

    def finish(self, prepared: Prepared, specs: list[MemberSpec], outcome: None) -> int:
        from meta.pilot.findings import summarize_run_dir
        from results.report.pilot import format_pilot

        store = prepared.store
        summary = summarize_run_dir(store.root)
        store.write_pilot(summary)
        sys.stdout.write(format_pilot(summary))
        if prepared.cfg.inner_config["train"].get("eval_every"):
            sys.stdout.write(_early_cut_text(store.root))
        sys.stdout.flush()
        if prepared.export:
            try:
                path = export_preset(summary, prepared, prepared.export)
            except ExportError as exc:
                logger.error("%s", exc)
                return 1
            logger.info("wrote the recommendation as a preset to %s", path)
        return 0


PILOT = recipe.register(PilotRecipe())


def _early_cut_text(run_dir: Path) -> str:
    """What early_stop would cut at these settings (meta/early_cuts.py), from the pilot's own learning curves."""
    from meta.pilot.early_cuts import report_text

    try:
        return "\nearly_stop at these settings (python -m meta.early_cuts):\n" + report_text([run_dir])
    except ValueError as exc:
        return f"\nearly_stop at these settings: not measured ({exc})\n"


def main(argv: Sequence[str] | None = None) -> int:
    return recipe.main(PILOT, argv)


if __name__ == "__main__":
    sys.exit(main())

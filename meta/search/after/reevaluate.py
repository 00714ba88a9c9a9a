"""Re-evaluation after a search, in two stages, so that the exported init and its reported numbers never rest on
the same lucky seeds.

Selection (seeds A): a member's fitness is one noisy training run, and the best of ~180 x G of them is mostly luck
(winner's curse). So the top-k members by search fitness (an online search's: by their particle run's end score,
results/report/search/online.py), the final centre and the searcher's averaged centre (where it keeps one) are each
retrained ``seeds`` times
with seeds the search never used (the same seeds for every candidate: paired), and the init with the highest mean
minus one standard error is the one ``meta.export which=best`` writes (``choose_by_lower_bound``).

Reporting (seeds B, meta/search/after/reporting.py): the chosen init and every baseline retrained on other fresh seeds, used
for nothing else; the result table comes from these runs only.

Resumable like a generation: candidates.json is written before anything is submitted, member outcomes are files,
jobs.json is saved after each submission, and the summary (reevaluation.json) is written last.
``python -m meta.reevaluate run_dir=... [top_k=3] [seeds=3] [report_seeds=3] [test=true]`` runs both on demand
(meta.run runs them at the end of a search when ``reevaluate.top_k`` > 0).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from launch.base import Launcher
from meta.cli_args import key_values, run_command
from meta.search.config import ConfigError
from meta.settings.reevaluate import ReevaluateConfig
from meta.settings.schema import SearchSchema
from meta.search.after.phase import run_phase
from meta.search.after.reporting import run_reporting
from meta.settings.upgrade import stored_config, stored_manifest
from core.seeding import member_seed
from results.report.paired import pooled_std
from results.report.search.online import AVERAGED_CENTER, search_measure
from results.report.search.result_table import render_markdown
from results.store.layout import member_dir_name
from core.records import MemberSpec
from results.store.run_store import RunStore

logger = logging.getLogger(__name__)

#: the ``generation`` number the re-evaluation's members carry (job names, logs): far above any real generation,
#: so a SLURM array of this phase never shares a name with a generation's
REEVALUATE_GENERATION = 9998
CENTER = "center"
#: how the export is chosen, recorded with it
SELECTION_RULE = ("highest mean - max(own std, pooled std) / sqrt(n) on the selection seeds; candidates measured "
                  "on 2+ seeds before those measured once; ties: more seeds, then search order")


class ReevaluationError(RuntimeError):
    """Nothing to re-evaluate, or every run failed: the search's files say why (exit status 1)."""


USAGE = ("usage: python -m meta.reevaluate run_dir=<run dir> [top_k=3] [seeds=3] [report_seeds=3] "
         "[test=true|false]")


def choose_candidates(store: RunStore, top_k: int) -> dict[str, Any]:
    """The top_k population members by search fitness (ties: earlier generation, lower index), the final centre, and
    the searcher's averaged centre where it keeps one. An online search's (es=nres) members are ranked by the end
    score of their particle's run (only truncations that stopped at its horizon: a real full-run pass@1), never by a
    truncation's change of pass@1, which scores a piece of a run, not the map."""
    import torch

    latest = store.latest_state()
    if latest is None:
        raise ReevaluationError(f"run_dir={store.root} has no finished generation; nothing to re-evaluate")
    last_generation, state = latest
    members = store.read_members()
    measure = search_measure(store)
    candidates: list[dict[str, Any]] = []
    if len(members) and top_k > 0:
        ranked, score, note = measure.ranked(members[members["generation"] <= last_generation])
        if note:
            logger.warning("%s", note)
        ranked = ranked.head(top_k)
        for row in ranked.to_dict("records"):
            generation, index = int(row["generation"]), int(row["index"])
            values = store.read_population(generation)
            if values is None:
                raise ReevaluationError(f"population of generation {generation} is missing or corrupt in {store.root}")
            candidates.append({
                "name": f"g{generation:04d}_m{index:03d}", "generation": generation,
                "index": index, "search_fitness": float(row[score]),
                "params": values[index].to(torch.float64).tolist(),
            })
    candidates.append({"name": CENTER, "generation": last_generation, "index": None,
                       "search_fitness": measure.center_fitness(state),
                       "params": state["center"].to(torch.float64).tolist()})
    if state.get(AVERAGED_CENTER) is not None:
        candidates.append({"name": AVERAGED_CENTER, "generation": last_generation, "index": None,
                           "search_fitness": None, "params": state[AVERAGED_CENTER].to(torch.float64).tolist()})
    return {"top_k": top_k, "after_generation": last_generation, "candidates": candidates,
            "ranked_by": measure.ranked_by}


def _candidates(store: RunStore, settings: ReevaluateConfig) -> dict[str, Any]:
    """The candidate set to (continue to) re-evaluate. One made for other settings or before more generations
    ran is moved aside whole (its runs belong to other inits or seeds), never mixed with the new one."""
    latest = store.latest_state()
    wanted = {"top_k": settings.top_k, "seeds": settings.seeds,
              "after_generation": latest[0] if latest is not None else None}
    existing = store.read_candidates()
    if existing is not None and all(existing.get(k) == v for k, v in wanted.items()):
        return existing
    if existing is not None or store.reevaluate_dir().exists():
        old = store.archive_reevaluation()
        logger.info("re-evaluation settings or generations changed (%s -> %s); earlier runs moved to %s",
                    {k: (existing or {}).get(k) for k in wanted}, wanted, old)
    chosen = choose_candidates(store, settings.top_k) | {"seeds": settings.seeds}
    store.write_candidates(chosen)
    return chosen


def _specs(cfg: SearchSchema, store: RunStore, run_id: str, rows: Sequence[Mapping[str, Any]],
           seeds: int) -> list[MemberSpec]:
    """Member ``c * seeds + s`` trains candidate c with seed s; seed s is the same for every candidate (paired)."""
    folder = store.reevaluate_dir()
    inner = cfg.member_inner()
    specs = []
    for c, row in enumerate(rows):
        for s in range(seeds):
            index = c * seeds + s
            specs.append(MemberSpec(
                run_id=run_id, generation=REEVALUATE_GENERATION, index=index,
                seed=member_seed(cfg.seed, "reevaluate", s), params=list(row["params"]),
                work_dir=str(folder / member_dir_name(index)), inner=inner,
            ))
    return specs


def summarize(values: Sequence[float], runs: int) -> dict[str, Any]:
    """Mean, sample std and n of the runs that succeeded (failed runs are counted, never averaged in)."""
    n = len(values)
    return {
        "mean": statistics.fmean(values) if n else None,
        "std": statistics.stdev(values) if n > 1 else None,
        "n": n, "failed": runs - n, "values": list(values),
    }


def lower_bound(result: Mapping[str, Any], pooled: float | None) -> float:
    """A candidate's mean minus one standard error; the spread is the larger of its own std and the pooled one, so
    two lucky seeds that happen to agree do not make a candidate look certain."""
    spread = max(result["std"] or 0.0, pooled or 0.0)
    return float(result["mean"]) - spread / math.sqrt(result["n"])


def choose_by_lower_bound(results: Sequence[Mapping[str, Any]], pooled: float | None) -> int:
    """The index of the export (SELECTION_RULE). ReevaluationError when no candidate has a successful run."""
    usable = [i for i, r in enumerate(results) if r["n"] > 0]
    if not usable:
        raise ReevaluationError("re-evaluation: every run of every candidate failed")
    measured = [i for i in usable if results[i]["n"] >= 2] or usable
    return max(measured, key=lambda i: (lower_bound(results[i], pooled), results[i]["n"], -i))


def run_selection(cfg: SearchSchema, store: RunStore, launcher: Launcher, run_id: str,
                  settings: ReevaluateConfig) -> dict[str, Any]:
    """Stage A (resuming whatever already ran): write and return reevaluation.json."""
    chosen_set = _candidates(store, settings)
    rows = chosen_set["candidates"]
    logger.info("selection: %d init(s) (%s) with %d fresh seeds each", len(rows),
                ", ".join(r["name"] for r in rows), settings.seeds)
    records = run_phase(cfg, launcher, store.reevaluate_dir(), _specs(cfg, store, run_id, rows, settings.seeds),
                        "selection stage")
    results = []
    for c, row in enumerate(rows):
        runs = [records[c * settings.seeds + s] for s in range(settings.seeds)]
        stats = summarize([r.fitness for r in runs if r.ok], len(runs))
        results.append({key: row[key] for key in ("name", "generation", "index", "search_fitness")} | stats)
    pooled = pooled_std([r["values"] for r in results])
    try:
        best = choose_by_lower_bound(results, pooled)
    except ReevaluationError:
        raise ReevaluationError("re-evaluation: every run of every candidate failed; see the member logs under "
                                f"{store.reevaluate_dir()}") from None
    for result in results:
        result["lower_bound"] = lower_bound(result, pooled) if result["n"] else None
    summary: dict[str, Any] = {
        "seeds": settings.seeds, "after_generation": chosen_set["after_generation"], "candidates": results,
        "chosen": results[best]["name"], "chosen_params": rows[best]["params"], "selection_rule": SELECTION_RULE,
        "noise_floor_std": pooled, "nominated_by": chosen_set.get("ranked_by"),
    }
    logger.info("selection: %s", "; ".join(
        f"{r['name']} {r['mean']:.4f} +- {r['std'] or 0:.4f} (n={r['n']}, lower bound {r['lower_bound']:.4f})"
        if r["n"] else f"{r['name']} all runs failed" for r in results))
    store.write_reevaluation(summary)
    return summary


def run_reevaluation(cfg: SearchSchema, store: RunStore, launcher: Launcher, run_id: str,
                     settings: ReevaluateConfig | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Both stages: selection, then (``report_seeds`` > 0) the result table of the chosen init and the baselines.
    Returns reevaluation.json's content, with the table under ``table`` when it was made. ``overrides``: the
    run's command line, from which the baselines' divergence blocks are composed."""
    settings = settings or cfg.reevaluate_settings
    summary = run_selection(cfg, store, launcher, run_id, settings)
    if settings.report_seeds > 0:
        exported = {"name": summary["chosen"], "params": summary["chosen_params"]}
        summary["table"] = run_reporting(cfg, store, launcher, run_id, overrides, exported, settings)
    return summary


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    return key_values(argv, {}, ("run_dir", "top_k", "seeds", "report_seeds", "test"), USAGE)


def _settings(cfg: SearchSchema, args: Mapping[str, str]) -> ReevaluateConfig:
    def integer(key: str, default: int, minimum: int) -> int:
        if key not in args:
            return default
        try:
            value = int(args[key])
        except ValueError:
            raise ConfigError(f"{key}={args[key]!r} must be an integer") from None
        if value < minimum:
            raise ConfigError(f"{key}={value} must be >= {minimum}")
        return value

    test = args.get("test", str(cfg.reevaluate_settings.test)).lower()
    if test not in ("true", "false"):
        raise ConfigError(f"test={args['test']!r} must be true or false")
    report_seeds = integer("report_seeds", cfg.reevaluate_settings.report_seeds, 0)
    if report_seeds == 1:
        raise ConfigError("report_seeds=1 gives no interval; use 2 or more, or 0 to skip the result table")
    return dataclasses.replace(cfg.reevaluate_settings, top_k=integer("top_k", cfg.reevaluate_settings.top_k, 0),
                               seeds=integer("seeds", cfg.reevaluate_settings.seeds, 2), report_seeds=report_seeds,
                               test=test == "true")


def _reevaluate(argv: list[str]) -> int:
    from launch.factory import build_launcher
    from launch.runner import AbortRun
    from meta.compose import merge_overrides
    from meta.search.config import build_search_config
    from meta.search.lock import run_locked

    args = parse_args(argv)
    store = RunStore(Path(args["run_dir"]).resolve())
    if not store.exists():
        raise ConfigError(f"run_dir={args['run_dir']} holds no run (no config.yaml)")
    cfg = build_search_config(stored_config(store))
    settings = _settings(cfg, args)

    def body() -> int:
        launcher = build_launcher(cfg.launcher_node)
        try:
            manifest = stored_manifest(store)  # its command line under today's key names
            summary = run_reevaluation(cfg, store, launcher, manifest.get("run_id", "run"), settings,
                                       merge_overrides(manifest.get("overrides", []), []))
        except (ReevaluationError, AbortRun) as exc:
            logger.error("re-evaluation stopped: %s", exc)
            return 1
        finally:
            launcher.close()
        if "table" in summary:
            sys.stdout.write(render_markdown(summary["table"], all_pairs=False))
        return 0

    return run_locked(store.lock_path, body)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, USAGE, _reevaluate, "reevaluate error")


if __name__ == "__main__":
    sys.exit(main())

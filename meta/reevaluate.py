"""Re-evaluation before export: retrain the search's best candidates with fresh seeds, pick by the mean.

A member's fitness is one noisy training run on one validation split; the best of ~180 x G of them is mostly luck
(winner's curse). So the top-k members by search fitness and the final centre are each retrained ``seeds`` times
with seeds the search never used (the same seeds for every candidate, so the comparison is paired), and the init
with the highest re-evaluated mean is the one ``meta.export which=best`` writes, with its mean, std and n. Only
that chosen init is then trained ``seeds`` more times and scored on the test split: the search never sees it.

Resumable like a generation: candidates.json is written before anything is submitted, member outcomes are files,
jobs.json is saved after each submission, and the summary (reevaluation.json) is written last.
``python -m meta.reevaluate run_dir=... [top_k=3] [seeds=3] [test=true]`` runs it on demand (meta.run runs it at
the end of a search when ``reevaluate.top_k`` > 0).
"""
from __future__ import annotations

import logging
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from launch.base import Launcher
from launch.factory import runner_policy
from launch.runner import MemberArrayRunner
from meta.cli_args import key_values, run_command
from meta.config import ConfigError, ReevaluateConfig, SearchConfig
from meta.seeding import derive_seed
from results.store.layout import LAUNCHER_DIR, JOBS_FILE, member_dir_name
from results.store.records import MemberSpec, ResultRecord
from results.store.run_store import RunStore, read_jobs_file, write_jobs_file

logger = logging.getLogger(__name__)

#: the ``generation`` number the re-evaluation's members carry (job names, logs): far above any real generation,
#: so a SLURM array of this phase never shares a name with a generation's
REEVALUATE_GENERATION = 9998
TEST_GENERATION = 9999
CENTER = "center"


class ReevaluationError(RuntimeError):
    """Nothing to re-evaluate, or every run failed: the search's files say why (exit status 1)."""


USAGE = "usage: python -m meta.reevaluate run_dir=<run dir> [top_k=3] [seeds=3] [test=true|false]"


def choose_candidates(store: RunStore, top_k: int) -> dict[str, Any]:
    """The top_k population members by search fitness (ties: earlier generation, lower index) and the final centre."""
    import torch

    latest = store.latest_state()
    if latest is None:
        raise ReevaluationError(f"run_dir={store.root} has no finished generation; nothing to re-evaluate")
    last_generation, state = latest
    members = store.read_members()
    candidates: list[dict[str, Any]] = []
    if len(members) and top_k > 0:
        # rows written before the control member existed have no role: they are population members
        role = members["role"].fillna("member") if "role" in members else "member"
        ok = members[(members["status"] == "ok") & (role == "member") & (members["generation"] <= last_generation)]
        ranked = ok.sort_values(["fitness", "generation", "index"], ascending=[False, True, True]).head(top_k)
        for row in ranked.itertuples():
            values = store.read_population(int(row.generation))
            if values is None:
                raise ReevaluationError(f"population of generation {row.generation} is missing or corrupt in {store.root}")
            candidates.append({
                "name": f"g{int(row.generation):04d}_m{int(row.index):03d}", "generation": int(row.generation),
                "index": int(row.index), "search_fitness": float(row.fitness),
                "params": values[int(row.index)].to(torch.float64).tolist(),
            })
    candidates.append({"name": CENTER, "generation": last_generation, "index": None,
                       "search_fitness": state.get("mean_fitness"),
                       "params": state["center"].to(torch.float64).tolist()})
    return {"top_k": top_k, "after_generation": last_generation, "candidates": candidates}


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


def _specs(cfg: SearchConfig, store: RunStore, run_id: str, rows: Sequence[Mapping[str, Any]], seeds: int,
           test: bool) -> list[MemberSpec]:
    """Member ``c * seeds + s`` trains candidate c with seed s; seed s is the same for every candidate (paired)."""
    folder = store.reevaluate_dir(test)
    inner = cfg.member_inner()
    if test:
        inner["eval_split"] = "test"
    purpose = "test" if test else "reevaluate"
    specs = []
    for c, row in enumerate(rows):
        for s in range(seeds):
            index = c * seeds + s
            specs.append(MemberSpec(
                run_id=run_id, generation=TEST_GENERATION if test else REEVALUATE_GENERATION, index=index,
                seed=derive_seed(cfg.seed, purpose, s) % (2**31), params=list(row["params"]),
                work_dir=str(folder / member_dir_name(index)), inner=inner,
            ))
    return specs


def _run_phase(cfg: SearchConfig, store: RunStore, launcher: Launcher, specs: list[MemberSpec],
               test: bool) -> dict[int, ResultRecord]:
    folder = store.reevaluate_dir(test)
    folder.mkdir(parents=True, exist_ok=True)
    jobs_path = folder / JOBS_FILE
    runner = MemberArrayRunner(
        launcher=launcher, entrypoint=cfg.inner_entrypoint, specs=specs, jobs=read_jobs_file(jobs_path),
        save_jobs=lambda jobs: write_jobs_file(jobs_path, jobs), launcher_folder=folder / LAUNCHER_DIR,
        policy=runner_policy(cfg.retries, cfg.inner_timeout_s, cfg.launcher),
        on_final=lambda spec, record, progress: logger.info(
            "%s run %03d: %s %s (%d/%d)", "test" if test else "re-evaluation", spec.index, record.status,
            f"{record.fitness:.4f}" if record.ok else record.error.strip()[-160:], progress.done, progress.total),
    )
    return runner.run()


def summarize(values: Sequence[float], runs: int) -> dict[str, Any]:
    """Mean, sample std and n of the runs that succeeded (failed runs are counted, never averaged in)."""
    n = len(values)
    return {
        "mean": statistics.fmean(values) if n else None,
        "std": statistics.stdev(values) if n > 1 else None,
        "n": n, "failed": runs - n, "values": list(values),
    }


def pooled_std(groups: Sequence[Sequence[float]]) -> float | None:
    """The seed-to-seed spread of one init, pooled over candidates: the search's noise floor."""
    dof = sum(len(g) - 1 for g in groups if len(g) > 1)
    if dof == 0:
        return None
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups if len(g) > 1)
    return math.sqrt(ss / dof)


def run_reevaluation(cfg: SearchConfig, store: RunStore, launcher: Launcher, run_id: str,
                     settings: ReevaluateConfig | None = None) -> dict[str, Any]:
    """Re-evaluate (resuming whatever part already ran) and write reevaluation.json; returns its content."""
    settings = settings or cfg.reevaluate
    chosen_set = _candidates(store, settings)
    rows = chosen_set["candidates"]
    logger.info("re-evaluating %d init(s) (%s) with %d fresh seeds each", len(rows),
                ", ".join(r["name"] for r in rows), settings.seeds)
    records = _run_phase(cfg, store, launcher, _specs(cfg, store, run_id, rows, settings.seeds, False), False)
    results = []
    for c, row in enumerate(rows):
        runs = [records[c * settings.seeds + s] for s in range(settings.seeds)]
        stats = summarize([r.fitness for r in runs if r.ok], len(runs))
        results.append({key: row[key] for key in ("name", "generation", "index", "search_fitness")} | stats)
    usable = [i for i, r in enumerate(results) if r["n"] > 0]
    if not usable:
        raise ReevaluationError("re-evaluation: every run of every candidate failed; see the member logs under "
                          f"{store.reevaluate_dir()}")
    best = max(usable, key=lambda i: (results[i]["mean"], -i))
    summary: dict[str, Any] = {
        "seeds": settings.seeds, "after_generation": chosen_set["after_generation"], "candidates": results,
        "chosen": results[best]["name"], "chosen_params": rows[best]["params"],
        "noise_floor_std": pooled_std([r["values"] for r in results]),
        "test": None,
    }
    logger.info("re-evaluation: %s", "; ".join(
        f"{r['name']} {r['mean']:.4f} +- {r['std'] or 0:.4f} (n={r['n']}, search {r['search_fitness']})"
        if r["n"] else f"{r['name']} all runs failed" for r in results))
    if settings.test:
        test_records = _run_phase(
            cfg, store, launcher, _specs(cfg, store, run_id, [rows[best]], settings.seeds, True), True)
        ok_values = [test_records[s].fitness for s in range(settings.seeds) if test_records[s].ok]
        summary["test"] = summarize(ok_values, settings.seeds)
        logger.info("test split, %s: %s", results[best]["name"], summary["test"])
    store.write_reevaluation(summary)
    return summary


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    return key_values(argv, {}, ("run_dir", "top_k", "seeds", "test"), USAGE)


def _settings(cfg: SearchConfig, args: Mapping[str, str]) -> ReevaluateConfig:
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

    test = args.get("test", str(cfg.reevaluate.test)).lower()
    if test not in ("true", "false"):
        raise ConfigError(f"test={args['test']!r} must be true or false")
    return ReevaluateConfig(top_k=integer("top_k", cfg.reevaluate.top_k, 0),
                            seeds=integer("seeds", cfg.reevaluate.seeds, 2), test=test == "true")


def _reevaluate(argv: list[str]) -> int:
    import yaml

    from launch.factory import build_launcher
    from launch.runner import AbortRun
    from meta.config import build_search_config
    from meta.lock import RunLock, RunLockedError

    args = parse_args(argv)
    store = RunStore(Path(args["run_dir"]).resolve())
    if not store.exists():
        raise ConfigError(f"run_dir={args['run_dir']} holds no run (no config.yaml)")
    cfg = build_search_config(yaml.safe_load(store.read_config_text()) or {})
    settings = _settings(cfg, args)
    lock = RunLock(store.lock_path)
    try:
        lock.acquire()
    except RunLockedError as exc:
        logger.error("%s", exc)
        return 3
    try:
        launcher = build_launcher(cfg.launcher)
        try:
            run_reevaluation(cfg, store, launcher, store.read_manifest().get("run_id", "run"), settings)
        finally:
            launcher.close()
    except (ReevaluationError, AbortRun) as exc:
        logger.error("re-evaluation stopped: %s", exc)
        return 1
    finally:
        lock.release()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, USAGE, _reevaluate, "reevaluate error")


if __name__ == "__main__":
    sys.exit(main())

"""The text of a ``meta.pilot`` run's findings, which meta.pilot computes (meta/pilot/findings.py, horizon.py) and
writes as pilot.json each time a run becomes final: ``python -m results.report RUN_DIR`` prints them for a pilot run
dir (partial until every run is final) and writes pilot.txt and pilot_combinations.csv.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from results.report.arguments import check_output_folder, run_dir_argument
from results.report.paired import CONFIDENCE
from results.store.atomic import CorruptFileError, atomic_write_text
from results.store.layout import REPORT_DIR
from results.store.run_store import RunStore

#: the manifest's ``kind`` of a pilot run dir (meta/pilot/cli.py writes it)
PILOT_KIND = "pilot"
#: the maps whose two means the horizon check's text lists (the centre and the first pairs)
SHOWN_MAPS = 9


# ------------------------------------------------------------------ the run dir
def is_pilot_dir(run_dir: str | Path) -> bool:
    """True for a meta.pilot run dir (its manifest says kind pilot, or it holds a pilot plan)."""
    store = RunStore(run_dir)
    try:
        kind = store.read_manifest().get("kind")
    except CorruptFileError:
        kind = None
    return kind == PILOT_KIND or store.pilot_plan_path.is_file()


# ------------------------------------------------------------------ text
def num_text(value: Any, digits: int = 4) -> str:
    """A number as the findings print it: fixed digits, or significant ones when very small or large; n/a for None."""
    if value is None:
        return "n/a"
    number = float(value)
    small_or_large = number != 0.0 and (abs(number) >= 1e4 or abs(number) < 1e-3)
    return f"{number:.{digits}g}" if small_or_large else f"{number:.{digits}f}"


def _g(value: float | None) -> str:
    """A setting as typed (0.01, 1): n/a when the config has none (a divergence without coef)."""
    return "n/a" if value is None else f"{value:g}"


def _signed(value: float | None) -> str:
    return "  fail" if value is None else f"{value:+.4f}"


def format_combination(c: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    r, pop = summary["seeds_per_member"], summary["population"]
    centre = c["centre"]
    lines = [f"combination {c['combination']}: radius {_g(c['radius'])} (es.{summary['radius_key']}), "
             f"divergence.coef {_g(c['coef'])}; "
             f"{c['finished']}/{c['runs']} runs final, {c['failed']} failed"]
    if centre["n"]:
        lines.append(f"  seed noise of one init (the centre, {centre['n']} seeds): mean pass@1 {num_text(centre['mean'])}, "
                     f"total std {num_text(centre['total_std'])}")
        if centre["binomial_std"] is not None:
            lines.append(f"    binomial part sqrt(p(1-p)/V), V={centre['val_size']}: {num_text(centre['binomial_std'])}; "
                         f"training part sqrt(max(total^2 - binomial^2, 0)): {num_text(centre['training_std'])}; "
                         f"V={centre['val_size_halving_binomial']} would halve the binomial part")
    else:
        lines.append("  seed noise of one init: no centre run finished yet")
    if c.get("perturbed_mean") is not None:  # absent from pilot.json files written before it existed
        lines.append(f"  mean pass@1 of the perturbed inits c +- e_i: {num_text(c['perturbed_mean'])} (the centre's: "
                     f"{num_text(centre['mean'])}; a gap that both signs share is curvature, which pair differences "
                     "cancel)")
    lines.append("  pair differences d_is = f(c+e_i, s) - f(c-e_i, s) (same seed s for both):")
    for p in c["pairs"]:
        lines.append(f"    pair {p['pair']}: mean {_signed(p['mean']) if p['mean'] is not None else '   n/a'}; "
                     f"per seed {' '.join(_signed(d) for d in p['diffs'])}")
    if c["noise_var"] is None:
        lines.append(f"  SNR: {c['reason']}")
        return lines + _scale_lines(c)
    lines += [
        f"  noise variance of a single-seed difference sigma_n^2 (pooled within pairs, {c['noise_dof']} dof): "
        f"{num_text(c['noise_var'], 4)}",
        f"  signal variance sigma_s^2 = max(mean_i(m_i^2 - sigma_n^2/k_i), 0) over {c['pairs_used']} pairs: "
        f"{num_text(c['signal_var'], 4)}",
        f"  F-test (signal if P(F({c['pairs_used']}, {c['noise_dof']}) >= F) < {_g(summary.get('significance'))}): "
        f"F = {num_text(c['f'], 4) if c['f'] is not None else 'undefined (sigma_n^2 = 0)'}, p = {num_text(c['p_value'], 3)}",
    ]
    if not c["signal"]:
        estimate = f" (the estimate would read {num_text(c['snr_estimate'], 3)})" if c["snr_estimate"] is not None else ""
        lines.append(f"  SNR of one generation's ES step at P={pop}, r={r}: no signal: {c['reason']}{estimate}")
    elif c["noise_free"]:
        lines.append("  SNR of one generation's ES step: unbounded (sigma_n^2 = 0: differences repeat over seeds)")
    else:
        lines.append(f"  SNR of one generation's ES step at P={pop}, r={r}: (P/2) sigma_s^2 / (sigma_n^2/r) = "
                     f"{num_text(c['snr'], 4)}")
    lines += _scale_lines(c)
    inter = c["intermediate"]
    if not inter["measured"]:
        lines.append(f"  early intermediate vs final scores: {inter['reason']}")
    else:
        ranks = ", ".join(f"step {s['step']}: {num_text(s['rho'], 3) if s['rho'] is not None else 'undefined'}"
                          for s in inter["steps"]) or "no step every run reached"
        n = inter["steps"][0]["n"] if inter["steps"] else 0
        lines.append(f"  early intermediate vs final scores, Spearman rho over {n} runs: {ranks}")
    return lines + format_truncation(c.get("truncation"), summary)


def _cell(value: float | None, width: int, form: str = ".4f") -> str:
    """A table cell in ``form`` (a format spec without its width), n/a for None, inf for an unbounded SNR."""
    if value is None:
        return f"{'n/a':>{width}}"
    if math.isinf(value):
        return f"{'inf':>{width}}"
    return format(value, form).rjust(width)


def _sqrt(value: float | None) -> float | None:
    return None if value is None else math.sqrt(value)


def _phase_line(label: str, row: Mapping[str, Any], snr: float | None) -> str:
    steps = f"[{row['start']}, {row['stop']})"
    below = "  < 1/V" if row["resolved"] is False else ""
    return (f"    {label:>7} {steps:>12} {row['n']:>4} {_cell(row['mean'], 8, '+.4f')} {_cell(row['sd'], 7)} "
            f"{_cell(row['median_abs'], 7)} {_cell(_sqrt(row['noise_var']), 8)} {_cell(_sqrt(row['signal_var']), 9)} "
            f"{_cell(row['p_value'], 6, '.3f')} {_cell(snr, 9, '.4g')}{below}")


def _snr_of(row: Mapping[str, Any]) -> float | None:
    """A row's SNR estimate at the configured population, unbounded where its differences have no noise."""
    if row["snr_estimate"] is None and row["signal_var"]:
        return math.inf
    return row["snr_estimate"]


def format_truncation(check: Mapping[str, Any] | None, summary: Mapping[str, Any]) -> list[str]:
    """The truncation check of an online searcher (es=nres) as a table, one row per phase and one for the episode,
    then its SNRs and recommendation ([] for a pilot without one)."""
    if not check:
        return []
    pop, es = check["population"], summary["es"]
    resolution = (f"V={check['val_size']} (1/V = {check['resolution']:.4f})" if check["resolution"] is not None
                  else "V unknown")
    lines = [f"  truncation check (es={es}, T={check['truncation_steps']} of train.steps={check['horizon']}, "
             f"{len(check['phases'])} phases): pair differences d of each phase's change of validation pass@1, "
             f"{check['usable']}/{check['planned']} pair-seeds usable, {resolution}",
             f"    {'phase':>7} {'steps':>12} {'n':>4} {'mean d':>8} {'SD d':>7} {'med|d|':>7} {'noise SD':>8} "
             f"{'signal SD':>9} {'F p':>6} {'SNR P=' + str(pop):>9}"]
    lines += [_phase_line(str(row["phase"]), row, _snr_of(row)) for row in check["phases"]]
    episode = check["episode"]
    lines.append(_phase_line("episode", episode, _snr_of(episode)))
    how = "pooled over the phases (stagger)" if check["stagger"] else "mean over the phases"
    lines += [f"  per episode (one run per particle, the sum over its phases: what one whole particle run's estimate "
              f"carries): SNR {num_text(_snr_of(episode), 3)} at P={pop}"
              + ("" if episode["signal"] else f" (no signal: {episode['reason']})"),
              f"  per truncation (what an update that reads one truncation's changes carries, {how}): SNR "
              f"{num_text(check['update_snr'], 3)} at P={pop}; phases with signal (F-test p < "
              f"{_g(summary.get('significance'))}): {check['phases_with_signal']} of {len(check['phases'])}"]
    if any(row["resolved"] is False for row in check["phases"]):
        lines.append("  < 1/V: the phase's median |d| is below one problem: most pairs' two members moved alike")
    lines.append(f"  {_nres_text(check['recommendation'], es)}")
    return lines


def _nres_text(rec: Mapping[str, Any], es: str) -> str:
    """es=nres's recommendation or why it cannot see anything, in one line."""
    if not rec["visible"]:
        return f"es={es}: {rec['reason']}"
    reads = ("a truncation's, at that population and T: its update reads each truncation" if rec["per_truncation"]
             else "a whole run's, at that population: its update sums a run's truncations before it reads them")
    step = ("" if rec["step"] is None else
            f", es.{rec['step_key']}={rec['step']:.3g} (the configured {rec['step_configured']:g} x S/(1+S) = "
            f"{rec['step_factor']:.3g}, S = {num_text(rec['step_snr'], 3)}, {reads})")
    alone = ("" if rec["per_truncation"] or rec["resolved_steps"] == rec["truncation_steps"] else
             f"; a truncation's changes alone resolve one problem from T={rec['resolved_steps']} on")
    return (f"es={es}: population {rec['population']} (an episode at the target SNR {rec['target_snr']:g}), "
            f"es.{rec['truncation_key']}={rec['truncation_steps']}{step}{alone}")


def _scale_lines(c: Mapping[str, Any]) -> list[str]:
    """Scale apart from direction (absent from pilot.json files written before it existed)."""
    scale = c.get("scale")
    if scale is None:
        return []
    level = int(round(CONFIDENCE * 100))
    if scale["low"] is not None:
        effect = (f"{scale['mean']:+.4f} [{scale['low']:+.4f}, {scale['high']:+.4f}] ({level}% t interval over "
                  f"{scale['n']} seeds)")
    else:
        effect = f"{num_text(scale['mean'])} (n={scale['n']}, no interval)"
    spread = math.sqrt(c["signal_var"]) if c.get("signal_var") is not None else None
    direction = ("signal" if c["signal"] else "no signal") + (
        f", p = {num_text(c['p_value'], 3)}" if c.get("p_value") is not None else "")
    return [
        f"  scale: the maps at the radius minus the centre, per seed: {effect}",
        f"  direction: the pairs' seed-free differences spread sqrt(sigma_s^2) = {num_text(spread)} ({direction})",
        f"  a search buys {c['buys']}: {c['advice']}",
    ]


def format_recommendation(rec: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    lines = [f"recommendation (target SNR {num_text(rec['target_snr'], 3)}):"]
    unit = rec["unit"]
    cost = f"  pilot cost: {num_text(rec['pilot_hours'], 3)} {unit} (measured: the finished runs' wall time"
    cost += f" x {'resources.gpus' if unit == 'GPU-h' else 'resources.cpus'})"
    bought = [f"  radius {_g(c['radius'])}, coef {_g(c['coef'])}: a search buys {c['buys']}"
              for c in summary["combinations"] if c.get("buys")]
    lines += bought
    if not rec["reachable"]:
        nres = rec.get("nres")
        return lines + [f"  none: {rec['reason']}", *([f"  {_nres_text(nres, summary['es'])}"] if nres else []), cost]
    r, pop = summary["seeds_per_member"], summary["population"]
    snr = "unbounded" if rec["noise_free"] else num_text(rec["snr"], 3)
    lines.append(f"  best combination: {rec['combination']} (radius {_g(rec['radius'])}, coef {_g(rec['coef'])}), "
                 f"SNR {snr} at P={pop}, r={r}")
    at = f" (SNR {num_text(rec['population_snr'], 3)})" if rec["population_snr"] is not None else ""
    lines.append(f"  smallest even population at r={r}: {rec['population']}{at}")
    note = "" if summary["seeds_per_member_set"] else " (seeds_per_member is not a setting of this search: a member " \
                                                     "is one run; the validation size below is the lever here)"
    lines.append(f"  seeds per member at P={pop}: {rec['seeds_per_member']}{note}")
    size = rec["val_size"]
    lines.append(f"  validation size at P={pop}, r={r}: "
                 + (f"{size['value']} (train.val_size)" if size and size["value"] is not None
                    else (size or {}).get("reason", "n/a")))
    search = (f"{num_text(rec['search_hours'], 3)} {unit}" if rec["search_hours"] is not None else "unknown")
    nres = rec.get("nres")
    if nres is None:
        return lines + [cost, f"  recommended search: population {rec['population']} x generations "
                              f"{summary['generations']} x {r} seed(s) per member = {rec['search_runs']} runs x "
                              f"{num_text((rec['member_hours'] or 0) * 60, 3)} min = {search}"]
    lines += [cost, f"  {_nres_text(nres, summary['es'])}"]
    if nres["search_member_steps"] is not None:
        hours = f"{num_text(nres['search_hours'], 3)} {unit}" if nres["search_hours"] is not None else "unknown"
        lines.append(f"  recommended search: population {nres['population']} x generations {summary['generations']} = "
                     f"{nres['search_truncations']} truncations, {nres['search_member_steps']} member-steps = {hours} "
                     "(the pilot's whole-run time per step, its extra validations included, plus each truncation's "
                     "start)")
    return lines


def format_pilot(summary: Mapping[str, Any]) -> str:
    """The findings as text, one block per combination, then the recommendation (partial if not complete)."""
    state = "complete" if summary["complete"] else "PARTIAL (not every run is final: numbers may still move)"
    lines = [
        f"pilot {summary['run_dir']} (run_id {summary['run_id']}, seed {summary['seed']}): {summary['finished']}/"
        f"{summary['runs']} runs final, {summary['failed']} failed; {state}",
        f"k={summary['seeds']} seeds per init, m={summary['pairs']} antithetic pairs per combination; the SNR speaks "
        f"for es={summary['es']} at population P={summary['population']}, r={summary['seeds_per_member']} seed(s) per "
        "member",
        "",
    ]
    for c in summary["combinations"]:
        lines += format_combination(c, summary) + [""]
    horizon = format_horizon(summary.get("horizon"))
    lines += horizon + ([""] if horizon else [])
    lines += format_recommendation(summary["recommendation"], summary)
    return "\n".join(lines) + "\n"


def format_horizon(check: Mapping[str, Any] | None) -> list[str]:
    """The check as text lines ([] for a pilot without one)."""
    if not check:
        return []
    t, s = check["member_steps"], check["steps"]
    # (a pilot.json written before the check recorded its reliability says no number)
    share = f"{check['reliability']:.0%} map signal" if check.get("reliability") else "a reliable map signal"
    lines = [f"horizon check (es.member_steps={t} against train.steps={s}; the first combination's centre and "
             f"pairs, {check['maps']}/{check['maps_planned']} maps on paired seeds):"]
    if check["maps"]:
        shown = list(zip(check["short_means"], check["full_means"]))[:SHOWN_MAPS]
        more = f" (the first {SHOWN_MAPS} of {check['maps']})" if check["maps"] > SHOWN_MAPS else ""
        lines.append(f"  per map{more}, mean fitness at step {t} -> {s}: "
                     + ", ".join(f"{a:.4f} -> {b:.4f}" for a, b in shown))
        for name, horizon in (("short", check["short"]), ("full", check["full"])):
            lines.append(f"  seed noise at {t if name == 'short' else s} steps: std {_std(horizon['seed_std'])}, "
                         f"between maps {_std(horizon['between_var'], var=True)}; seeds per map for {share}: "
                         f"{horizon['seeds_needed'] or 'n/a'}")
    lines += [f"  verdict: {check['sentence']}", f"  recommendation: {check['advice']}"]
    lines.append(f"  cost: {check['runs']} runs at train.steps={s}: {check['cost_text']}")
    return lines


def _std(value: float | None, var: bool = False) -> str:
    if value is None:
        return "n/a"
    if var:
        return f"std {math.sqrt(value):.4f}" if value > 0 else "none beyond seed noise"
    return f"{value:.4f}"


def load_pilot(run_dir: str | Path) -> dict[str, Any]:
    """pilot.json: the findings meta.pilot wrote when its last run became final (partial until every run is).
    ValueError when the dir holds none yet."""
    store = RunStore(run_dir)
    summary = store.read_pilot()
    if summary is None:
        if store.read_pilot_plan() is None:
            raise ValueError(f"{store.root} holds no pilot plan yet (killed before its first submission?)")
        raise ValueError(f"{store.root} holds no findings yet: meta.pilot writes pilot.json as its runs become final "
                         f"(python -m meta.status run_dir={store.root} shows the runs)")
    return summary


def build_pilot_report(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[str, list[Path]]:
    """The text and the files written (pilot.txt, pilot_combinations.csv) to ``out_dir`` (default RUN_DIR/report)."""
    import pandas as pd

    summary = load_pilot(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / REPORT_DIR
    text = format_pilot(summary)
    keys = ("combination", "radius", "coef", "finished", "failed", "noise_var", "signal_var", "f", "p_value", "signal",
            "snr")
    rows = [{**{k: c[k] for k in keys}, "centre_mean": c["centre"]["mean"], "centre_std": c["centre"]["total_std"],
             **{f"scale_{k}": (c.get("scale") or {}).get(k) for k in ("mean", "low", "high", "n")},
             "buys": c.get("buys"), **_truncation_columns(c.get("truncation")), "run_id": summary["run_id"]}
            for c in summary["combinations"]]
    files = [atomic_write_text(out / "pilot.txt", text),
             atomic_write_text(out / "pilot_combinations.csv", pd.DataFrame(rows).to_csv(index=False))]
    return text, files


def _truncation_columns(check: Mapping[str, Any] | None) -> dict[str, Any]:
    """pilot_combinations.csv's columns of the truncation check (empty for a pilot without one)."""
    if not check:
        return {}
    rec = check["recommendation"]
    return {"nres_episode_snr": check["episode"]["snr_estimate"], "nres_update_snr": check["update_snr"],
            "nres_visible": rec["visible"], "nres_population": rec["population"],
            "nres_truncation_steps": rec["truncation_steps"], "nres_step": rec["step"]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m results.report", add_help=False)
    parser.add_argument("run_dir", nargs="?", type=run_dir_argument)
    parser.add_argument("--out", default=None)
    parser.add_argument("--top", default=None)
    return parser


def is_pilot_request(argv: Sequence[str]) -> bool:
    """Whether ``python -m results.report`` was pointed at a pilot run dir (dispatch in results/report/__main__.py)."""
    try:
        args, _ = _parser().parse_known_args(list(argv))
    except SystemExit:
        return False
    return bool(args.run_dir) and is_pilot_dir(args.run_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """Print a pilot's findings and write them to --out; exit 2 when RUN_DIR holds no pilot plan."""
    args, _ = _parser().parse_known_args(sys.argv[1:] if argv is None else list(argv))
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        check_output_folder(args.out)
        text, files = build_pilot_report(args.run_dir, args.out)
    except (ValueError, FileNotFoundError) as exc:  # CorruptFileError included
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(text + "\nwrote:\n" + "".join(f"  {f}\n" for f in files))
    return 0

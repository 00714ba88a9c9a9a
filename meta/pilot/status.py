"""``python -m meta.status run_dir=<pilot dir>``: what a pilot is doing (meta.status picks this for a pilot run dir).

Read-only like the search's status, and from the files meta.pilot writes (docs/run_directory.md "A pilot"): how many
of the pilot's runs are final; per (radius, coef) combination its runs' states and GPU time; for every combination not
final yet (every one with --all) one line per run in the plan's order (the centre's seeds, then each antithetic pair's
plus and minus runs), the same rows as a search's members (meta/search/member_rows.py); over all runs, which share one
runner, the GPU time so far and an ETA; and where the findings are.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from meta.search.member_rows import (GpuUse, MemberRow, eta_text, gpu_hours, gpu_use, is_final, member_rows,
                                     orchestrator_line, row_line, rows_eta, run_queue, state_summary)
from meta.pilot.findings import CENTRE, FULL_HORIZON, PLUS, main_runs
from meta.settings.upgrade import stored_config
from results.store.layout import JOBS_FILE
from results.store.run_store import RunStore, read_jobs_file


def run_label(member: Mapping[str, Any]) -> str:
    """A run's label: its index (its member_NNN/ in pilot_runs/) and its role in the design (centre or pair i's plus
    or minus init, on seed number s of the seeds every init shares)."""
    role = "centre" if member["role"] == CENTRE else f"pair {member['pair']} {'+' if member['role'] == PLUS else '-'}"
    full = " at train.steps (horizon check)" if member.get("horizon") == FULL_HORIZON else ""
    return f"run {member['index']:03d} {role} seed {member['seed_index']}{full}"


def _setting(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def _progress(rows: list[MemberRow], use: GpuUse) -> str:
    """How far a set of runs got: final of all, per state, and their GPU time."""
    final = sum(map(is_final, rows))
    return f"{final}/{len(rows)} final ({state_summary(rows)}) | GPU time {gpu_hours(rows, use):.2f} h"


def render_pilot(run_dir: str | Path, show_all: bool = False, now: float | None = None) -> str:
    """The status text of a pilot run dir; ``show_all`` adds the runs of combinations already final."""
    store = RunStore(run_dir)
    now = time.time() if now is None else now
    plan = store.read_pilot_plan()
    if plan is None:  # killed (or still starting) before its first submission
        return (f"pilot run {store.root}: no pilot_plan.json yet (meta.pilot writes it before its first submission)\n"
                f"{orchestrator_line(store)}\n")
    raw = stored_config(store)
    use = gpu_use(raw)
    queue = run_queue(raw)
    members = plan["members"]
    jobs = read_jobs_file(store.pilot_runs_dir / JOBS_FILE)
    rows = member_rows([(run_label(m), int(m["index"]), Path(m["work_dir"])) for m in members], jobs, queue, now)
    combinations = plan["combinations"]
    lines = [f"pilot run {store.root}: {len(combinations)} combination(s) x {len(plan['seeds'])} seeds x (centre + "
             f"{len(plan['directions'])} antithetic pair(s)) = {main_runs(plan)} runs", orchestrator_line(store)]
    groups = [(f"combination {j}: radius {_setting(combo['radius'])} (es.{plan['radius_key']}), divergence.coef "
               f"{_setting(combo['coef'])}", [row for row, m in zip(rows, members)
                                              if m["combination"] == j and not m.get("horizon")])
              for j, combo in enumerate(combinations)]
    if plan.get("horizon"):
        horizon = plan["horizon"]
        lines[0] += f" (es.member_steps={horizon['member_steps']}) + the horizon check's runs"
        groups.append((f"horizon check: combination 0's runs again at train.steps={horizon['steps']}",
                       [row for row, m in zip(rows, members) if m.get("horizon")]))
    if plan.get("truncation"):  # es=nres: whole particle runs, validated at every truncation's end
        lines[0] += (f", each validated every {plan['truncation']['steps']} of its {plan['truncation']['horizon']} "
                     "steps (the truncation check)")
    for title, mine in groups:
        lines.append(f"{title}: {_progress(mine, use)}")
        if show_all or not all(map(is_final, mine)):
            lines.extend(row_line(row, use) for row in mine)
    complete = all(map(is_final, rows))
    eta = "done" if complete else eta_text(rows_eta(rows, queue.parallel))
    lines.append(f"all runs: {_progress(rows, use)} | {eta}")
    if (store.read_pilot() or {}).get("complete"):
        lines.append(f"findings: {store.pilot_path} (python -m results.report {store.root})")
    else:
        lines.append(f"findings: complete once every run is final; python -m results.report {store.root} shows what "
                     "the final runs say so far")
    return "\n".join(lines) + "\n"

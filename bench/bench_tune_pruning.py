"""Pruning in meta.tune: member-steps and wall time with tune.pruner=median side by side with tune.pruner=none, on the
embedded default (tiny model, arith, real training runs), coef x learning rate.

Both arms draw the same trials (tune.sampler=random with the same seed: each slot's sampler seed is the same, and a
random draw does not depend on earlier results), so the only difference is which runs the pruner stops. Printed
per arm: trials complete / pruned, member-steps trained (a pruned run counts the steps it reached, from its
progress.json), wall time, the best trial and its value; then the ratios, and whether the pruned arm kept the
unpruned arm's best trial (the same slot, so the same params and, on the same machine, the same value).

    .venv/bin/python bench/bench_tune_pruning.py --trials 10 --parallel 2 --eval-every 15
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meta.tune.trials import trial_dir  # noqa: E402
from results.store.layout import PROGRESS_FILE, TRIAL_FILE  # noqa: E402
from results.store.study_store import SLOT_ATTR, load_study  # noqa: E402


def _run_arm(run_dir: Path, opts: argparse.Namespace, pruner: str) -> float:
    command = [sys.executable, "-m", "meta.tune", f"run_dir={run_dir}", "launcher=local", "seed=0",
               "tune.sampler=random", f"tune.trials={opts.trials}", f"tune.parallel={opts.parallel}",
               f"tune.pruner={pruner}", f"train.eval_every={opts.eval_every}", "log_level=WARNING"]
    if pruner != "none":
        command.append(f"tune.pruner_options={{n_startup_trials: {opts.startup}}}")
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"arm pruner={pruner} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def _figures(run_dir: Path, wall_s: float) -> dict:
    study = load_study(run_dir)
    steps, by_slot = 0, {}
    for t in study.trials:
        plan = json.loads((trial_dir(run_dir, t.number) / TRIAL_FILE).read_text())
        for member in plan["members"]:
            steps += json.loads((Path(member["work_dir"]) / PROGRESS_FILE).read_text())["step"]
        by_slot[t.user_attrs[SLOT_ATTR]] = (t.state.name, t.value)
    complete = {slot: v for slot, (state, v) in by_slot.items() if state == "COMPLETE"}
    best_slot = max(complete, key=lambda s: (complete[s], -s))
    return {"complete": len(complete), "pruned": sum(1 for s, _ in by_slot.values() if s == "PRUNED"),
            "member_steps": steps, "wall_s": wall_s, "best_slot": best_slot, "best_value": complete[best_slot],
            "by_slot": by_slot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=15)
    parser.add_argument("--startup", type=int, default=3, help="median pruner's n_startup_trials")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as tmp:
        arms = {}
        for pruner in ("none", "median"):
            run_dir = Path(tmp) / pruner
            arms[pruner] = _figures(run_dir, _run_arm(run_dir, opts, pruner))
    base, pruned = arms["none"], arms["median"]
    print(f"{'':>8} {'complete':>8} {'pruned':>6} {'member-steps':>12} {'wall s':>8} {'best slot':>9} {'best':>7}")
    for name, a in arms.items():
        print(f"{name:>8} {a['complete']:>8} {a['pruned']:>6} {a['member_steps']:>12} {a['wall_s']:>8.0f} "
              f"{a['best_slot']:>9} {a['best_value']:>7.4f}")
    print(f"member-steps median/none: {pruned['member_steps'] / base['member_steps']:.2f}x; "
          f"wall median/none: {pruned['wall_s'] / base['wall_s']:.2f}x")
    kept = pruned["by_slot"].get(base["best_slot"])
    print(f"unpruned arm's best (slot {base['best_slot']}, {base['best_value']:.4f}) in the pruned arm: {kept}; "
          f"same best trial: {pruned['best_slot'] == base['best_slot'] and pruned['best_value'] == base['best_value']}")
    print("per slot (state, value), none | median:")
    for slot in sorted(base["by_slot"]):
        print(f"  {slot:>2}: {base['by_slot'][slot]} | {pruned['by_slot'].get(slot)}")


if __name__ == "__main__":
    main()

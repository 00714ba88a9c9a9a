"""Scale benchmark of launcher=slurm on the local cluster: one generation of light synthetic members
(sleep S seconds, no torch) through SlurmLauncher + MemberArrayRunner, against the same number of bare
`sbatch --array` tasks running `sleep S`, waited for with squeue, side by side in one run.

Reports per-generation wall, overhead (wall minus the slowest member), the ratio of the two walls, and
the number of scheduler queries (sacct + squeue) each side made, counted by PATH shims around the SLURM
client commands, so submitit's own calls are counted too.

    .venv/bin/python bench/bench_slurm_scale.py --population 180 --sleep 10
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launch.runner import MemberArrayRunner, RunnerPolicy  # noqa: E402
from launch.slurm import SlurmLauncher  # noqa: E402
from results.records import MemberSpec  # noqa: E402

COUNTED = ("sacct", "squeue", "sbatch", "scancel", "scontrol")


def real_commands() -> dict[str, str]:
    """Paths of the SLURM clients, resolved before the shims go first on PATH."""
    found = {name: shutil.which(name) for name in COUNTED}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise SystemExit(f"{missing} not found: start the cluster with launch/local_slurm/up.sh")
    return {name: str(path) for name, path in found.items()}


def install_shims(shim_dir: Path, log: Path, reals: dict[str, str]) -> None:
    """A wrapper per SLURM client that logs its name, then runs the real command."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    for name, real in reals.items():
        shim = shim_dir / name
        shim.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)


def count_calls(log: Path) -> dict[str, int]:
    names = log.read_text().split() if log.exists() else []
    return {name: names.count(name) for name in COUNTED}


def max_array_size() -> int:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return int(next(line.split("=")[1] for line in out.splitlines() if line.startswith("MaxArraySize")))


def run_bare(population: int, sleep_s: float, work: Path, poll_s: float) -> float:
    """sbatch --array chunks of `sleep S`, then squeue until none of them is queued or running."""
    chunk = max_array_size()
    start = time.monotonic()
    ids = []
    for first in range(0, population, chunk):
        n = min(chunk, population - first)
        out = subprocess.run(
            ["sbatch", "--parsable", f"--array=0-{n - 1}", "--cpus-per-task=1", "--job-name=bench-bare",
             f"--output={work}/bare-%A_%a.out", "--wrap", f"sleep {sleep_s}"],
            capture_output=True, text=True, check=True,
        ).stdout
        ids.append(out.strip().split(";")[0])
    while subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i"], capture_output=True, text=True).stdout.strip():
        time.sleep(poll_s)
    return time.monotonic() - start


def run_launcher(population: int, sleep_s: float, work: Path) -> tuple[float, float]:
    """One generation through the real launcher with its default polling; returns (wall, slowest member)."""
    specs = [
        MemberSpec(run_id="bench", generation=0, index=i, seed=0, params=[0.02] * 4,
                   work_dir=str(work / f"member_{i:03d}"), inner={"options": {"sleep_s": sleep_s}})
        for i in range(population)
    ]
    launcher = SlurmLauncher(job_name="bench-launcher")
    runner = MemberArrayRunner(launcher, "meta.synthetic:member", specs, {}, lambda jobs: None, work / "submitit",
                               RunnerPolicy(retries=0, timeout_s=600))
    start = time.monotonic()
    records = runner.run()
    wall = time.monotonic() - start
    bad = [i for i, r in records.items() if not r.ok]
    if bad:
        raise SystemExit(f"members {bad[:5]} failed: {records[bad[0]].error[-500:]}")
    return wall, max(r.wall_time_s for r in records.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=180)
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--bare-poll", type=float, default=1.0, help="squeue interval of the bare baseline (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench_slurm_") as tmp:
        tmp_path = Path(tmp)
        shims = tmp_path / "shims"
        reals = real_commands()
        os.environ["PATH"] = f"{shims}:{os.environ['PATH']}"
        cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0]

        install_shims(shims, tmp_path / "bare.log", reals)
        bare_wall = run_bare(args.population, args.sleep, tmp_path, args.bare_poll)
        bare_calls = count_calls(tmp_path / "bare.log")

        install_shims(shims, tmp_path / "launcher.log", reals)
        wall, slowest = run_launcher(args.population, args.sleep, tmp_path / "run")
        calls = count_calls(tmp_path / "launcher.log")

    queries = calls["sacct"] + calls["squeue"]
    bare_queries = bare_calls["sacct"] + bare_calls["squeue"]
    print(f"population {args.population} x sleep {args.sleep:g} s on a cluster advertising {cpus} CPUs "
          f"(MaxArraySize {max_array_size()})")
    print(f"{'':28s}{'wall s':>9s}{'overhead s':>12s}{'sacct':>7s}{'squeue':>7s}{'sbatch':>7s}{'queries/10s':>13s}")
    print(f"{'bare sbatch --array + squeue':28s}{bare_wall:9.1f}{bare_wall - args.sleep:12.1f}"
          f"{bare_calls['sacct']:7d}{bare_calls['squeue']:7d}{bare_calls['sbatch']:7d}{10 * bare_queries / bare_wall:13.2f}")
    print(f"{'launcher=slurm (runner)':28s}{wall:9.1f}{wall - slowest:12.1f}"
          f"{calls['sacct']:7d}{calls['squeue']:7d}{calls['sbatch']:7d}{10 * queries / wall:13.2f}")
    print(f"ratio launcher/bare wall: {wall / bare_wall:.3f}  (slowest member {slowest:.1f} s)")


if __name__ == "__main__":
    main()

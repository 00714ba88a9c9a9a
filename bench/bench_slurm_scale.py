"""Scale benchmark of launcher=slurm on the local cluster: one generation of light synthetic members (sleep S
seconds, no torch), side by side in one run with the same number of bare ``sbatch --array`` tasks waited for
with ``squeue``, asking for the same resources (the launcher's time limit and CPUs per task). Sides
(``--sides``, run in this order):

- ``bare-sleep``: each task is ``sleep S`` (no Python at all: the floor);
- ``bare-member``: each task runs the same member work in plain Python (bench/bare_member.py:
  ``run_member`` on the same spec, the same result.json), with no submitit, no pickles, no srun;
- ``launcher``: SlurmLauncher + MemberArrayRunner with the shipped defaults (``launcher.use_srun=false``);
- ``launcher-srun``: the same with ``launcher.use_srun=true`` (each member a job step under srun).

Per side: wall, the slowest member's own time, wall minus it (``-slowest``: the per-generation overhead with
several waves' queueing in it), overhead (wall minus the ideal ``waves x S``, where waves = population /
advertised CPUs rounded up), scheduler queries (sacct + squeue) counted by PATH shims around the
SLURM clients (submitit's own calls included) and per 10 s, and the CPU seconds the whole machine spent per
member (from /proc/stat, so slurmd/slurmstepd and the members' interpreters count) and the CPU seconds of the
orchestrating process itself (this process with its SLURM client calls). Ratios of every side's wall
to both bare walls close the table.

    .venv/bin/python bench/bench_slurm_scale.py --population 180 --sleep 10 [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launch.runner import MemberArrayRunner, RunnerPolicy  # noqa: E402
from launch.slurm.launcher import SlurmLauncher  # noqa: E402
from results.store.layout import LAUNCHER_DIR, member_dir_name  # noqa: E402
from core.records import MemberSpec
from results.store.member_files import read_result  # noqa: E402

COUNTED = ("sacct", "squeue", "sbatch", "scancel", "scontrol", "srun")
SIDES = ("bare-sleep", "bare-member", "launcher", "launcher-srun")
ENTRYPOINT = "meta.synthetic:member"
MEMBER_TIMEOUT_S = 600.0  # inner.timeout_s of every side's members; the launcher derives --time from it


@dataclass
class SideResult:
    name: str
    wall_s: float
    slowest_s: float
    calls: dict[str, int]
    cpu_s: float  # the whole machine's busy CPU seconds during the side
    own_cpu_s: float  # this process and its children (the orchestrator, sbatch/sacct/squeue calls)

    @property
    def queries(self) -> int:
        return self.calls["sacct"] + self.calls["squeue"]


def real_commands() -> dict[str, str]:
    """Paths of the SLURM clients, resolved before the shims go first on PATH."""
    found = {name: shutil.which(name) for name in COUNTED}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise SystemExit(f"{missing} not found: start the cluster with scripts/local_slurm/up.sh")
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


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all processes, all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (the SLURM client calls)."""
    return sum(ru.ru_utime + ru.ru_stime for ru in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))


def cluster_setting(key: str) -> str:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return next(line.split("=", 1)[1].strip() for line in out.splitlines() if line.split("=")[0].strip() == key)


def make_specs(population: int, sleep_s: float, work: Path) -> list[MemberSpec]:
    return [
        MemberSpec(run_id="bench", generation=0, index=i, seed=0, params=[0.02] * 4,
                   work_dir=str(work / member_dir_name(i)), inner={"options": {"sleep_s": sleep_s}})
        for i in range(population)
    ]


def slowest_member(specs: list[MemberSpec]) -> float:
    records = [read_result(spec.work_dir) for spec in specs]
    bad = [spec.index for spec, record in zip(specs, records) if record is None or not record.ok]
    if bad:
        raise SystemExit(f"members {bad[:5]} did not finish ok")
    return max(record.wall_time_s for record in records if record is not None)


def bare_resources() -> list[str]:
    """The launcher's own resource request (time limit, CPUs per task) as sbatch options, so that both sides
    ask SLURM for the same thing: on this cluster a time-limited array's next wave starts up to one
    ``sched_interval`` later than an unlimited one's, which is SLURM's cost, not the launcher's."""
    params = SlurmLauncher().config.sbatch_parameters(MEMBER_TIMEOUT_S)
    return [f"--time={params['time']}", f"--cpus-per-task={params['cpus_per_task']}"]


def run_bare(command: str, population: int, work: Path, poll_s: float) -> float:
    """sbatch --array chunks of at most MaxArraySize tasks running ``command`` (``{offset}`` = the chunk's
    first index), then squeue every ``poll_s`` until none of them is queued or running."""
    chunk = int(cluster_setting("MaxArraySize"))
    start = time.monotonic()
    ids = []
    for first in range(0, population, chunk):
        n = min(chunk, population - first)
        out = subprocess.run(
            ["sbatch", "--parsable", f"--array=0-{n - 1}", *bare_resources(), "--job-name=bench-bare",
             f"--output={work}/bare-%A_%a.out", "--wrap", command.format(offset=first)],
            capture_output=True, text=True, check=True,
        ).stdout
        ids.append(out.strip().split(";")[0])
    while subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i"], capture_output=True, text=True).stdout.strip():
        time.sleep(poll_s)
    return time.monotonic() - start


def run_side(name: str, population: int, sleep_s: float, work: Path, bare_poll_s: float) -> tuple[float, float]:
    """Run one side; returns (wall, slowest member's own time)."""
    work.mkdir(parents=True)
    if name == "bare-sleep":
        return run_bare(f"sleep {sleep_s}", population, work, bare_poll_s), sleep_s
    specs = make_specs(population, sleep_s, work)
    if name == "bare-member":
        specs_file = work / "specs.json"
        specs_file.write_text(json.dumps([spec.to_dict() for spec in specs]))
        command = f"exec {sys.executable} {ROOT / 'bench' / 'bare_member.py'} {specs_file} {{offset}}"
        wall = run_bare(command, population, work, bare_poll_s)
        return wall, slowest_member(specs)
    launcher = SlurmLauncher(job_name=f"bench-{name}", use_srun=name == "launcher-srun")
    runner = MemberArrayRunner(launcher, ENTRYPOINT, specs, {}, lambda jobs: None, work / LAUNCHER_DIR,
                               RunnerPolicy(retries=0, timeout_s=MEMBER_TIMEOUT_S))
    start = time.monotonic()
    runner.run()
    wall = time.monotonic() - start
    return wall, slowest_member(specs)


def print_table(results: list[SideResult], population: int, sleep_s: float, cpus: int) -> None:
    waves = math.ceil(population / cpus)
    ideal = waves * sleep_s
    logging.info("population %d x sleep %g s on a cluster advertising %d CPUs (%d real cores, MaxArraySize %s): "
                 "%d wave(s), ideal wall %g s", population, sleep_s, cpus, os.cpu_count(),
                 cluster_setting("MaxArraySize"), waves, ideal)
    header = (f"{'side':14s}{'wall s':>8s}{'slowest':>9s}{'-slowest':>9s}{'overhead':>10s}{'/wave':>7s}{'sacct':>7s}"
              f"{'squeue':>7s}{'sbatch':>7s}{'srun':>6s}{'q/10s':>7s}{'cpu/member':>12s}{'orchestrator cpu':>18s}")
    lines = [header]
    for r in results:
        overhead = r.wall_s - ideal
        lines.append(f"{r.name:14s}{r.wall_s:8.1f}{r.slowest_s:9.1f}{r.wall_s - r.slowest_s:9.1f}"
                     f"{overhead:10.1f}{overhead / waves:7.2f}"
                     f"{r.calls['sacct']:7d}{r.calls['squeue']:7d}{r.calls['sbatch']:7d}{r.calls['srun']:6d}"
                     f"{10 * r.queries / r.wall_s:7.2f}{r.cpu_s / population:12.3f}{r.own_cpu_s:18.1f}")
    by_name = {r.name: r for r in results}
    for base in ("bare-sleep", "bare-member"):
        if base in by_name:
            ratios = "  ".join(f"{r.name} {r.wall_s / by_name[base].wall_s:.3f}" for r in results if r.name != base)
            lines.append(f"wall ratio to {base}: {ratios}")
    logging.info("\n%s", "\n".join(lines))


def print_medians(rounds: list[list[SideResult]]) -> None:
    """Median wall per side and median of each round's wall ratios: one round on 2 shared cores varies by
    several percent, more than the differences this benchmark is after."""
    lines = [f"over {len(rounds)} rounds (median; min-max):"]
    names = [r.name for r in rounds[0]]
    for i, name in enumerate(names):
        walls = [rnd[i].wall_s for rnd in rounds]
        lines.append(f"  {name:14s} wall {statistics.median(walls):7.1f} s ({min(walls):.1f}-{max(walls):.1f})")
    for base in ("bare-sleep", "bare-member"):
        if base not in names:
            continue
        b = names.index(base)
        for i, name in enumerate(names):
            if i != b:
                ratios = [rnd[i].wall_s / rnd[b].wall_s for rnd in rounds]
                lines.append(f"  {name} / {base}: {statistics.median(ratios):.3f} "
                             f"({min(ratios):.3f}-{max(ratios):.3f})")
    logging.info("\n%s", "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=180)
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--bare-poll", type=float, default=1.0, help="squeue interval of the bare baselines (s)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all sides (order rotated each round)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("launch", "submitit"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        raise SystemExit(f"--sides: unknown side(s) {unknown}; choose from {', '.join(SIDES)}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")

    reals = real_commands()
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, check=True).stdout.split()[0])
    rounds: list[list[SideResult]] = []
    with tempfile.TemporaryDirectory(prefix="bench_slurm_") as tmp:
        tmp_path = Path(tmp)
        shims = tmp_path / "shims"
        os.environ["PATH"] = f"{shims}:{os.environ['PATH']}"
        for repeat in range(args.repeats):
            # rotate the order each round, so no side always runs first on a freshly idle cluster
            order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
            results = {}
            for name in order:
                log = tmp_path / f"{name}-{repeat}.calls"
                install_shims(shims, log, reals)
                cpu_before, own_before = busy_cpu_s(), own_cpu_s()
                wall, slowest = run_side(name, args.population, args.sleep, tmp_path / f"{name}-{repeat}",
                                         args.bare_poll)
                results[name] = SideResult(name, wall, slowest, count_calls(log), busy_cpu_s() - cpu_before,
                                           own_cpu_s() - own_before)
                logging.info("round %d, %s: %.1f s", repeat + 1, name, wall)
            rounds.append([results[name] for name in sides])
            print_table(rounds[-1], args.population, args.sleep, cpus)
    if len(rounds) > 1:
        print_medians(rounds)

if __name__ == "__main__":
    main()

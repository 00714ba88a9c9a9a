"""What the fork server saves a pinned member: the same tiny-preset member started fresh and forked, side by side.

Each member is a pinned child asked of this process (torch loaded here under native numerics, as in the debug
launcher, a test, or a local job's light process), through the member entry point: ``fresh`` starts a new interpreter
(imports torch, transformers, PEFT and TRL), ``forked`` is forked from a fork server (inner_loop/process/fork_server.py)
started once, before the rounds. Interleaved over several rounds so background load hits both alike. Prints per
variant the median wall time of a member (start to record) and the machine's CPU seconds over it (/proc/stat: a forked
child is not this process's child, so its own usage cannot be read here), the member's own wall (training +
validation), and forked / fresh ratios.

    .venv/bin/python bench/bench_fork_server.py [--steps 2] [--rounds 4]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import inner_loop.process.fork_server as fork_server  # noqa: E402

logger = logging.getLogger("bench_fork_server")
VARIANTS = ("fresh", "forked")


def _machine_cpu_s() -> float:
    """CPU seconds all cores spent busy so far (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[k]) for k in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def _inner(steps: int) -> dict:
    """The tiny preset's member config, composed as `python -m inner_loop.run experiment=tiny_arith` composes it."""
    from hydra import compose, initialize_config_dir

    from inner_loop.run import CONF_DIR, spec_from_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="inner", overrides=["experiment=tiny_arith", f"train.steps={steps}",
                                                      "train.report_to=[]", "work_dir=unused"])
    return spec_from_config(cfg).inner


def _member(variant: str, work_dir: Path, inner: dict, server: str) -> tuple[float, float, float]:
    """(wall s, machine CPU s, the member's own wall s) of one member of ``variant``."""
    from inner_loop.member.entry import train_member

    if variant == "forked":
        os.environ[fork_server.SERVER_ENV] = server
    else:
        os.environ.pop(fork_server.SERVER_ENV, None)
    spec = {"run_id": "bench", "generation": 0, "index": 0, "seed": 0, "params": [], "work_dir": str(work_dir),
            "inner": inner}
    cpu, start = _machine_cpu_s(), time.monotonic()
    record = train_member(spec)
    wall, cpu = time.monotonic() - start, _machine_cpu_s() - cpu
    if record.status != "ok":
        raise RuntimeError(f"{variant} member failed: {record.error[-2000:]}")
    return wall, cpu, record.wall_time_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    import torch  # noqa: F401  (loaded here under native numerics: every pinned member is a child process)

    inner = _inner(opts.steps)
    figures: dict[str, list[tuple[float, float, float]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MIRROR_ES_CACHE"] = str(Path(tmp) / "cache")
        with fork_server.serving() as server:
            if server is None:
                raise SystemExit("no fork server on this machine (Linux with AVX2 and FMA needed)")
            _member("fresh", Path(tmp) / "warm", inner, server)  # the warm-up, built once, not timed
            while not os.path.exists(server):
                time.sleep(0.1)
            for round_ in range(opts.rounds):
                for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                    figures[variant].append(_member(variant, Path(tmp) / f"{variant}-{round_}", inner, server))
                    logger.info("round %d %-6s wall %.2f s, machine CPU %.2f s, member's own wall %.2f s", round_,
                                variant, *figures[variant][-1])
    median = {variant: [statistics.median(column) for column in zip(*rows)] for variant, rows in figures.items()}
    for variant in VARIANTS:
        logger.info("%-6s median: wall %.2f s, machine CPU %.2f s, member's own wall %.2f s", variant,
                    *median[variant])
    logger.info("forked / fresh: wall %.2fx, machine CPU %.2fx", median["forked"][0] / median["fresh"][0],
                median["forked"][1] / median["fresh"][1])


if __name__ == "__main__":
    main()

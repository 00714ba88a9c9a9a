"""One task of bench_slurm_scale.py's "bare member" baseline: the work of a launcher=slurm member without
the launcher. A plain ``sbatch --array`` task runs this file, which calls the same ``run_member`` on the same
kind of spec and writes the same result.json, but with no submitit job wrapper, no pickles and no srun.

    python bench/bare_member.py SPECS_JSON OFFSET    # runs spec OFFSET + $SLURM_ARRAY_TASK_ID

Kept apart from the benchmark so that each task imports only what a member needs.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.member import run_member  # noqa: E402

ENTRYPOINT = "meta.synthetic:member"


def main() -> None:
    specs_file, offset = sys.argv[1], int(sys.argv[2])
    specs = json.loads(Path(specs_file).read_text())
    spec = specs[offset + int(os.environ["SLURM_ARRAY_TASK_ID"])]
    record = run_member(ENTRYPOINT, spec, timeout_s=600.0)
    if record["status"] != "ok":
        raise SystemExit(f"member {spec['index']} ended {record['status']}: {record.get('error', '')[-300:]}")


if __name__ == "__main__":
    main()

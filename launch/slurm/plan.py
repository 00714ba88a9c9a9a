"""``launcher=slurm``'s part of a dry-run plan: arrays per generation, packing, members at once, the time limit and
the sbatch script of the first array, all from the validated options (launch/slurm/options.py) and nothing asked of
the cluster.

Why here: the plan of a search (meta/search/plan.py) asks every launcher the same one question (Launcher.plan); what an
array or a shard is belongs to this backend alone.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Mapping

from launch.base import LauncherPlan, PlanContext
from launch.slurm.options import SlurmOptions
from core.gpu_time import GpuSharing
from core.notice_window import notice_shortfall

#: SLURM's default MaxArraySize; a dry run asks no scheduler, so without launcher.max_array_size it assumes this
DEFAULT_MAX_ARRAY_SIZE = 1001


def arrays(options: SlurmOptions, raw_chunk: Any, members: int) -> tuple[list[int], str]:
    """Sizes of the arrays one generation of ``members`` is split into, and where the split size came from."""
    chunk, source = raw_chunk, "launcher.max_array_size"
    if chunk is None:
        chunk = DEFAULT_MAX_ARRAY_SIZE
        source = (f"the cluster's MaxArraySize is not asked in a dry run: assumed {chunk} (SLURM's default; "
                  "set launcher.max_array_size to your cluster's value)")
    total = -(-members // options.members_per_task)  # array tasks
    return [min(int(chunk), total - start) for start in range(0, total, int(chunk))], source


def packing_lines(options: SlurmOptions) -> list[str]:
    """How k members share a GPU: packed into one array task, or each its part of the site's shards."""
    k = options.members_per_gpu
    if k == 1:
        return []
    mem = f"{options.mem_gb * k:g} GB" if options.mem_gb is not None else "the cluster's default memory"
    if options.gpu_sharing == "shard":
        return [f"launcher.gpu_sharing=shard: one member per task, each asking for {options.shards_per_gpu // k} of a "
                f"GPU's {options.shards_per_gpu} shards (--gres=shard:{options.shards_per_gpu // k})"]
    return [f"launcher.gpu_sharing=packed: {k} members per array task (an antithetic pair together), each in its own "
            f"process with its own work dir, record and log; a task holds {options.gpus_per_node} GPU, "
            f"{options.cpus_per_task * k} CPUs and {mem} ({k} x a member's)"]


def notice_lines(resources: Mapping[str, Any], sharing: GpuSharing, delay_s: float) -> list[str]:
    """A warning when the time-limit signal, ``delay_s`` before the limit, cannot cover a member's step (the measured
    ``resources.step_time_s`` x the sharing's slowdown) and a save: its save on that notice would never happen."""
    step_s = resources.get("step_time_s")
    if not isinstance(step_s, (int, float)) or isinstance(step_s, bool) or step_s <= 0:
        return []
    shortfall = notice_shortfall(float(step_s) * sharing.slowdown, float(delay_s))
    return [f"WARNING: {shortfall}"] if shortfall else []


def sbatch_script(options: SlurmOptions, timeout_s: float, folder: Path, generation: int, array_size: int,
                  run_id: str) -> str:
    """The sbatch script of one array, as submitit writes it (its own writer; nothing is submitted)."""
    from submitit.slurm.slurm import SlurmJobEnvironment, _make_sbatch_string

    from launch.slurm.chunks import chunk_job_name

    params = options.sbatch_parameters(timeout_s, SlurmJobEnvironment.USR_SIG)
    params["job_name"] = chunk_job_name(options.job_name, run_id, generation, 0)
    python = options.python_command(shlex.quote(sys.executable))
    command = f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return _make_sbatch_string(command=command, folder=folder, map_count=array_size, **params)


def slurm_plan(options_node: Mapping[str, Any], context: PlanContext) -> LauncherPlan:
    """The SLURM section of the plan and its figures (Launcher.plan)."""
    options = SlurmOptions.from_options(options_node)
    per_generation = context.members_per_generation
    parallel = int(options_node.get("array_parallelism") or per_generation)
    concurrent = min(per_generation, parallel * options.members_per_task)
    sizes, source = arrays(options, options_node.get("max_array_size"), per_generation)
    listed = ", ".join(f"{n} tasks (--array=0-{n - 1}%{min(n, parallel)})" for n in sizes)
    timeout_s = context.inner_timeout_s
    delay = options.signal_delay(timeout_s)
    lines = [
        "",
        f"arrays per generation: {len(sizes)}: {listed}; split size from {source}",
        f"arrays in total: {len(sizes) * context.generations} over {context.generations} generation(s); at most "
        f"{concurrent} members of a generation run at once",
        *packing_lines(options),
        f"one SLURM run: --time={options.time_limit_min(timeout_s)} min, requeued up to launcher.requeues="
        f"{options.requeues} times (the requeue signal {delay} s before the limit)",
        *notice_lines(context.resources, context.sharing, delay),
    ]
    if context.launcher_dir is not None:
        lines += [
            "",
            "sbatch script of the first array (as submitit writes it; arrays are named "
            f"{options.job_name}.<run id>.g<generation>.c<chunk>):",
            sbatch_script(options, timeout_s, context.launcher_dir, context.first_generation, sizes[0],
                          context.run_id) if sizes else "(no members)",
        ]
    mem = options.mem_gb
    gpus = int(options.gpus_per_node or 0)
    return LauncherPlan(
        lines=tuple(lines), concurrent=concurrent, gpus=gpus, gpus_held=gpus, cpus=int(options.cpus_per_task or 1),
        mem_gb=mem, mem_text=f"{mem:g} GB" if mem is not None else "the cluster's default (launcher.mem_gb=null)")

"""How many CPUs this job may really use: the tightest of its affinity mask, SLURM's allocation and the cgroup quota.

Kept apart from the sandbox (its one user today) because it answers a question about the job, not about running
programs: a 1-CPU member on a 128-core node must size its worker pool to 1 CPU, whichever of the three limits
the cluster enforces.
"""
from __future__ import annotations

import os

_CGROUP_ROOT = "/sys/fs/cgroup"


def usable_cpus() -> int:
    """CPUs this job may really use: the least of its affinity mask, SLURM_CPUS_PER_TASK and the cgroup's CPU
    quota. Each can be the binding one (a cpuset-less SLURM, a container with a quota but every core visible),
    and os.cpu_count() - the whole node - is only the last resort."""
    try:
        limits = [len(os.sched_getaffinity(0))]
    except (AttributeError, OSError):
        limits = [os.cpu_count() or 1]
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        limits.append(int(slurm))
    quota = cgroup_cpu_limit(_own_cpu_max_file())
    if quota is None:
        quota = cgroup_v1_cpu_limit(_own_cgroup_v1_cpu_dir())
    if quota is not None:
        limits.append(quota)
    return max(1, min(limits))


def _own_cgroup_paths() -> dict[str, str]:
    """Controller ("" for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    paths: dict[str, str] = {}
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for controller in controllers.split(","):
            paths.setdefault(controller, path.lstrip("/"))
    return paths


def _own_cpu_max_file() -> str | None:
    """This process's cgroup v2 cpu.max, or None where there is none (cgroup v1, no cgroupfs)."""
    path = _own_cgroup_paths().get("")
    candidates = [os.path.join(_CGROUP_ROOT, path, "cpu.max")] if path is not None else []
    candidates.append(os.path.join(_CGROUP_ROOT, "cpu.max"))  # a container sees its own cgroup as the root
    return next((candidate for candidate in candidates if os.path.isfile(candidate)), None)


def _own_cgroup_v1_cpu_dir() -> str | None:
    """This process's cgroup v1 cpu controller directory (mounted as cpu or cpu,cpuacct), or None."""
    path = _own_cgroup_paths().get("cpu")
    if path is None:
        return None
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for candidate in (os.path.join(_CGROUP_ROOT, mount, path), os.path.join(_CGROUP_ROOT, mount)):
            if os.path.isfile(os.path.join(candidate, "cpu.cfs_quota_us")):
                return candidate
    return None


def cgroup_v1_cpu_limit(cpu_dir: str | None) -> int | None:
    """Whole CPUs a cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us pair allows, rounded up; None for no limit
    (quota -1) or unreadable files."""
    if cpu_dir is None:
        return None
    try:
        with open(os.path.join(cpu_dir, "cpu.cfs_quota_us")) as f:
            quota = f.read().strip()
        with open(os.path.join(cpu_dir, "cpu.cfs_period_us")) as f:
            period = f.read().strip()
    except OSError:
        return None
    if not quota.isdigit() or not period.isdigit() or int(quota) <= 0 or int(period) <= 0:
        return None
    return max(1, -(-int(quota) // int(period)))


def cgroup_cpu_limit(cpu_max_path: str | None) -> int | None:
    """Whole CPUs a cgroup v2 `cpu.max` ("<quota> <period>" or "max <period>") allows, rounded up; None for
    no limit or an unreadable file (then the other limits decide)."""
    if cpu_max_path is None:
        return None
    try:
        with open(cpu_max_path) as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max" or not all(field.isdigit() for field in fields):
        return None
    quota, period = int(fields[0]), int(fields[1])
    if quota <= 0 or period <= 0:
        return None
    return max(1, -(-quota // period))

"""Pre-flight: what a member checks on its node before it loads a model, and the submitting host checks before the
first submission: the sandbox isolates (a real program through the real sandbox), the staged files are readable, and
the checkpoint directory has room for a checkpoint.

Why before the model: a node that cannot isolate the sandbox used to fail every member only after the model load and
the first batch of completions, GPU-minutes later, and then the member was retried on the same node. A failure here
names the node and the cause, and ends the job WITHOUT a result (``PreflightError`` is a BaseException, so it passes
the ``except Exception`` of the member's own error handling and of the job wrapper): the launcher counts the job as
lost, resubmits it (on SLURM with this node excluded, at most ``launcher.max_lost_resubmits`` times) and the member's
init is never charged for the node's fault. The failure is also written to the member directory
(results.store.layout.PREFLIGHT_FILE) so that the launcher can tell which node to exclude.
"""
from __future__ import annotations

import logging
import os
import platform
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from inner_loop.member.compute_mode import sharing_refusal
from inner_loop.sandbox.isolation import counts_whole_user, user_tasks
from results.store.atomic import atomic_write_json
from results.store.layout import PREFLIGHT_FILE
from results.store.node_failure import node_name, read_node_failure

logger = logging.getLogger(__name__)

#: forks the probe program makes inside the sandbox (a program that spawns a helper process needs at least this)
PROBE_FORKS = 2
#: room kept free beyond one checkpoint (logs, progress files, a result), bytes
ROOM_MARGIN_BYTES = 512 << 20
#: one checkpoint as a multiple of the base weights' bytes: full fine-tuning saves the weights and Adam's two
#: moments in float32 (up to 5x bfloat16 weights); a LoRA checkpoint holds the adapter and its moments (a LoRA of
#: r=64 on every projection of Qwen3-1.7B is ~2% of the weights; 0.5 leaves room for larger ranks)
CHECKPOINT_FACTOR_FULL = 5.0
CHECKPOINT_FACTOR_LORA = 0.5
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")

_PROBE_PROGRAM = f"""
import os
children = []
for _ in range({PROBE_FORKS}):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
FORKED = len(children)
"""


class PreflightError(BaseException):
    """This node cannot run the member; not the member's fault (see the module's docstring for why a BaseException)."""


def nproc_note(max_processes: int, isolated: bool = True, uid: int | None = None) -> str:
    """How this node's kernel counts the sandbox's process limit, with the numbers that decide it."""
    if not counts_whole_user(isolated):
        return (f"kernel {platform.release()} counts RLIMIT_NPROC per user namespace: the sandboxed program's own "
                f"processes against max_processes={max_processes}")
    why = "older than 5.14" if isolated else "the sandbox has no user namespace here"
    uid = os.getuid() if uid is None else uid
    return (f"kernel {platform.release()} ({why}) counts RLIMIT_NPROC over every thread of the sandbox's user on this "
            f"node (uid {uid}: {user_tasks(uid)} now); the sandbox raises max_processes={max_processes} by that count "
            "at each program, so a failure here is not the other members' threads: check the node's own process "
            "limits (ulimit -u, a pids cgroup of the job)")


def check_sandbox(sandbox: Any) -> str:
    """Run a program that forks through the task's own sandbox (bubblewrap namespaces when it isolates, the same
    RLIMIT_NPROC), in this process with its threads alive; the cause of a failure, or "" when it works."""
    from inner_loop.sandbox.pool import SandboxPool, SandboxUnavailableError

    try:
        pool = SandboxPool(replace(sandbox, workers=1))
    except (SandboxUnavailableError, OSError) as exc:
        return f"the sandbox cannot start: {exc}"
    try:
        outcome = pool.run(_PROBE_PROGRAM, [f"assert FORKED == {PROBE_FORKS}"], timeout_s=30.0)
    finally:
        pool.close()
    if outcome.solved:
        logger.info("pre-flight: the sandbox (%s) ran a program that forks %d processes",
                    "isolated with bubblewrap" if pool.isolated else "not isolated: limits only", PROBE_FORKS)
        return ""
    tail = outcome.stderr_tail.strip().splitlines()
    return (f"a program that forks {PROBE_FORKS} processes failed in the sandbox ({outcome.status}: "
            f"{tail[-1] if tail else 'no error output'}); {nproc_note(sandbox.max_processes, pool.isolated, sandbox.run_uid())}")


#: the keys of a task node that may name local data (a staged snapshot, a file)
_TASK_FILE_KEYS = ("hub_id", "train_file", "validation_file", "test_file")


def local_inputs(inner: Mapping[str, Any]) -> list[Path]:
    """The local files and directories the config reads its model and data from (staged snapshots included), the
    tasks of its ``extra_evaluations`` (transfer tasks) too."""
    model = inner.get("model") or {}
    extras = inner.get("extra_evaluations")
    tasks = [inner.get("task") or {}, *(e.get("task") for e in (extras if isinstance(extras, list) else [])
                                        if isinstance(e, Mapping))]
    values = [model.get("name_or_path"), model.get("gguf_file"),
              *(task.get(key) for task in tasks if isinstance(task, Mapping) for key in _TASK_FILE_KEYS)]
    paths: list[Path] = []
    for value in values:
        path = Path(value).expanduser() if isinstance(value, str) and value else None
        if path is not None and path.exists() and path not in paths:
            paths.append(path)
    return paths


def check_readable(paths: list[Path]) -> str:
    """Open and read the first byte of every file under ``paths``; the first failure, or ""."""
    for root in paths:
        # symlinks too: a hub cache's snapshot links to blobs, and a missing blob is a dangling link
        for file in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
            try:
                with file.open("rb") as handle:
                    handle.read(1)
            except OSError as exc:
                return f"the staged file {file} is not readable here: {exc}"
    return ""


def checkpoint_bytes(inner: Mapping[str, Any], paths: list[Path]) -> int:
    """An estimate of one checkpoint of this run, from the base weights' size on disk (0 when they are not local:
    built here or loaded by hub name), plus ROOM_MARGIN_BYTES."""
    model_path = (inner.get("model") or {}).get("name_or_path")
    weights = 0
    for root in paths:
        if isinstance(model_path, str) and root == Path(model_path).expanduser() and root.is_dir():
            weights = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    lora = int((inner.get("model") or {}).get("lora_r") or 0) > 0
    return int(weights * (CHECKPOINT_FACTOR_LORA if lora else CHECKPOINT_FACTOR_FULL)) + ROOM_MARGIN_BYTES


def check_room(directory: Path, needed: int) -> str:
    """Whether the filesystem of ``directory`` (or its nearest existing parent) has ``needed`` bytes free."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        return (f"the checkpoint directory {directory} has {free / 2**30:.2f} GiB free, a checkpoint of this run needs "
                f"about {needed / 2**30:.2f} GiB")
    return ""


def failure_message(host: str, cause: str) -> str:
    """What a failed pre-flight says: the node, then the cause."""
    return f"pre-flight failed on node {host}: {cause}"


def preflight_failure(work_dir: Path) -> str | None:
    """The message of the failed pre-flight a member left in ``work_dir`` (None when its last one passed)."""
    failure = read_node_failure(work_dir)
    return failure_message(failure["host"], failure["cause"]) if failure else None


def run_preflight(inner: Mapping[str, Any], work_dir: Path, probe_sandbox: bool = True, member: bool = True) -> None:
    """Every check, the cheap ones first; PreflightError naming this node and the cause on the first failure. Where
    members run here (a member, or ``probe_sandbox`` on the submitting host), k >= 2 members per GPU also need a GPU
    that more than one process may use (inner_loop/member/compute_mode.py).

    ``member``: the checks are a member's: the outcome is kept in ``work_dir``'s PREFLIGHT_FILE (written on a failure,
    removed on a pass)."""
    from inner_loop.tasks import build_task

    host = node_name()
    paths = local_inputs(inner)
    cause = check_readable(paths) or check_room(work_dir, checkpoint_bytes(inner, paths))
    try:
        sandbox = getattr(build_task(inner["task"]), "sandbox", None)
    except (ValueError, KeyError, TypeError):  # a bad task config is the member's own failure, recorded right after
        sandbox = None
    if not cause and probe_sandbox and sandbox is not None:
        cause = check_sandbox(sandbox)
    if not cause and (member or probe_sandbox):  # only where members run: a login node's GPUs are not theirs
        cause = sharing_refusal(inner)
    marker = work_dir / PREFLIGHT_FILE
    if not cause:
        logger.info("pre-flight on %s: ok (%d local input(s) readable, room for a checkpoint in %s%s)", host,
                    len(paths), work_dir, ", the sandbox works" if probe_sandbox and sandbox is not None else "")
        if member:
            marker.unlink(missing_ok=True)
        return
    if member:
        record_node_failure(work_dir, cause)
    raise PreflightError(failure_message(host, cause))


def record_node_failure(work_dir: Path, cause: str) -> None:
    """Keep this node and why it cannot run the member in ``work_dir``'s PREFLIGHT_FILE: the launcher excludes the
    node from the member's next submission, and the runner ends a member no node could run as node_failed."""
    work_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(work_dir / PREFLIGHT_FILE, {"host": node_name(), "cause": cause, "time": time.time()})

"""launcher.max_pending_s on the real local cluster: a QOS limit keeps array tasks pending (waiting their
turn: never cancelled), a DOWN partition keeps a job pending for good (cancelled after max_pending_s, with the
reason in the member's error). Needs AccountingStorageEnforce with limits and qos (scripts/local_slurm/
slurm.conf.in). The test QOS and partition are created here and removed afterwards, whatever happened.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

import pytest

from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from slurm_helpers import LocalSlurm, SlurmCommandError, run_slurm_command
from slurm_launch_helpers import ENTRY, FAST, specs
from time_limits import scaled

pytestmark = pytest.mark.slow

MAX_PENDING_S = 3.0


def _runner(launcher: SlurmLauncher, member_specs: list, folder: Path, saved: dict) -> MemberArrayRunner:
    return MemberArrayRunner(launcher, ENTRY, member_specs, {}, saved.update, folder,
                             RunnerPolicy(retries=0, timeout_s=scaled(600), kill_grace_s=30, max_pending_s=MAX_PENDING_S))


@pytest.fixture
def capped_qos(slurm_cluster: LocalSlurm) -> Iterator[str]:
    """A QOS that lets a user run ONE job at a time (the shape of a user capped at 32 GPUs), usable by root."""
    config = run_slurm_command(["scontrol", "show", "config"])
    enforce = next((line for line in config.splitlines() if line.startswith("AccountingStorageEnforce")), "")
    if "limits" not in enforce:
        pytest.fail(f"the cluster does not enforce QOS limits ({enforce.strip()}); rerun scripts/local_slurm/up.sh")
    name = f"mirror-es-cap-{os.getpid()}"
    run_slurm_command(["sacctmgr", "-i", "add", "qos", name, "MaxJobsPerUser=1"])
    try:
        run_slurm_command(["sacctmgr", "-i", "modify", "user", "root", "set", f"qos+={name}"])
        yield name
    finally:
        for args in (["modify", "user", "root", "set", f"qos-={name}"], ["delete", "qos", name]):
            try:
                run_slurm_command(["sacctmgr", "-i", *args])
            except SlurmCommandError as exc:  # reported, but the test's own outcome is what matters
                logging.getLogger(__name__).warning("cleanup: %s", exc)


@pytest.fixture
def down_partition(slurm_cluster: LocalSlurm) -> Iterator[str]:
    """A partition on the cluster's node that is DOWN: its jobs are accepted and never start."""
    name = f"mirror-es-down-{os.getpid()}"
    run_slurm_command(["scontrol", "create", f"PartitionName={name}", "Nodes=ALL", "State=DOWN"])
    try:
        yield name
    finally:
        run_slurm_command(["scontrol", "delete", f"PartitionName={name}"])


def test_tasks_held_back_by_a_qos_limit_are_never_cancelled_and_all_finish(
    slurm_cluster: LocalSlurm, capped_qos: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    launcher = SlurmLauncher(**FAST, job_name="mirror-es-qoscap", max_pending_s=MAX_PENDING_S,
                             sbatch_extra={"qos": capped_qos})
    launcher.queue_log_interval_s = 1.0  # the summary line, often enough to be seen in a short test
    saved: dict[int, dict] = {}
    member_specs = specs(tmp_path, 4, {"sleep_s": 3, "count_calls": True})
    with caplog.at_level(logging.INFO, logger="launch.slurm.launcher"):
        records = _runner(launcher, member_specs, tmp_path / "launcher", saved).run()
    bases = sorted({int(j["job_id"].split("_")[0]) for j in saved.values()})
    slurm_cluster.submitted.extend(bases)
    # one task at a time: the last one waited ~3 x (3 s + start-up), far past max_pending_s, and still ran
    assert {i: r.status for i, r in records.items()} == {i: "ok" for i in range(4)}, records
    rows = slurm_cluster.wait_terminal(bases, expected_tasks=4, timeout=30)
    assert sorted(r.state for r in rows) == ["COMPLETED"] * 4, rows
    starts = sorted(r.start for r in rows)
    assert len(set(starts)) == 4, starts  # the QOS really serialised them
    for i in range(4):  # each member ran once: nothing cancelled and retried
        assert (tmp_path / f"member_{i:03d}" / "calls.log").read_text().splitlines() == ["attempt 0"]
    summaries = [r.getMessage() for r in caplog.records if "queued" in r.getMessage()]
    assert any("QOSMaxJobsPerUserLimit" in m and "waiting their turn" in m for m in summaries), summaries


def test_a_job_in_a_down_partition_is_cancelled_after_max_pending_s_naming_the_reason(
    slurm_cluster: LocalSlurm, down_partition: str, tmp_path: Path
) -> None:
    launcher = SlurmLauncher(**FAST, job_name="mirror-es-partdown", max_pending_s=MAX_PENDING_S,
                             partition=down_partition)
    saved: dict[int, dict] = {}
    try:
        records = _runner(launcher, specs(tmp_path, 1, {}), tmp_path / "launcher", saved).run()
    finally:
        slurm_cluster.submitted.extend({int(j["job_id"].split("_")[0]) for j in saved.values()})
    record = records[0]
    assert record.status == "timeout", (record.status, record.error)
    assert "PartitionDown" in record.error and f"max_pending_s={MAX_PENDING_S:g}" in record.error, record.error
    base = int(saved[0]["job_id"].split("_")[0])
    slurm_cluster.wait_for([base], lambda rows: bool(rows) and rows[-1].state == "CANCELLED", timeout=30,
                           what="cancelled by the runner")

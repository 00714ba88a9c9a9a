"""Fixtures for tests against the real one-node SLURM cluster of scripts/local_slurm/up.sh.

Every test under tests/slurm/ is marked `slurm`. The session fixture `slurm_cluster` probes the cluster
once (sinfo, sacct, the node's state), waits (bounded) for jobs of others to leave the queue, and skips the
SLURM tests with the reason visible in `pytest -ra` when it is not up; with MIRROR_ES_REQUIRE_SLURM=1 (CI,
after up.sh) a missing cluster fails instead, so a broken cluster can never pass as "all skipped". Whatever
a test leaves running is cancelled at the end.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

import pytest

from slurm_helpers import LocalSlurm, SlurmCommandError, probe_cluster, wait_until_queue_empty

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
UP_SCRIPT = HERE.parent.parent / "scripts" / "local_slurm" / "up.sh"
# How long the session waits for jobs it did not submit to leave the queue before it gives up.
BUSY_WAIT_S = 600.0


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """The running local cluster; skips (or fails under MIRROR_ES_REQUIRE_SLURM=1) when it is not up."""
    try:
        cluster = probe_cluster()
        wait_until_queue_empty(timeout=BUSY_WAIT_S, own_tmp_root=tmp_path_factory.getbasetemp())
    except SlurmCommandError as exc:
        reason = f"local SLURM cluster not available ({exc}); start it with {UP_SCRIPT}"
        if os.environ.get("MIRROR_ES_REQUIRE_SLURM") == "1":
            pytest.fail(f"MIRROR_ES_REQUIRE_SLURM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    logger.info("SLURM test cluster: node %s, %d CPUs, MaxArraySize %d",
                cluster.node, cluster.cpus, cluster.max_array_size)
    yield cluster
    cluster.cancel_leftovers()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this directory `slurm`, so `-m "not slurm"` deselects them all."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slurm)

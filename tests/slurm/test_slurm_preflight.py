"""A member whose node fails its pre-flight, on the real one-node cluster: the job ends FAILED without a result (the
init is not charged), the node and the cause are in the member's preflight.json, and the resubmission excludes that
node with sbatch --exclude. Here the cluster has no other node, so SLURM refuses that array at submission ("Requested
node configuration is not available"), which the run reports naming the excluded node."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.runner import AbortRun, MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from meta.compose import compose
from results.store.layout import PREFLIGHT_FILE, RESULT_FILE
from core.records import MemberSpec
from slurm_helpers import LocalSlurm
from slurm_launch_helpers import FAST
from time_limits import scaled

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


#: where the job's Python finds FQDN_SITE (sitecustomize runs at every interpreter start)
FQDN_SITE = """import socket
socket.gethostname = lambda: "{node}.cluster.example.org"
"""


@pytest.mark.parametrize("host_name", ["slurm", "fqdn"])
def test_a_member_failing_preflight_is_resubmitted_without_its_node(slurm_cluster: LocalSlurm, tmp_path: Path,
                                                                    host_name: str) -> None:
    """``fqdn``: the node's host name is a full domain name, as on many clusters, unlike slurm.conf's NodeName (the
    local cluster's is ``hostname -s``). The excluded name must still be SLURM's, or sbatch refuses the array as an
    "Invalid node name specified" instead of finding no node for it."""
    setup: list[str] = []
    if host_name == "fqdn":
        site = tmp_path / "fqdn_site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(FQDN_SITE.format(node=slurm_cluster.node))
        setup = [f"export PYTHONPATH={site}:$PYTHONPATH"]
    raw = compose(["task=mbpp", f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}",
                   f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}", "task.validation_size=1",
                   "+task.sandbox.max_processes=1", "model.cpu_numerics=native"])  # its programs cannot fork
    work_dir = tmp_path / "member_000"
    spec = MemberSpec(run_id="slurm-preflight", generation=0, index=0, seed=0, params=[0.0] * 380,
                      work_dir=str(work_dir), inner={n: raw[n] for n in ("task", "model", "divergence", "train")})
    launcher = SlurmLauncher(**FAST, job_name="mirror-es-preflight", submit_attempts=1, cpus_per_task=1,
                              setup=setup)
    jobs: dict[int, dict] = {}
    runner = MemberArrayRunner(launcher, "inner_loop.member.entry:train_member", [spec], {}, jobs.update,
                               tmp_path / "submitit", RunnerPolicy(retries=0, timeout_s=scaled(600), max_lost_resubmits=2))
    with pytest.raises(AbortRun) as stopped:
        runner.run()
    slurm_cluster.submitted.append(int(str(jobs[0]["job_id"]).split("_")[0]))
    failure = json.loads((work_dir / PREFLIGHT_FILE).read_text())
    assert failure["host"] == slurm_cluster.node and "forks" in failure["cause"]
    assert not (work_dir / RESULT_FILE).exists()  # nothing charged to the init
    message = str(stopped.value)
    assert "Requested node configuration is not available" in message
    assert f"may not run on node(s) {slurm_cluster.node}" in message

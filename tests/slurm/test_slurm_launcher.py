"""launcher=slurm against the real local cluster: a generation end to end, array splitting at MaxArraySize,
polite polling, a clean environment for members submitted from inside a SLURM job; plus the parsing and
config validation the launcher relies on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.factory import build_launcher
from launch.slurm.launcher import SlurmLauncher
from launch.slurm.options import SlurmOptions
from launch.slurm.queries import base_job_id, expand_job_ids, parse_sacct
from slurm_helpers import LocalSlurm, run_slurm_command
from slurm_launch_helpers import FAST, run_generation, specs



def test_sacct_rows_expand_to_one_state_per_task() -> None:
    text = "41_[3-5,8%2]|PENDING|0:0\n41_0|COMPLETED|0:0\n41_1|CANCELLED by 0|0:15\n41.batch|COMPLETED|0:0\n7|RUNNING|0:0\n"
    states = parse_sacct(text)
    assert sorted(states) == ["41_0", "41_1", "41_3", "41_4", "41_5", "41_8", "7"]
    assert states["41_4"].state == "PENDING" and not states["41_4"].terminal
    assert states["41_1"].state == "CANCELLED" and states["41_1"].terminal
    assert expand_job_ids("12_3") == ["12_3"] and base_job_id("12_3") == "12"


def test_bad_launcher_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['launcher.cpus_per_tsk'\].*launcher.sbatch_extra"):
        SlurmOptions.from_options({"cpus_per_tsk": 2})
    with pytest.raises(ValueError, match="launcher.query_interval_s"):
        SlurmOptions.from_options({"query_interval_s": 0.1, "poll_interval_s": 2})
    with pytest.raises(ValueError, match="launcher.signal_delay_s"):
        SlurmOptions.from_options({"time_min": 1, "signal_delay_s": 60})
    with pytest.raises(ValueError, match="launcher.sbatch_extra"):
        SlurmOptions.from_options({"sbatch_extra": ["--qos=high"]})


def test_shipped_config_builds_the_launcher_with_its_documented_resources() -> None:
    from meta.compose import compose

    # composed as meta.run does: the launcher reads the preset's resources (here the embedded tiny_arith's)
    shipped = compose(["launcher=slurm"])["launcher"]
    launcher = build_launcher(shipped | {"mem_gb": 2, "sbatch_extra": {"qos": "high"}})
    assert isinstance(launcher, SlurmLauncher)
    params = launcher.config.sbatch_parameters(timeout_s=3600)
    assert params["time"] == 61  # inner.timeout_s + kill_grace_s, rounded up to minutes
    assert params["mem"] == "2048M" and params["additional_parameters"] == {"qos": "high", "signal": "B:USR2@120"}
    assert params["signal_delay_s"] == 120 and params["cpus_per_task"] == 1


def test_without_srun_the_requeue_signal_goes_to_the_batch_shell_that_python_replaces() -> None:
    """Without a job step, SLURM's plain --signal reaches nothing: it must be B: and Python must BE the shell."""
    no_srun = SlurmOptions.from_options({"time_min": 30})
    params = no_srun.sbatch_parameters(timeout_s=600, signal_name="USR2")
    assert params["use_srun"] is False and params["additional_parameters"] == {"signal": "B:USR2@120"}
    assert no_srun.python_command("/venv/bin/python") == "exec /venv/bin/python"
    srun = SlurmOptions.from_options({"time_min": 30, "use_srun": True})
    assert "additional_parameters" not in srun.sbatch_parameters(timeout_s=600)
    assert srun.python_command("/venv/bin/python") == "/venv/bin/python"
    own_signal = SlurmOptions.from_options({"sbatch_extra": {"signal": "B:USR1@300"}})
    assert own_signal.sbatch_parameters(timeout_s=600)["additional_parameters"] == {"signal": "B:USR1@300"}
    # exec'ed in place of the shell, so a compound command is refused up front, naming the key and the fix
    with pytest.raises(ValueError, match="launcher.python=.*launcher.setup"):
        SlurmOptions.from_options({"python": "module load py && python"})
    with pytest.raises(ValueError, match="launcher.python"):
        SlurmOptions.from_options({"python": "OMP_NUM_THREADS=1 python"})
    assert SlurmOptions.from_options({"python": "apptainer exec img.sif python"}).python_command("x") == \
        "exec apptainer exec img.sif python"


def test_generation_split_into_arrays_runs_end_to_end_with_few_queries(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    launcher = SlurmLauncher(**FAST, max_array_size=2, job_name="mirror-es-e2e")
    member_specs = specs(tmp_path, 5, {"sleep_s": 1, "fail": [3]})
    records, jobs = run_generation(launcher, member_specs, tmp_path / "launcher")

    assert {i: r.status for i, r in records.items()} == {0: "ok", 1: "ok", 2: "ok", 3: "failed", 4: "ok"}
    assert "injected failure" in records[3].error
    bases = [base_job_id(jobs[i]["job_id"]) for i in range(5)]
    assert bases[0] == bases[1] != bases[2] == bases[3] != bases[4], jobs  # 3 arrays of <= 2 tasks
    slurm_cluster.submitted.extend(int(b) for b in set(bases))
    rows = slurm_cluster.wait_terminal(sorted({int(b) for b in bases}), expected_tasks=5, timeout=30)
    assert sorted(r.job_id for r in rows) == sorted(j["job_id"] for j in jobs.values())
    assert all(r.state == "COMPLETED" for r in rows), rows  # member exceptions are results, not job failures
    # Politeness: results came from files; sacct was asked only every query_interval_s at most.
    assert launcher.queries.calls["sacct"] <= 6, launcher.queries.calls
    # squeue only for pending reasons, at most once per 5 min while a task is queued (a busy cluster queues some)
    assert launcher.queries.calls["squeue"] <= 1, launcher.queries.calls


def test_generation_larger_than_the_clusters_max_array_size_is_split(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    limit = slurm_cluster.max_array_size
    launcher = SlurmLauncher(**FAST, sbatch_extra={"hold": True}, job_name="mirror-es-split")
    member_specs = specs(tmp_path, limit + 1, {})
    refs = launcher.submit("meta.synthetic:member", member_specs, tmp_path / "launcher", timeout_s=60)
    bases = sorted({int(base_job_id(r.job_id)) for r in refs})
    slurm_cluster.submitted.extend(bases)
    try:
        assert launcher.max_array_size() == limit
        assert len(bases) == 2, [r.job_id for r in refs]
        assert [r.job_id for r in refs[:limit]] == [f"{bases[0]}_{i}" for i in range(limit)]
        assert refs[limit].job_id == str(bases[1])  # a one-member remainder is a plain job
        assert launcher.alive(refs) == {r.job_id for r in refs}  # held jobs are queued, hence alive
    finally:
        launcher.cancel(refs)
    slurm_cluster.wait_for(bases, lambda rows: len({r.job_id.split("_")[0] for r in rows}) == 2
                           and all(r.state == "CANCELLED" for r in rows), timeout=30, what="cancelled")
    launcher._last_query = float("-inf")  # ask sacct now instead of after query_interval_s
    assert launcher.alive(refs) == set()
    # Cancelled by the orchestrator itself (as on abort): a resumed run must resubmit, not record "cancelled".
    assert all(launcher.ended_status(r) is None for r in refs)


def test_members_get_a_clean_environment_when_the_orchestrator_runs_in_a_slurm_job(
    slurm_cluster: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    monkeypatch.setenv("SLURM_MIRROR_ES_PARENT", "leaked")
    monkeypatch.setenv("SBATCH_JOB_NAME", "leaked-name")  # sbatch reads SBATCH_* as options
    launcher = SlurmLauncher(**FAST, job_name="mirror-es-clean-env")
    records, jobs = run_generation(launcher, specs(tmp_path, 1, {"env_log": True}), tmp_path / "launcher")
    monkeypatch.undo()  # the client commands below must not see the fake parent job either
    job_id = jobs[0]["job_id"]
    slurm_cluster.submitted.append(int(base_job_id(job_id)))

    assert records[0].status == "ok", records[0].error
    seen = json.loads((tmp_path / "member_000" / "env.json").read_text())
    assert "SLURM_MIRROR_ES_PARENT" not in seen and "SBATCH_JOB_NAME" not in seen
    assert seen["SLURM_JOB_ID"] == job_id
    # The controller's record (accounting may briefly show a placeholder name right after the job ends).
    shown = run_slurm_command(["scontrol", "show", "job", "-o", job_id])
    assert " JobName=mirror-es-clean-env.slurm-test.g0000.c000 " in shown, shown  # <job_name>.<run>.g<gen>.c<chunk>

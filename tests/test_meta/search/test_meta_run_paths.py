"""Every path a run records is absolute, a resume from another directory works, and a resume with another
launcher kind or on another cluster/host is refused before anything is written or submitted (issue 13, item 6)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from launch.factory import job_namespace
from meta.search.run import main
from results.store.run_store import RunStore

ROOT = Path(__file__).resolve().parents[3]
SYNTH = ["inner.entrypoint=meta.synthetic:member", "population=4", "+inner.options={count_calls:true}",
         "reevaluate.top_k=0"]  # the paths of the search itself; no re-evaluation stages


def _meta_run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "meta.run", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_started_with_relative_paths_records_them_absolute_and_resumes_from_another_directory(tmp_path):
    from mirror_maps import NeuralMirrorMap, save_init

    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    (start / "inits").mkdir(parents=True)
    elsewhere.mkdir()
    save_init(start / "inits" / "c.safetensors", NeuralMirrorMap.from_vector(torch.full((380,), 0.005)))
    first = _meta_run(start, "run_dir=runs/r1", "new=true", "launcher=local", "generations=1", "init=inits/c.safetensors",
                      "task=mbpp", "task.train_file=data/train.jsonl", *SYNTH)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = start / "runs" / "r1"
    store = RunStore(run_dir)
    config = yaml.safe_load(store.config_path.read_text())
    manifest = json.loads(store.manifest_path.read_text())
    assert config["run_dir"] == str(run_dir)
    assert config["init"] == str(start / "inits" / "c.safetensors")
    assert config["task"]["train_file"] == str(start / "data" / "train.jsonl")
    assert f"init={start / 'inits' / 'c.safetensors'}" in manifest["overrides"]
    assert f"task.train_file={start / 'data' / 'train.jsonl'}" in manifest["overrides"]
    jobs = store.read_jobs(0)
    assert jobs and all(Path(job["folder"]).is_absolute() for job in jobs.values())
    local = {"name": "local", "cls": "launch.local.launchers:LocalLauncher"}
    assert manifest["launcher"] == "local" and manifest["cluster"] == job_namespace(local)

    # Resume from another directory (the run dir named relative to it), one generation more: the replayed
    # relative overrides would name files under `elsewhere`, which the search would refuse as a changed init.
    second = _meta_run(elsewhere, "run_dir=../start/runs/r1", "generations=2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert store.state_generations() == [0, 1]
    for generation in (0, 1):
        for index in range(4):
            calls = (store.member_dir(generation, index) / "calls.log").read_text().splitlines()
            assert calls == ["attempt 0"], f"member {generation}:{index} ran {len(calls)} times"
    assert all(Path(job["folder"]).is_absolute() for job in store.read_jobs(1).values())
    assert not (elsewhere / "runs").exists() and not (elsewhere / "outputs").exists()


def test_a_resume_with_another_launcher_kind_is_refused_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=debug", "generations=1", *SYNTH]) == 0
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert main([f"run_dir={run_dir}", "new=true", "launcher=local", "generations=2"]) == 2
    err = capsys.readouterr().err
    assert "started with launcher=debug and cannot be resumed with launcher=local" in err
    assert _snapshot(run_dir) == before


def test_a_resume_on_another_cluster_is_refused_naming_old_and_new(tmp_path, capsys, monkeypatch):
    """A run recorded as started on SLURM cluster 'alpha'; this machine's scontrol says 'beta'."""
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=debug", "generations=1", *SYNTH]) == 0
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    assert manifest["launcher"] == "debug" and manifest["cluster"]
    store.write_manifest({**manifest, "launcher": "slurm", "cluster": "alpha"})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "scontrol"
    shim.write_text("#!/bin/sh\nprintf 'MaxArraySize            = 1001\\nClusterName             = beta\\n'\n")
    shim.chmod(0o755)
    before = _snapshot(run_dir)
    capsys.readouterr()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert job_namespace({"name": "slurm", "cls": "launch.slurm.launcher:SlurmLauncher"}) == "beta"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=slurm", "generations=2"]) == 2
    err = capsys.readouterr().err
    assert "started on SLURM cluster 'alpha' and this is SLURM cluster 'beta'" in err
    assert _snapshot(run_dir) == before


def test_a_resume_on_another_host_is_refused_for_local_jobs(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main([f"run_dir={run_dir}", "new=true", "launcher=debug", "generations=1", *SYNTH]) == 0
    store = RunStore(run_dir)
    store.write_manifest({**store.read_manifest(), "cluster": "some-other-host"})
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert main([f"run_dir={run_dir}", "new=true", "generations=2"]) == 2
    assert "started on host 'some-other-host'" in capsys.readouterr().err
    assert _snapshot(run_dir) == before


@pytest.mark.skipif(not os.environ.get("MIRROR_ES_REQUIRE_SLURM"), reason="needs the local SLURM cluster")
def test_the_real_cluster_answers_its_name():
    assert job_namespace({"name": "slurm", "cls": "launch.slurm.launcher:SlurmLauncher"}) == "mirror-es"

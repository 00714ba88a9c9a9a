"""The orchestrator end to end with the synthetic objective and the in-process debug launcher."""
from __future__ import annotations

import json

import pytest
import yaml
import torch

from meta.search.config import config_hash
from meta.search.after.export import main as export_main
from meta.search.lock import RunLock
from meta.search.run import main
from results.store.run_store import RunStore

SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "population=4", "generations=3"]


def _run(run_dir, *extra):
    return main([f"run_dir={run_dir}", "new=true", *SYNTH, *extra])


def _states(run_dir):
    store = RunStore(run_dir)
    return [store.read_state(g) for g in store.state_generations()]


def _assert_same_states(a, b):
    assert len(a) == len(b)
    for sa, sb in zip(a, b):
        assert torch.equal(sa["center"], sb["center"])
        best_a, best_b = ({k: v for k, v in s["best"].items() if k != "run_id"} for s in (sa, sb))
        assert best_a == best_b and sa["mean_fitness"] == sb["mean_fitness"]


def test_a_run_writes_the_documented_layout_and_is_deterministic(tmp_path):
    assert _run(tmp_path / "a") == 0
    store = RunStore(tmp_path / "a")
    assert store.state_generations() == [0, 1, 2]
    assert store.population_path(2).exists() and store.jobs_path(2).exists()
    assert (store.member_dir(1, 3) / "result.json").exists()
    members = store.read_members()
    assert len(members) == 15 and set(members["status"]) == {"ok"}
    assert members["role"].value_counts().to_dict() == {"member": 12, "control": 3}
    assert store.read_generations()["generation"].tolist() == [0, 1, 2]
    assert _run(tmp_path / "b") == 0
    _assert_same_states(_states(tmp_path / "a"), _states(tmp_path / "b"))
    assert _run(tmp_path / "c", "seed=1") == 0
    assert not torch.equal(_states(tmp_path / "a")[-1]["center"], _states(tmp_path / "c")[-1]["center"])


def test_injected_failures_are_retried_mapped_and_recorded(tmp_path):
    opts = "+inner.options={fail:[1],nan_fitness:['1:2'],hang:['2:0'],fail_attempts:1}"
    assert _run(tmp_path, opts, "retries=0", "inner.timeout_s=0.5", "fitness_on_failure=-1.0") == 0
    members = RunStore(tmp_path).read_members().set_index(["generation", "index"])
    assert members.loc[(0, 1), "status"] == "failed" and "injected failure" in members.loc[(0, 1), "error"]
    assert members.loc[(1, 2), "status"] == "failed" and "non-finite" in members.loc[(1, 2), "error"]
    assert members.loc[(2, 0), "status"] == "timeout"
    assert members.loc[(0, 1), "fitness_used"] == -1.0 and members.loc[(0, 0), "fitness_used"] > 0
    # With a retry, the same injected (first-attempt-only) failures all recover.
    assert _run(tmp_path / "retry", opts, "retries=1", "inner.timeout_s=0.5") == 0
    assert set(RunStore(tmp_path / "retry").read_members()["status"]) == {"ok"}


def test_too_many_failures_abort_with_a_clear_message(tmp_path, caplog):
    assert _run(tmp_path, "+inner.options={fail:[0,1,2]}", "retries=0", "max_failed_fraction=0.5") == 1
    assert "more than max_failed_fraction=0.5" in caplog.text and "injected failure" in caplog.text
    assert RunStore(tmp_path).state_generations() == []


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("population=5", "even population"),
        ("population=1", "population=1 must be an integer >= 2"),
        ("es=nope", "es"),
        ("populaton=4", "populaton"),
        ("inner.entrypoint=nowhere:fn", "cannot import module"),
        ("init=/no/such/file.pt", "init='/no/such/file.pt'"),
        ("max_failed_fraction=2", "max_failed_fraction"),
        ("+es.learning_rat=1", "es.learning_rat"),
        ("launcher=slurm +launcher.cpus_per_tsk=2", "launcher.cpus_per_tsk"),
        ("launcher=slurm launcher.mem_gb=-1", "launcher.mem_gb"),
    ],
)
def test_bad_configs_exit_2_before_anything_is_written(tmp_path, capsys, override, fragment):
    assert _run(tmp_path / "run", *override.split()) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.group_size=1", "train.group_size must be >= 2"),
        ("divergence.coef=-1", "divergence.coef"),
        ("divergence.init=/no/such/init.pt", "/no/such/init.pt"),
        ("train.policy_loss=dppo_tv", None),
    ],
)
def test_bad_inner_configs_are_refused_before_any_member_is_submitted(tmp_path, capsys, override, fragment):
    """The default entry point validates task/model/divergence/train up front (exit 2, nothing written)."""
    if fragment is None:  # a valid inner override passes validation (the run itself is not started here)
        from meta.search.run import prepare

        prepare([f"run_dir={tmp_path / 'run'}", "new=true", override])
        return
    assert main([f"run_dir={tmp_path / 'run'}", "new=true", override]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_resume_refuses_search_changes_and_accepts_safe_ones(tmp_path, capsys):
    assert _run(tmp_path, "generations=1") == 0
    assert main([f"run_dir={tmp_path}", "new=true", "population=6", "es=snes"]) == 2
    err = capsys.readouterr().err
    assert "population: 4 -> 6" in err and "es.name: 'pgpe' -> 'snes'" in err
    # Only run_dir plus safe changes: the stored overrides are replayed, the run continues. What members keep on
    # disk is housekeeping, not the search: it may change, and it leaves the config hash alone.
    before = config_hash(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert main([f"run_dir={tmp_path}", "new=true", "generations=3", "retries=2", "train.keep_checkpoints=last"]) == 0
    assert config_hash(yaml.safe_load((tmp_path / "config.yaml").read_text())) == before
    assert RunStore(tmp_path).state_generations() == [0, 1, 2]
    assert _run(tmp_path / "ref") == 0
    _assert_same_states(_states(tmp_path), _states(tmp_path / "ref"))


def test_corrupt_newest_state_falls_back_and_redoes_the_generation_identically(tmp_path, caplog):
    assert _run(tmp_path, "+inner.options={count_calls:true}") == 0
    reference = _states(tmp_path)
    state = RunStore(tmp_path).state_path(2)
    state.write_bytes(state.read_bytes()[:100])
    assert main([f"run_dir={tmp_path}", "new=true"]) == 0
    assert "skipping corrupt state file" in caplog.text
    _assert_same_states(_states(tmp_path), reference)
    calls = (RunStore(tmp_path).member_dir(2, 0) / "calls.log").read_text().splitlines()
    assert calls == ["attempt 0"]  # finished members were read back, not run again


def test_a_second_orchestrator_on_the_same_run_dir_is_refused(tmp_path, caplog):
    with RunLock(RunStore(tmp_path).lock_path):
        assert _run(tmp_path) == 3
    assert "in use by another orchestrator" in caplog.text
    assert _run(tmp_path) == 0  # released: runs


def test_export_center_and_best_member(tmp_path):
    from mirror_maps import load_init

    assert _run(tmp_path) == 0
    assert export_main([f"run_dir={tmp_path}", "which=best_member", f"out={tmp_path / 'best.safetensors'}"]) == 0
    mirror_map, meta = load_init(tmp_path / "best.safetensors")
    best = RunStore(tmp_path).read_best()
    assert meta["fitness"] == best["fitness"] and meta["generation"] == best["generation"]
    assert meta["run_id"] == json.loads((tmp_path / "manifest.json").read_text())["run_id"]
    assert torch.equal(mirror_map.to_vector().double(), torch.tensor(best["params"], dtype=torch.float64))
    assert export_main([f"run_dir={tmp_path}", "which=center", f"out={tmp_path / 'c.safetensors'}"]) == 0
    center_map, meta = load_init(tmp_path / "c.safetensors")
    assert meta["which"] == "center" and meta["generation"] == 2
    assert torch.equal(center_map.to_vector().double(), _states(tmp_path)[-1]["center"])
    assert export_main([f"run_dir={tmp_path / 'none'}", "which=center", "out=x.safetensors"]) == 2


def test_a_stale_lock_left_by_a_dead_orchestrator_is_detected_and_taken_over(tmp_path, caplog):
    import socket
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    lock_path = RunStore(tmp_path).lock_path
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": 0}))
    with RunLock(lock_path):
        assert json.loads(lock_path.read_text())["pid"] != dead.pid
    assert "stale lock from a dead orchestrator" in caplog.text


def test_members_settled_for_good_are_finalized_by_the_entry_point(tmp_path):
    """A member whose last attempt failed keeps what it saved for a retry; once the generation is settled the
    orchestrator calls the entry point's finalize (train_member deletes its checkpoints there)."""
    assert _run(tmp_path, "generations=1", "retries=0", "+inner.options={steps:2,fail:[1]}") == 0
    store = RunStore(tmp_path)
    assert json.loads((store.member_dir(0, 1) / "result.json").read_text())["status"] == "failed"
    assert not any((store.member_dir(0, i) / "synthetic_ckpt.json").exists() for i in range(4))

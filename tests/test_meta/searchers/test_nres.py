"""es=nres (meta/searchers/nres.py): online ES over particles, each a long run cut into truncations.

These run searches through meta.run with the synthetic member (meta/synthetic.py), whose truncations carry their
loss through the particles' boundary checkpoints as a training run carries its weights; the searcher on the family of
unrolled problems, in-process: tests/test_meta/searchers/test_nres_family.py."""
from __future__ import annotations

import json
import math
import multiprocessing
import socket
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from inner_loop.member import preflight
from meta.search.run import main
from meta.synthetic import CHECKPOINT_FILE, member as synthetic_member
from plan_inputs import ONE_MEMBER_AT_15S
from results.store.layout import boundary_dir_name
from core.records import NODE_FAILED, MemberSpec, ResultRecord
from results.store.run_store import RunStore
from results.store.truncation import END_SCORE, START_SCORE, Truncation, read_boundary

ROOT = Path(__file__).resolve().parents[3]
H, K = 12, 4
# (pairs restarting together, es.stagger=false: each test below reads the particles' places in their runs)
SYNTH = ["launcher=debug", "inner.entrypoint=meta.synthetic:member", "es=nres", "es.stagger=false", f"train.steps={H}",
         f"es.truncation_steps={K}", "es.radius=0.01", "reevaluate.top_k=0",
         "+inner.options={unrolled:{floor:0.5},count_calls:true}"]


def _members(store: RunStore) -> pd.DataFrame:
    return store.read_members().set_index(["generation", "index"]).sort_index()


def test_truncations_continue_their_particle_and_each_particle_keeps_one_checkpoint(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "population=4", "generations=2"]) == 0
    store = RunStore(tmp_path)
    members = _members(store)
    assert sorted(set(members.index.get_level_values("index"))) == [0, 1, 2, 3]  # no control member
    for index in range(4):
        first, second = members.loc[(0, index)], members.loc[(1, index)]
        assert (first["diag_truncation_start"], first["diag_truncation_stop"]) == (0, K)
        assert (second["diag_truncation_start"], second["diag_truncation_stop"]) == (K, 2 * K)
        # the second starts where the first ended: the changes telescope to the run's score
        assert second[f"diag_{START_SCORE}"] == first[f"diag_{END_SCORE}"]
        assert first["fitness"] + second["fitness"] == pytest.approx(second[f"diag_{END_SCORE}"])
        folders = sorted(p.name for p in store.particle_dir(index).iterdir())
        assert folders == [boundary_dir_name(0, 2 * K)]  # only the checkpoint it stands on
        spec = json.loads((store.member_dir(1, index) / "spec.json").read_text())
        assert spec["segment"]["start"] == K and spec["segment"]["horizon"] == H  # its segment, stored
    # the halves of a pair train with one seed over their whole run; pairs differ
    seeds = {(g, i): json.loads((store.member_dir(g, i) / "spec.json").read_text())["seed"]
             for g in (0, 1) for i in range(4)}
    assert seeds[(0, 0)] == seeds[(0, 1)] == seeds[(1, 0)] != seeds[(0, 2)]


def test_a_pair_restarts_with_new_noise_at_the_end_of_its_run(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "population=2", "generations=4"]) == 0
    store = RunStore(tmp_path)
    members = _members(store)
    assert [members.loc[(g, 0), "diag_truncation_start"] for g in range(4)] == [0, K, 2 * K, 0]
    populations = [store.read_population(g) for g in range(4)]
    centers = [store.read_state(g - 1)["center"] for g in range(1, 4)]
    noise = [populations[g][0] - centers[g - 1] for g in range(1, 4)]
    assert torch.allclose(noise[0], noise[1])  # one noise over the run, whatever the centre did
    assert not torch.allclose(noise[1], noise[2])  # a new run, a new noise
    assert torch.allclose(populations[3][0] - centers[2], centers[2] - populations[3][1])  # antithetic
    from meta.status.view import render

    status = render(tmp_path)  # meta.status: each particle's place in its run
    assert "particles (es=nres): 2, each a run of 12 steps" in status
    assert f"particles 000/001: run 1, step {K} of 12, next truncation {K}..{2 * K}" in status


def test_a_late_pair_repeats_its_truncation_and_stays_out_of_the_update(tmp_path):
    """Closed at the quorum: members 2 and 3 are cancelled before they run; their pair stands on its checkpoint and
    trains the same truncation next generation, while the measured pair goes on; late twice in a row, it restarts."""
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH, "population=4", "generations=2", "quorum=0.5",
                 "straggler_grace=0"]) == 0
    store = RunStore(tmp_path)
    members = _members(store)
    assert members.loc[(0, 2), "status"] == members.loc[(0, 3), "status"] == "late"
    assert pd.isna(members.loc[(0, 2), "fitness_used"])
    assert members.loc[(1, 0), "diag_truncation_start"] == K  # the measured pair went on
    state = store.read_state(0)["searcher"]
    assert state["step"] == [K, 0] and state["episode"] == [0, 0]  # the late pair stood on its boundary
    state = store.read_state(1)["searcher"]  # late a second time in a row: its run ends, a new one starts
    assert state["step"] == [2 * K, 0] and state["episode"] == [0, 1]


def node_fails_once(spec: object) -> dict:
    """The synthetic member, except that member 1's node fails its pre-flight in generation 0 (every submission)."""
    if spec.generation == 0 and spec.index == 1:  # type: ignore[attr-defined]
        preflight.record_node_failure(Path(spec.work_dir), "no usable GPU")  # type: ignore[attr-defined]
        raise preflight.PreflightError(preflight.failure_message(socket.gethostname(), "no usable GPU"))
    return synthetic_member(spec)  # type: ignore[arg-type]


def test_a_node_failure_restarts_the_pair_from_its_boundary_not_charged(tmp_path):
    args = [a for a in SYNTH if not a.startswith("inner.entrypoint")]
    assert main([f"run_dir={tmp_path}", "new=true", *args, f"inner.entrypoint={__name__}:node_fails_once",
                 "population=4", "generations=2", "launcher.max_lost_resubmits=0", "fitness_on_failure=-5"]) == 0
    store = RunStore(tmp_path)
    members = _members(store)
    assert members.loc[(0, 1), "status"] == NODE_FAILED and pd.isna(members.loc[(0, 1), "fitness_used"])
    assert members.loc[(1, 0), "diag_truncation_start"] == 0  # pair 0 trains [0, K) again, from the start
    assert members.loc[(1, 2), "diag_truncation_start"] == K
    assert store.read_state(0)["searcher"]["episode"] == [0, 0]  # not ended as a failure would end it


def test_a_failed_half_ends_its_pairs_run(tmp_path):
    assert main([f"run_dir={tmp_path}", "new=true", *SYNTH[:-1], "population=4", "generations=2", "retries=0",
                 "+inner.options={unrolled:{floor:0.5},fail:['0:1']}"]) == 0
    state = RunStore(tmp_path).read_state(0)["searcher"]
    assert state["episode"] == [1, 0] and state["step"] == [0, K]


def _interrupted_truncation(spec: dict) -> None:
    synthetic_member(spec)


def test_a_requeued_particle_resumes_mid_truncation_from_its_checkpoint(tmp_path):
    piece = Truncation(particle=0, episode=0, start=0, stop=6, horizon=12, particle_dir=str(tmp_path / "particle"))
    options = {"unrolled": {"floor": 0.5}, "step_s": 0.05}

    def spec(work: str) -> MemberSpec:
        return MemberSpec(run_id="t", generation=0, index=0, seed=1, params=[0.01] * 380, inner={"options": options},
                          work_dir=str(tmp_path / work), truncation=piece.to_dict())

    killed = spec("killed")
    Path(killed.work_dir).mkdir()
    process = multiprocessing.get_context("spawn").Process(target=_interrupted_truncation, args=(killed.to_dict(),))
    process.start()
    checkpoint = Path(killed.work_dir) / CHECKPOINT_FILE
    while process.is_alive() and not (checkpoint.exists() and json.loads(checkpoint.read_text())["step"] >= 2):
        time.sleep(0.01)
    process.kill()
    process.join()
    stopped_at = json.loads(checkpoint.read_text())["step"]
    assert 2 <= stopped_at < 6, "the member finished before it could be stopped"
    resumed = ResultRecord.coerce(synthetic_member(killed))
    assert json.loads(checkpoint.read_text())["starts"] == [0, stopped_at]
    assert resumed.diagnostics["resumed_at"] == stopped_at
    (tmp_path / "particle").rename(tmp_path / "first")  # the uninterrupted run publishes its own boundary
    whole = ResultRecord.coerce(synthetic_member(spec("whole")))
    assert resumed.fitness == whole.fitness and whole.diagnostics.pop("resumed_at") == 0
    assert {k: v for k, v in resumed.diagnostics.items() if k != "resumed_at"} == whole.diagnostics
    assert read_boundary(Path(tmp_path / "first") / boundary_dir_name(0, 6))["score"] == whole.diagnostics[END_SCORE]


@pytest.mark.slow
def test_sigkill_of_the_orchestrator_then_resume_ends_with_the_same_centre_and_particles(tmp_path):
    """Killed while truncations are in flight, right after a tell, and around an ask; the resumed search ends with
    the uninterrupted one's centre and particle states, and no truncation ran twice."""
    import os
    import random
    import signal
    import subprocess

    slow = "+inner.options={unrolled:{floor:0.5},count_calls:true,sleep_s:0.3}"  # truncations to kill in flight
    args = [slow if a.startswith("+inner.options") else a for a in SYNTH if not a.startswith("launcher=")]
    args += ["population=4", "generations=3"]
    reference = tmp_path / "reference"
    assert main([f"run_dir={reference}", "new=true", "launcher=debug", *args]) == 0
    run_dir = tmp_path / "killed"
    store = RunStore(run_dir)

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "launcher=local",
                                 *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    rng = random.Random(20261128)
    kills = 0
    for trigger, spread in ((store.jobs_path(0), 0.6), (store.state_path(0), 0.2), (store.population_path(2), 0.4)):
        proc = start()
        deadline = time.monotonic() + 120
        while not trigger.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, spread))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 2, "the orchestrator finished before it could be killed; the test did not test anything"
    final = start()
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err.decode()[-3000:]
    want = RunStore(reference)
    for generation in range(3):
        got, expected = store.read_state(generation), want.read_state(generation)
        assert torch.equal(got["center"], expected["center"])
        assert {k: got["searcher"][k] for k in ("step", "stop", "episode")} == {
            k: expected["searcher"][k] for k in ("step", "stop", "episode")}
        for index in range(4):
            calls = (store.member_dir(generation, index) / "calls.log").read_text().splitlines()
            assert calls == ["attempt 0"], f"truncation {generation}:{index} ran {len(calls)} times"
    assert _members(store)["fitness"].tolist() == _members(want)["fitness"].tolist()


def test_the_mbpp_plan_of_nres_states_its_episodes_its_equal_information_and_each_generations_time_limit(tmp_path):
    import re
    import subprocess

    fixtures = ROOT / "tests" / "fixtures"
    proc = subprocess.run(
        [sys.executable, "-m", "meta.run", "experiment=mbpp_qwen3", "launcher=slurm", "population=180",
         "generations=32", "es=nres", "dry_run=true", f"run_dir={tmp_path / 'plan'}", "new=true",
         f"task.train_file={fixtures / 'mbpp_train.jsonl'}", f"task.test_file={fixtures / 'mbpp_test.jsonl'}",
         "task.validation_size=2", f"model.name_or_path={fixtures}", *ONE_MEMBER_AT_15S],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # 32 generations of 1600/16 = 100-step truncations: two runs per particle, staggered (the first generation's
    # truncations reach up to the whole run), so 2.46 whole-run generations' information, not 32
    assert "= 2 episodes, one run per particle each" in out
    assert re.search(r"equal information: 709,600 member-steps / \(population 180 x train.steps=1600\) = 2.46 "
                     r"whole-run generations", out)
    assert "of the same population and GENERATIONS" in out and "compare searches by those" in out
    assert "180 particles x 1 boundary checkpoint each" in out and "#SBATCH --array=0-179%180" in out
    # the first generation's array asks for a whole run's time; every later one for its 100 steps' (100 x 15 s +
    # the preset's short_run_overhead_min of 3 min, with the limit's headroom)
    assert "each later generation's members and array tasks 2520 s (0.70 h), for their 100 steps" in out


def test_a_training_run_in_two_truncations_continues_from_the_particles_checkpoint(tmp_path, monkeypatch):
    """The real member (train_in_process, tiny model): [0, 2) then [2, 4) of a 4-step run. The first scores the
    untouched model, trains, and publishes its checkpoint at step 2; the second resumes there (the schedule still
    over 4 steps) and reports its change from the first's end; the particle's score telescopes."""
    from conf_groups import load_group
    from inner_loop.member.lifecycle import train_in_process

    monkeypatch.setenv("MIRROR_ES_CACHE", str(tmp_path / "cache"))
    inner = {"task": load_group("task", "arith"), "model": load_group("model", "tiny"),
             "divergence": load_group("divergence", "prob_l2"), "train": load_group("train", "default")}
    inner["model"].update({"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
                           "warmup_max_steps": 200, "warmup_band": [0.0, 1.0], "warmup_check_every": 200,
                           "warmup_probe_size": 32, "warmup_lr": 3e-3, "warmup_batch_size": 32})
    inner["train"].update({"steps": 4, "batch_size": 16, "group_size": 4, "save_every": 1, "val_size": 32,
                           "max_completion_length": 6})
    particle = tmp_path / "particle"
    records = []
    for generation, (start, stop) in enumerate(((0, 2), (2, 4))):
        piece = Truncation(particle=0, episode=0, start=start, stop=stop, horizon=4, particle_dir=str(particle))
        spec = MemberSpec(run_id="t", generation=generation, index=0, seed=3, params=[], inner=inner,
                          work_dir=str(tmp_path / f"gen{generation}"), truncation=piece.to_dict())
        records.append(train_in_process(spec))
        assert records[-1].status == "ok", records[-1].error
        boundary = piece.boundary(stop)
        state = json.loads((boundary / "trainer_state.json").read_text())
        assert state["global_step"] == stop and state["max_steps"] == 4  # the schedule is the whole run's
        assert read_boundary(boundary)["score"] == records[-1].diagnostics[END_SCORE]
    first, second = records
    assert second.steps_done == 4 and second.diagnostics[START_SCORE] == first.diagnostics[END_SCORE]
    assert first.fitness + second.fitness == pytest.approx(second.diagnostics[END_SCORE]
                                                          - first.diagnostics[START_SCORE])


def test_selection_and_the_result_table_train_whole_runs_and_export_their_choice(tmp_path):
    from meta.search.after.export import export_init

    assert main([f"run_dir={tmp_path}", "new=true", *[a for a in SYNTH if a != "reevaluate.top_k=0"],
                 "population=4", "generations=3", "reevaluate.top_k=1", "reevaluate.seeds=2",
                 "reevaluate.report_seeds=2", "reevaluate.baselines=[center,radius_random]"]) == 0
    store = RunStore(tmp_path)
    assert store.read_result_table() is not None
    for folder in (store.reevaluate_dir(), store.reevaluate_dir(reporting=True)):
        for member_dir in sorted(folder.glob("member_*")):
            spec = json.loads((member_dir / "spec.json").read_text())
            assert spec["truncation"] is None and spec["inner"]["train"]["steps"] == H  # whole runs of train.steps
    chosen = export_init(tmp_path, "best", tmp_path / "init.safetensors")
    summary = store.read_reevaluation()
    assert chosen["candidate"] == summary["chosen"]  # the full-run re-evaluation's choice, not a truncation's gain


def test_a_short_member_horizon_scores_the_unrolled_problem_at_its_own_steps(tmp_path):
    """es.member_steps=T on the synthetic unrolled problem: a member's fitness is its score after T steps, the
    objective whose optimum the short search of the bias test finds."""
    from meta.synthetic import unrolled_loss, unrolled_rate

    assert main([f"run_dir={tmp_path}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                 "train.steps=48", "es.member_steps=4", "population=2", "generations=1", "reevaluate.top_k=0",
                 "+inner.options={unrolled:{floor:0.5}}"]) == 0
    store = RunStore(tmp_path)
    values = store.read_population(0)
    members = _members(store)
    for index in range(2):
        assert members.loc[(0, index), "fitness"] == pytest.approx(
            1.0 - unrolled_loss(unrolled_rate(values[index].tolist()), 4, 0.5))


@pytest.mark.parametrize("override, named", [("es.member_steps=4", "es.member_steps=4"),
                                             ("seeds_per_member=2", "seeds_per_member=2"),
                                             ("es.truncation_steps=13", "es.truncation_steps=13"),
                                             ("early_stop.enabled=true", "early_stop"),
                                             ("es.horizon_steps=8", "es.horizon_steps=8 must equal train.steps=12"),
                                             ("es.ranking_method=centered", "es.ranking_method='centered'")])
def test_settings_that_do_not_apply_to_nres_are_refused_before_anything_is_written(tmp_path, override, named, capsys):
    assert main([f"run_dir={tmp_path / 'run'}", "new=true", *SYNTH, "population=4", override]) == 2
    assert named in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_each_generation_of_a_staggered_search_is_limited_to_its_own_longest_truncation(tmp_path, monkeypatch):
    """Pairs staggered over the run: the first generation's truncations reach far into it, later ones are one piece;
    each generation's members (and a SLURM array's --time) get their own generation's limit, not the first's."""
    from launch.runner import MemberArrayRunner

    limits: dict[int, float] = {}
    original = MemberArrayRunner.run

    def run(self):  # noqa: ANN001, ANN202 - the runner's own method, observed
        limits[self.specs[0].generation] = self.policy.timeout_s
        return original(self)

    monkeypatch.setattr(MemberArrayRunner, "run", run)
    args = [a for a in SYNTH if a != "es.stagger=false"]
    assert main([f"run_dir={tmp_path}", "new=true", *args, "es.stagger=true", "population=6", "generations=2",
                 "resources.step_time_s=60", "resources.member_time_min=13", "resources.short_run_overhead_min=1",
                 "inner.timeout_s=7200"]) == 0
    members = _members(RunStore(tmp_path))
    assert members.loc[(0, 4), "diag_truncation_stop"] == H  # pair 2's first truncation: the whole run
    assert members.loc[(1, 0), "diag_truncation_stop"] - members.loc[(1, 0), "diag_truncation_start"] == K
    # 12 steps x 60 s + 1 min of 13: the whole run's limit; 4 steps: ceil(7200 x 5/13) s
    assert limits == {0: 7200.0, 1: float(math.ceil(7200 * 5 / 13))}

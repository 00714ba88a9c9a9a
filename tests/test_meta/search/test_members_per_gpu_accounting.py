"""Issue 38, the config and accounting side of k members sharing one GPU: resources.members_per_gpu is checked up
front; each member's inner config carries its 1/k memory share; a member's expected time, inner.timeout_s and the
plans' GPU-hours follow from the measured slowdown (k itself when none was measured, with a warning); the status
views count running time x gpus / k; the members table and the status lines show the GPU a member shared."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

import meta.synthetic
from meta.compose import compose
from meta.search.config import ConfigError
from meta.search.run import main
from meta.search.member_rows import GpuUse, gpu_hours, gpu_use, member_row, row_line
from results.store.gpu_share import write_gpu_share
from core.gpu_time import SLOWDOWN_BENCH, gpu_sharing
from core.keys import MEMBER_GPU_MEMORY_KEY, MEMBER_GPU_SHARERS_KEY, MEMBER_GPUS_KEY
from core.records import gpus_entry
from plan_inputs import SHARED_AT_15S
from results.store.run_store import RunStore

#: the issue's mbpp plan with the synthetic entry point: the plan's figures are the preset's (its resources, steps,
#: population), and no model, data set or scheduler is asked (tests/test_meta/search/test_meta_plan.py runs the real member's
#: checks)
MBPP = ["experiment=mbpp_qwen3", "launcher=slurm", "population=180", "generations=15", "dry_run=true", "new=true",
        *SHARED_AT_15S, "inner.entrypoint=meta.synthetic:member"]
SYNTH = ["inner.entrypoint=meta.synthetic:member", "launcher=debug", "new=true"]


@pytest.mark.parametrize("override, words", [
    ("resources.members_per_gpu=3", ["resources.members_per_gpu=3 must be 1, 2 or 4"]),
    ("resources.shared_slowdown={3:1.2}", ["resources.shared_slowdown has the key 3", "2 or 4"]),
    ("resources.shared_slowdown={2:0.8}", ["resources.shared_slowdown[2]=0.8 must be a number >= 1"]),
])
def test_a_bad_sharing_setting_fails_up_front_naming_the_key_and_writes_nothing(tmp_path, capsys, override, words):
    with pytest.raises(ConfigError) as caught:
        compose([override])
    assert all(word in str(caught.value) for word in words)
    assert main([f"run_dir={tmp_path / 'r'}", *SYNTH, override]) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err
    assert not (tmp_path / "r").exists()


def test_the_members_share_reaches_the_inner_config_and_k1_stays_as_it_was():
    alone = {"gpus": 1, "members_per_gpu": 1}
    assert gpus_entry(alone) == {MEMBER_GPUS_KEY: 1}  # no share key at all: an existing inner config is unchanged
    assert gpus_entry({**alone, "gpu_memory_fraction": 0.9}) == {MEMBER_GPUS_KEY: 1, MEMBER_GPU_MEMORY_KEY: 0.9}
    assert gpus_entry({"gpus": 1, "members_per_gpu": 2}) == {
        MEMBER_GPUS_KEY: 1, MEMBER_GPU_MEMORY_KEY: 0.5, MEMBER_GPU_SHARERS_KEY: 2}
    assert gpus_entry({"gpus": 1, "members_per_gpu": 4, "gpu_memory_fraction": 0.8}) == {
        MEMBER_GPUS_KEY: 1, MEMBER_GPU_MEMORY_KEY: pytest.approx(0.2), MEMBER_GPU_SHARERS_KEY: 4}


def test_the_timeout_follows_the_shared_members_slower_time():
    alone = compose(["experiment=mbpp_qwen3", *SHARED_AT_15S])
    shared = compose(["experiment=mbpp_qwen3", *SHARED_AT_15S, "resources.members_per_gpu=2"])
    assert alone["resources"]["member_time_min"] == shared["resources"]["member_time_min"] == 412
    assert alone["inner"]["timeout_s"] == math.ceil(412 * 60 * 1.5)
    assert shared["inner"]["timeout_s"] == math.ceil(412 * 1.183 * 60 * 1.5)  # 1.183: the preset's measurement
    assert compose(["experiment=mbpp_qwen3", *SHARED_AT_15S, "resources.members_per_gpu=4"])["inner"]["timeout_s"] == \
        math.ceil(412 * 4 * 60 * 1.5)  # unmeasured: k itself


def _gpu_hours(out: str) -> float:
    return float(re.search(r"GPU-hours, whole search: .* = ([\d,.]+) GPU-h", out).group(1).replace(",", ""))


def test_two_members_per_gpu_cost_1_183_over_2_of_the_mbpp_searchs_gpu_hours(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")  # no scheduler command is asked
    assert main([f"run_dir={tmp_path / 'a'}", *MBPP]) == 0
    alone = capsys.readouterr().out
    assert main([f"run_dir={tmp_path / 'b'}", *MBPP, "resources.members_per_gpu=2"]) == 0
    shared = capsys.readouterr().out
    assert _gpu_hours(shared) / _gpu_hours(alone) == pytest.approx(1.183 / 2, rel=1e-3)
    assert "GPU sharing: resources.members_per_gpu=2: tasks per generation = ceil(members / 2) = ceil(181 / 2) = 91" \
        in shared and "slowdown measured: " not in alone
    assert "measured: scripts/gpu_pass.sh bench:faster:x2, one H200 (141 GB)" in shared
    assert "time per member: 487.4 min expected (412 min alone x slowdown 1.183 with 2 members per GPU" in shared
    assert "WARNING: no measured slowdown" not in shared
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_unmeasured_k_is_planned_at_k_with_a_warning_naming_the_bench(tmp_path, capsys):
    synth = [*SYNTH, "dry_run=true", "resources.gpus=1", "resources.member_time_min=60", "population=4",
             "generations=1", "control_member=false", "reevaluate.top_k=0"]
    assert main([f"run_dir={tmp_path / 'a'}", *synth]) == 0
    alone = capsys.readouterr().out
    assert main([f"run_dir={tmp_path / 'b'}", *synth, "resources.members_per_gpu=4"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: no measured slowdown for 4 members per GPU" in out and SLOWDOWN_BENCH in out
    assert "WARNING: no measured slowdown" not in alone
    assert _gpu_hours(out) == pytest.approx(_gpu_hours(alone))  # x4 slower / 4 per GPU: no gain
    assert gpu_sharing({"gpus": 1, "members_per_gpu": 4, "shared_slowdown": {"2": 1.2}}).slowdown == 4.0


def test_status_counts_running_time_x_gpus_over_k_and_shows_the_shared_gpu(tmp_path):
    use = gpu_use({"resources": {"gpus": 1, "members_per_gpu": 2}})
    assert use == GpuUse(1, 2) and gpu_use({"resources": {"gpus": 1}}) == GpuUse(1, 1)  # runs made before the key
    work_dir = tmp_path / "member_0000"
    write_gpu_share(work_dir, task="123_4", gpus="0", members=[5], members_per_gpu=2)
    row = member_row("member 000", work_dir, None, {}, now=0.0)
    row.wall_s = 7200.0
    assert gpu_hours([row, row], use) == pytest.approx(2.0)  # 2 x 2 h x 1 GPU / 2
    line = row_line(row, use)
    assert "1.00 GPU-h" in line and "shared: task 123_4, GPU 0, with 5" in line
    assert "shared:" not in row_line(member_row("member 001", tmp_path / "alone", None, {}, now=0.0), use)
    lone_dir = tmp_path / "member_0002"  # the odd member of a packed generation: its task held the GPU for it alone
    write_gpu_share(lone_dir, task="123_5", gpus="0", members=[], members_per_gpu=1)
    lone = member_row("member 002", lone_dir, None, {}, now=0.0)
    lone.wall_s = 7200.0
    assert gpu_hours([row, row, lone], use) == pytest.approx(4.0)  # 2 + 2 h x 1 GPU alone
    assert "2.00 GPU-h" in row_line(lone, use)


def test_the_members_table_has_the_gpu_each_member_shared(tmp_path, monkeypatch):
    plain = meta.synthetic.member

    def sharing_member(spec):  # as the launcher would: the file is there before the member trains
        if spec.index == 1:
            write_gpu_share(spec.work_dir, task="77_0", gpus="0", members=[0], members_per_gpu=2)
        return plain(spec)

    monkeypatch.setattr(meta.synthetic, "member", sharing_member)
    assert main([f"run_dir={tmp_path}", *SYNTH, "population=2", "generations=1", "control_member=false",
                 "reevaluate.top_k=0"]) == 0
    members = RunStore(tmp_path).read_members().set_index(["generation", "index"])
    assert members.loc[(0, 1), "gpu_share"] == "task 77_0, GPU 0, with 0"
    assert members.loc[(0, 0), "gpu_share"] == ""

"""A search started before the layout change resumes with SLURM jobs in flight: their submission pickles name the
member callable by its old module path, and a job requeued after the upgrade must still unpickle it."""
from __future__ import annotations

import functools
import importlib
import pickle
import pickletools
import sys
from pathlib import Path

import pytest

from launch.member import load_program, run_member
from launch.slurm.member import CheckpointableMember
from meta.settings.upgrade import ADDED_SEARCH_KEYS
from meta.search.resume import split_differences
from core.member_program import MemberProgram
from core.records import MemberSpec
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[2]


def test_a_pickle_that_names_the_old_module_path_loads_the_current_member_callable():
    data = pickle.dumps(CheckpointableMember(), protocol=4)
    old = data.replace(b"launch.slurm.member", b"launch.slurm_member")  # as submitit pickled it before the move
    names = [arg for op, arg, _ in pickletools.genops(old) if op.name in ("SHORT_BINUNICODE", "BINUNICODE")]
    assert "launch.slurm_member" in names  # the test pickle really names the old path
    assert type(pickle.loads(old)) is CheckpointableMember


# The layout by stage (inner_loop/member/, inner_loop/training/, meta/search/, ...) moved the member's entry point, and
# the member program (core/member_program.py) replaced the entry function. A search started before either
# stored ``inner.entrypoint`` in its config.yaml and in the arguments of its queued jobs; each name loads the program
# it ran, hooks and all.
OLD_ENTRYPOINTS = {
    "inner_loop.member.entry:train_member": "inner_loop.member.entry",   # conf's default until the member program
    "inner_loop.member_entry:train_member": "inner_loop.member.entry",   # ... until the layout by stage
    "inner_loop.member:train_member": "inner_loop.member.entry",         # the one before it
    "inner_loop:train_member": "inner_loop.member.entry",                # the package door's export
    "meta.synthetic:member": "meta.synthetic",                          # the synthetic objective's function
    "meta.tune.synthetic:run": "meta.tune.synthetic",                   # the tuning stand-in's function
}


@pytest.mark.parametrize("old", sorted(OLD_ENTRYPOINTS))
def test_an_entry_point_a_run_stored_before_the_change_loads_the_current_program(old):
    program = importlib.import_module(OLD_ENTRYPOINTS[old]).program
    assert isinstance(program, MemberProgram) and load_program(old) is program


def test_the_old_entry_module_is_the_new_one():
    import inner_loop.member.entry as entry
    import inner_loop.member_entry as old

    assert old is entry and old.__name__ == "inner_loop.member.entry"  # a pinned child starts the new path
    assert old.train_member is entry.train_member


def test_a_pickle_of_the_entry_function_by_its_old_module_path_loads_the_current_one():
    from inner_loop.member.entry import train_member

    data = pickle.dumps(train_member, protocol=4).replace(b"inner_loop.member.entry", b"inner_loop.member_entry")
    assert pickle.loads(data) is train_member


def test_a_fresh_process_loads_the_program_by_the_old_entry_path_without_torch():
    code = ("import sys, inner_loop.member_entry as e; from launch.member import load_program, resolve_target; "
            "assert resolve_target('inner_loop.member_entry:train_member', 'k') is e.train_member; "
            "assert load_program('inner_loop.member_entry:train_member') is e.program; "
            "assert e.__name__ == 'inner_loop.member.entry' and 'torch' not in sys.modules")
    done = run_with_progress([sys.executable, "-c", code], cwd=ROOT)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("stored", ["inner_loop.member_entry:train_member", "inner_loop.member.entry:train_member"])
def test_a_run_stored_with_an_old_entry_point_resumes_under_the_new_default(stored):
    old = {**ADDED_SEARCH_KEYS, "population": 4, "inner": {"entrypoint": stored}}
    new = {**old, "inner": {"entrypoint": "inner_loop.member.entry:program"}}
    refused, allowed = split_differences(old, new)
    assert refused == [] and [key for key, *_ in allowed] == ["inner.entrypoint"]
    other = {**old, "inner": {"entrypoint": "meta.synthetic:program"}}
    assert [key for key, *_ in split_differences(old, other)[0]] == ["inner.entrypoint"]  # another program: refused


def test_a_queued_job_pickled_with_an_old_entry_point_runs_and_its_program_finalizes(tmp_path):
    """A job submitted before the change: submitit pickled ``run_member`` with the entry point's string. It runs the
    program that string loads now, and the search's finalize of that name reaches the program's hook."""
    from meta.synthetic import CHECKPOINT_FILE

    work_dir = tmp_path / "member"
    spec = {"run_id": "old", "generation": 0, "index": 0, "seed": 0, "params": [0.02] * 380,
            "work_dir": str(work_dir), "inner": {"options": {"steps": 2}}}
    job = pickle.loads(pickle.dumps(functools.partial(run_member, "meta.synthetic:member", spec, 0.0), protocol=4))
    assert job()["status"] == "ok"
    assert (work_dir / CHECKPOINT_FILE).exists()  # the synthetic step counter, kept for a retry
    load_program("meta.synthetic:member").finalize(MemberSpec.from_dict(spec))
    assert not (work_dir / CHECKPOINT_FILE).exists()


def test_a_divergence_config_pickled_before_the_learned_map_had_its_own_class_keeps_its_settings():
    """Before NeuralMirrorConfig, ``init`` and ``param_transform`` were fields of inner_loop.config.DivergenceConfig;
    such a pickle (the shared class, the map's keys in its state) still builds the map it described."""
    import torch

    from inner_loop.config import DivergenceConfig, divergence_config
    from inner_loop.loss.regularizers import build_regularizer
    from mirror_maps import VECTOR_LENGTH, NeuralMirrorMap

    before = DivergenceConfig(name="neural_mirror", coef=0.5)
    vars(before).update(init=None, param_transform="none")
    data = pickle.dumps(before, protocol=2)  # GLOBAL names the class as text: put it back where it lived
    old = data.replace(b"inner_loop.loss.divergences\nDivergenceConfig", b"inner_loop.config\nDivergenceConfig")
    assert old != data
    loaded = pickle.loads(old)
    cfg = divergence_config(loaded)
    assert type(cfg).__name__ == "NeuralMirrorConfig" and (cfg.param_transform, cfg.coef) == ("none", 0.5)
    vector = torch.linspace(-1.0, 1.0, VECTOR_LENGTH)
    reg = build_regularizer(loaded, vector.tolist())
    expected = NeuralMirrorMap.from_vector(vector, param_transform="none")
    torch.testing.assert_close(reg.potential.to_vector(), expected.to_vector())

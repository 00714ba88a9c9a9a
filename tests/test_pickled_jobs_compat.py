"""A search started before the layout change resumes with SLURM jobs in flight: their submission pickles name the
member callable by its old module path, and a job requeued after the upgrade must still unpickle it."""
from __future__ import annotations

import importlib
import pickle
import pickletools
import sys
from pathlib import Path

import pytest

from launch.member import resolve_target
from launch.slurm.member import CheckpointableMember
from meta.config import ADDED_SEARCH_KEYS
from meta.search.resume import split_differences
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[1]


def test_a_pickle_that_names_the_old_module_path_loads_the_current_member_callable():
    data = pickle.dumps(CheckpointableMember(), protocol=4)
    old = data.replace(b"launch.slurm.member", b"launch.slurm_member")  # as submitit pickled it before the move
    names = [arg for op, arg, _ in pickletools.genops(old) if op.name in ("SHORT_BINUNICODE", "BINUNICODE")]
    assert "launch.slurm_member" in names  # the test pickle really names the old path
    assert type(pickle.loads(old)) is CheckpointableMember


# The layout by stage (inner_loop/member/, inner_loop/training/, meta/search/, ...) moved the member's entry point. A
# search started before it stored ``inner.entrypoint`` in its config.yaml and in the arguments of its queued jobs.
OLD_ENTRYPOINTS = {
    "inner_loop.member_entry:train_member": ("inner_loop.member.entry", "train_member"),   # conf's default until then
    "inner_loop.member:train_member": ("inner_loop.member.lifecycle", "train_member"),     # the one before it
}


@pytest.mark.parametrize("old", sorted(OLD_ENTRYPOINTS))
def test_an_entry_point_a_run_stored_before_the_move_resolves_to_the_current_function(old):
    module, name = OLD_ENTRYPOINTS[old]
    assert resolve_target(old, "inner.entrypoint") is getattr(importlib.import_module(module), name)


def test_the_old_entry_module_is_the_new_one_with_its_hooks():
    import inner_loop.member.entry as entry
    import inner_loop.member_entry as old

    assert old is entry and old.__name__ == "inner_loop.member.entry"  # a pinned child starts the new path
    for hook in ("validate", "finalize", "stage", "use_staged", "preflight"):  # what meta asks of the entry point
        assert getattr(old.train_member, hook) is getattr(entry.train_member, hook)


def test_a_pickle_of_the_entry_function_by_its_old_module_path_loads_the_current_one():
    from inner_loop.member.entry import train_member

    data = pickle.dumps(train_member, protocol=4).replace(b"inner_loop.member.entry", b"inner_loop.member_entry")
    assert pickle.loads(data) is train_member


def test_a_fresh_process_imports_the_old_entry_path_without_torch():
    code = ("import sys, inner_loop.member_entry as e; from launch.member import resolve_target; "
            "assert resolve_target('inner_loop.member_entry:train_member', 'k') is e.train_member; "
            "assert e.__name__ == 'inner_loop.member.entry' and 'torch' not in sys.modules")
    done = run_with_progress([sys.executable, "-c", code], cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_a_run_stored_with_the_old_entry_point_resumes_under_the_new_default():
    old = {**ADDED_SEARCH_KEYS, "population": 4, "inner": {"entrypoint": "inner_loop.member_entry:train_member"}}
    new = {**old, "inner": {"entrypoint": "inner_loop.member.entry:train_member"}}
    refused, allowed = split_differences(old, new)
    assert refused == [] and [key for key, *_ in allowed] == ["inner.entrypoint"]
    other = {**old, "inner": {"entrypoint": "meta.synthetic:member"}}
    assert [key for key, *_ in split_differences(old, other)[0]] == ["inner.entrypoint"]  # another function: refused


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

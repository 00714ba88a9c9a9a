"""A search started before the layout change resumes with SLURM jobs in flight: their submission pickles name the
member callable by its old module path, and a job requeued after the upgrade must still unpickle it."""
from __future__ import annotations

import pickle
import pickletools

from launch.slurm.member import CheckpointableMember


def test_a_pickle_that_names_the_old_module_path_loads_the_current_member_callable():
    data = pickle.dumps(CheckpointableMember(), protocol=4)
    old = data.replace(b"launch.slurm.member", b"launch.slurm_member")  # as submitit pickled it before the move
    names = [arg for op, arg, _ in pickletools.genops(old) if op.name in ("SHORT_BINUNICODE", "BINUNICODE")]
    assert "launch.slurm_member" in names  # the test pickle really names the old path
    assert type(pickle.loads(old)) is CheckpointableMember

"""launcher=local passes the orchestrator's GPUs through to its members (issue 13, item 8).

submitit's LocalExecutor sets every member's CUDA_VISIBLE_DEVICES from its gpus_per_node, whose default 0 hides
every GPU; a member of a local search on a GPU machine then trained on the CPU."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from launch.local.launchers import LocalLauncher
from meta import synthetic
from core.records import MemberSpec

HERE = Path(__file__).resolve().parent  # member processes import this module
ROOT = HERE.parents[2]
UNSET = "<unset>"  # what a member reports when CUDA_VISIBLE_DEVICES is not set at all


def record_gpus(spec: Any) -> dict[str, Any]:
    """Member entry point: note the CUDA_VISIBLE_DEVICES this member process sees, then a synthetic result."""
    member = MemberSpec.from_dict(spec) if isinstance(spec, dict) else spec
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", UNSET)
    (Path(member.work_dir) / "gpus.json").write_text(json.dumps({"CUDA_VISIBLE_DEVICES": seen}))
    return synthetic.member(member)


def _member_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parent: str | None, **options: Any) -> str:
    if parent is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(ROOT)]))
    LocalLauncher.validate_options(options)
    launcher = LocalLauncher(kill_grace_s=30, **options)
    work_dir = tmp_path / "member"
    work_dir.mkdir()
    spec = MemberSpec(run_id="gpus", generation=0, index=0, seed=0, params=[0.0] * 380, work_dir=str(work_dir))
    (ref,) = launcher.submit("test_meta_run_gpus:record_gpus", [spec], tmp_path / "submitit", timeout_s=120)
    result = launcher._jobs[ref.job_id].result()
    assert result["status"] == "ok", result
    return json.loads((work_dir / "gpus.json").read_text())["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("parent", ["2,3", "1", ""])
def test_a_local_member_sees_the_parents_cuda_visible_devices(tmp_path, monkeypatch, parent):
    assert _member_sees(tmp_path, monkeypatch, parent) == parent


def test_a_local_member_sees_every_gpu_torch_sees_when_the_parent_restricts_none(tmp_path, monkeypatch):
    import torch

    every = ",".join(str(i) for i in range(torch.cuda.device_count()))  # "" on a CPU build: no GPU to see
    assert _member_sees(tmp_path, monkeypatch, None) == every


def test_gpus_named_by_uuid_are_refused_up_front_with_the_fix(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-6f1c2e7a-0b1d-4c3e-9a55-1f2e3d4c5b6a")
    with pytest.raises(ValueError, match="names GPUs by UUID.*launcher.visible_gpus"):
        LocalLauncher.validate_options({"gpus_per_node": None})
    LocalLauncher.validate_options({"gpus_per_node": 1, "visible_gpus": [0]})  # explicit indices need no parent


def test_an_explicit_gpu_count_uses_submitits_own_assignment(tmp_path, monkeypatch):
    assert _member_sees(tmp_path, monkeypatch, "5,6", gpus_per_node=0) == ""
    other = tmp_path / "again"
    other.mkdir()
    assert _member_sees(other, monkeypatch, "5,6", gpus_per_node=1, visible_gpus=[6]) == "6"


def test_bad_local_gpu_settings_name_the_key():
    with pytest.raises(ValueError, match="launcher.gpus_per_node"):
        LocalLauncher.validate_options({"gpus_per_node": -1})
    with pytest.raises(ValueError, match="launcher.visible_gpus"):
        LocalLauncher.validate_options({"visible_gpus": "0,1"})
    with pytest.raises(ValueError, match="launcher.gpus_per_node=2 is more than the 1 GPU"):
        LocalLauncher.validate_options({"gpus_per_node": 2, "visible_gpus": [0]})

"""Issue 13's "done when" for disk: an embedded search with default settings leaves no checkpoints behind in its
member directories, and every member's record carries its peak disk use, which the report shows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from results.store.run_store import RunStore

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_embedded_search_leaves_no_checkpoints_in_member_dirs(tmp_path):
    run_dir = tmp_path / "search"
    # save_every=4: each member writes checkpoints 4, 8 and 10 (the Trainer also saves at the last step).
    done = subprocess.run([sys.executable, "-m", "meta.run", f"run_dir={run_dir}", "new=true", "population=4", "generations=1",
                           "launcher=debug", "control_member=false", "reevaluate.top_k=0", "train.steps=10", "train.save_every=4", "train.val_size=8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    members = RunStore(run_dir).read_members()
    assert len(members) == 4 and set(members["status"]) == {"ok"}, members[["status", "error"]]
    member_dirs = sorted(p for p in run_dir.glob("gen_*/member_*") if p.is_dir())
    assert len(member_dirs) == 4
    for member_dir in member_dirs:
        record = json.loads((member_dir / "result.json").read_text())
        assert record["steps_done"] == 10
        leftovers = [str(p.relative_to(member_dir)) for p in member_dir.rglob("checkpoint-*")]
        assert leftovers == [], f"{member_dir} kept checkpoints {leftovers}"
        assert isinstance(record["disk_peak_bytes"], int) and record["disk_peak_bytes"] > 0

    report = subprocess.run([sys.executable, "-m", "results.report", str(run_dir)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "disk" in report.stdout and "disk_peak_bytes" in (run_dir / "report" / "members.csv").read_text()

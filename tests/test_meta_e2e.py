"""The embedded default end to end: tiny model, arith, population 4, 2 generations through the local
launcher, export of the best init, and a single NM-GRPO run that loads it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mirror_maps import load_init
from results.store.run_store import RunStore

ROOT = Path(__file__).resolve().parent.parent
SHORT = ["train.steps=2", "train.val_size=8"]


def _python(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_embedded_default_search_export_and_single_run(tmp_path):
    """The embedded default with its control member and a small re-evaluation (top 1 member + centre, 2 seeds
    each), the chosen init scored on the test split, exported by its re-evaluated mean, then loaded by a run."""
    run_dir = tmp_path / "search"
    done = _python("-m", "meta.run", f"run_dir={run_dir}", "population=4", "generations=2", "launcher=local",
                   "reevaluate.top_k=1", "reevaluate.seeds=2", *SHORT, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    store = RunStore(run_dir)
    assert store.state_generations() == [0, 1]
    members = store.read_members()
    assert len(members) == 10 and set(members["status"]) == {"ok"}, members[["status", "error"]]
    assert members["val_size"].min() > 0
    assert (members["role"] == "control").sum() == 2
    summary = store.read_reevaluation()
    assert [c["n"] for c in summary["candidates"]] == [2, 2]
    for index in range(2):  # the test split is scored for the chosen init only, by real members
        record = json.loads((store.reevaluate_dir(test=True) / f"member_{index:03d}" / "result.json").read_text())
        assert record["status"] == "ok" and record["eval_split"] == "test"
    for index in range(4):
        record = json.loads((store.reevaluate_dir() / f"member_{index:03d}" / "result.json").read_text())
        assert record["eval_split"] == "validation"

    init = tmp_path / "best_mirror.pt"
    done = _python("-m", "meta.export", f"run_dir={run_dir}", f"out={init}", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    _, metadata = load_init(init)
    chosen = next(c for c in summary["candidates"] if c["name"] == summary["chosen"])
    assert metadata["reevaluated_mean"] == pytest.approx(chosen["mean"]) and metadata["reevaluated_n"] == 2
    assert metadata["test_n"] == 2

    done = _python("-m", "inner_loop.run", "divergence=neural_mirror", f"divergence.init={init}",
                   f"work_dir={tmp_path / 'single'}", "train.steps=1", "train.val_size=8", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "single" / "result.json").read_text())
    assert record["status"] == "ok"

"""The embedded default end to end: tiny model, arith, population 2 (one antithetic pair), 2 generations through
the local launcher, export of the best init, and a single NM-GRPO run that loads it. Members save a checkpoint at every step
and, finished, keep none of them (the default checkpoint policy), while their records carry their peak disk use,
which the report shows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mirror_maps import load_init
from results.store.run_store import RunStore
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[3]
SHORT = ["train.steps=2", "train.val_size=8", "train.save_every=1"]


def _python(*args: str) -> subprocess.CompletedProcess:
    return run_with_progress([sys.executable, *args], cwd=ROOT)  # stopped only when idle: tests/time_limits.py


@pytest.mark.slow
def test_embedded_default_search_export_and_single_run(tmp_path):
    """The embedded default with its control member, selection (top 1 member + centre, 2 seeds each) and the
    result table (the exported init and the 7 baselines on 2 other seeds, with the test split), exported by its
    lower bound, then trained by a single run exactly as its reporting run was."""
    run_dir = tmp_path / "search"
    done = _python("-m", "meta.run", f"run_dir={run_dir}", "new=true", "population=2", "generations=2", "launcher=local",
                   "reevaluate.top_k=1", "reevaluate.seeds=2", "reevaluate.report_seeds=2", *SHORT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NM-GRPO-ES (exported init) minus each baseline" in done.stdout  # the table ends the run
    store = RunStore(run_dir)
    assert store.state_generations() == [0, 1]
    members = store.read_members()
    assert len(members) == 6 and set(members["status"]) == {"ok"}, members[["status", "error"]]
    assert members["val_size"].min() > 0
    assert (members["role"] == "control").sum() == 2
    for member_dir in sorted(p for p in run_dir.glob("gen_*/member_*") if p.is_dir()):
        leftovers = [str(p.relative_to(member_dir)) for p in member_dir.rglob("checkpoint-*")]
        assert leftovers == [], f"{member_dir} kept checkpoints {leftovers}"
    assert (members["disk_peak_bytes"] > 0).all()
    report = _python("-m", "results.report", str(run_dir))
    assert report.returncode == 0, report.stderr[-3000:]
    assert "disk" in report.stdout and "disk_peak_bytes" in (run_dir / "report" / "members.csv").read_text()
    summary = store.read_reevaluation()
    assert [c["n"] for c in summary["candidates"]] == [2, 2]
    for index in range(4):
        record = json.loads((store.reevaluate_dir() / f"member_{index:03d}" / "result.json").read_text())
        assert record["eval_split"] == "validation" and not record.get("evaluations")
    reporting = store.reevaluate_dir(reporting=True)
    records = [json.loads((reporting / f"member_{index:03d}" / "result.json").read_text()) for index in range(16)]
    assert all(r["status"] == "ok" and r["evaluations"]["test"]["size"] > 0 for r in records)
    assert records[14]["steps_done"] == 0  # the base model: scored untrained
    table = store.read_result_table()
    assert table["verdict"] and done.stdout.rstrip().endswith(table["verdict"][-1])  # the verdict ends the run
    assert table["rows"][0]["metrics"]["test"]["mean"] == pytest.approx(
        (records[0]["evaluations"]["test"]["pass_at_1"] + records[1]["evaluations"]["test"]["pass_at_1"]) / 2)

    init = tmp_path / "best_mirror.safetensors"
    done = _python("-m", "meta.export", f"run_dir={run_dir}", f"out={init}")
    assert done.returncode == 0, done.stderr[-3000:]
    _, metadata = load_init(init)
    chosen = next(c for c in summary["candidates"] if c["name"] == summary["chosen"])
    assert metadata["selection_mean"] == pytest.approx(chosen["mean"]) and metadata["selection_n"] == 2

    # The preset's single run of the exported init, on the exported row's first reporting seed: the same record
    spec = json.loads((reporting / "member_000" / "spec.json").read_text())
    done = _python("-m", "inner_loop.run", "experiment=tiny_arith", f"divergence.init={init}", f"seed={spec['seed']}",
                   f"work_dir={tmp_path / 'single'}", *SHORT)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "single" / "result.json").read_text())
    assert record["status"] == "ok"
    assert (record["fitness"], record["mean_response_tokens"]) == (records[0]["fitness"],
                                                                   records[0]["mean_response_tokens"])

"""results.report.compare over synthetic single-run dirs, and the provenance every single run records."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from inner_loop.loss.divergences import divergence
from results.report.compare import compare, main, to_markdown
from results.store.provenance import build_run_manifest, code_version, config_hash, data_hashes, write_run_manifest
from core.records import ResultRecord
from results.store.member_files import write_result
from results.store.run_store import RunStore
from conf_groups import load_group

SPLITS = {"train": ["1+1=", "2+2="], "validation": ["3+3="]}


def make_run(root, method, seed, fitness=None, tokens=0.0, status="ok", task="arith", result=True, lr=1e-5):
    """A single-run dir as inner_loop.run leaves it: manifest.json, and result.json once finished."""
    work = root / f"{task}_{method}_seed{seed}"
    inner = {"task": {"name": task}, "divergence": {"name": method}, "train": {"learning_rate": lr}, "model": {}}
    write_run_manifest(work, build_run_manifest(run_id="single", seed=seed, inner=inner, splits=SPLITS,
                                                length_reference=divergence(method).length_reference))
    if result:
        write_result(work, ResultRecord(status=status, fitness=fitness or 0.0, mean_response_tokens=tokens,
                                        error="CUDA out of memory" if status != "ok" else ""))
    return work


@pytest.fixture
def multirun(tmp_path):
    root = tmp_path / "multirun"
    for seed, (fit, tok) in enumerate([(0.5, 100.0), (0.6, 110.0), (0.7, 120.0)]):
        make_run(root, "kl", seed, fit, tok)
    make_run(root, "prob_l2", 0, 0.8, 88.0)
    make_run(root, "prob_l2", 1, 0.9, 88.0)
    make_run(root, "prob_l2", 2, status="failed")
    make_run(root, "neural_mirror", 0, result=False)  # still running or killed
    return root


def test_table_has_mean_std_over_seeds_and_length_change_against_kl(multirun):
    result = compare([multirun])
    table = result.table.set_index("method")
    assert table.loc["kl", "pass1_mean"] == pytest.approx(0.6)
    assert table.loc["kl", "pass1_std"] == pytest.approx(0.1)
    assert (table.loc["kl", "n_seeds"], table.loc["kl", "seeds"]) == (3, "0,1,2")
    assert table.loc["kl", "response_tokens_rel_change"] == pytest.approx(0.0)
    assert table.loc["prob_l2", "pass1_mean"] == pytest.approx(0.85)
    assert (table.loc["prob_l2", "n_seeds"], table.loc["prob_l2", "n_failed"]) == (2, 1)
    assert table.loc["prob_l2", "response_tokens_rel_change"] == pytest.approx((88 - 110) / 110)
    assert table.loc["neural_mirror", "n_seeds"] == 0 and pd.isna(table.loc["neural_mirror", "pass1_mean"])
    # provenance on every row
    for column in ("config_hash", "code_versions", "data_hashes", "seeds"):
        assert table[column].astype(str).str.len().gt(0).loc[["kl", "prob_l2"]].all(), column
    assert table.loc["kl", "config_hash"] != table.loc["prob_l2", "config_hash"]
    assert table["data_hashes"].nunique() == 1


def test_failed_and_missing_runs_are_listed_in_the_markdown(multirun):
    text = to_markdown(compare([multirun]))
    assert "| kl | arith | validation | 60.0 ± 10.0 | 110.0 | +0.0% | 3 (0,1,2) | 0 |" in text
    assert "-20.0%" in text
    assert "Runs not in the averages (2)" in text
    assert "- failed: prob_l2/arith seed 2" in text and "CUDA out of memory" in text
    assert "- missing: neural_mirror/arith seed 0" in text


def test_runs_without_provenance_unreadable_results_and_es_dirs_are_reported(multirun):
    orphan = multirun / "old_run"
    write_result(orphan, ResultRecord(status="ok", fitness=0.4))
    (make_run(multirun, "kl", 9, 0.9, 1.0) / "result.json").write_text("{broken")
    store = RunStore(multirun / "es_search")
    store.write_config("seed: 0\n")
    write_result(store.member_dir(0, 0), ResultRecord(status="ok", fitness=1.0))
    result = compare([multirun])
    states = dict(zip(result.problems["path"].map(lambda p: p.rsplit("/", 1)[-1]), result.problems["state"]))
    assert states["old_run"] == "no_manifest" and states["arith_kl_seed9"] == "unreadable"
    assert any("ES search run dir" in why for _, why in result.skipped)
    # neither the broken seed 9 nor the ES member leaked into the KL average
    assert result.table.set_index("method").loc["kl", "pass1_mean"] == pytest.approx(0.6)


def test_no_baseline_and_split_configs_are_said_not_guessed(tmp_path):
    make_run(tmp_path, "prob_l2", 0, 0.5, 10.0)
    make_run(tmp_path / "other", "prob_l2", 1, 0.7, 12.0, lr=3e-5)
    result = compare([tmp_path])
    assert len(result.table) == 2 and result.table["method"].str.startswith("prob_l2[").all()
    assert result.table["response_tokens_rel_change"].isna().all()
    assert any("no length-reference (the divergence registry's" in note for note in result.notes)


def test_the_length_reference_is_the_registry_s_flag_as_runs_recorded_it_or_the_named_baseline(multirun):
    table = compare([multirun]).table.set_index("method")
    assert table.loc["prob_l2", "response_tokens_rel_change"] == pytest.approx(88.0 / 110.0 - 1.0)  # kl: flagged
    named = compare([multirun], baseline="prob_l2").table.set_index("method")
    assert named.loc["kl", "response_tokens_rel_change"] == pytest.approx(110.0 / 88.0 - 1.0)
    for manifest in multirun.rglob("manifest.json"):  # runs recorded before the flag: no reference is guessed
        manifest.write_text(manifest.read_text().replace('"length_reference": true', '"length_reference": false'))
    older = compare([multirun])
    assert older.table["response_tokens_rel_change"].isna().all()
    assert any("pass --baseline" in note for note in older.notes)


def test_cli_writes_markdown_and_csv_and_rejects_bad_dirs(multirun, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main([str(multirun), "--out", str(out)]) == 0
    assert "| prob_l2 | arith |" in capsys.readouterr().out
    csv = pd.read_csv(out / "comparison.csv")
    assert set(csv["method"]) == {"kl", "prob_l2", "neural_mirror"}
    assert "Runs not in the averages" in (out / "comparison.md").read_text()
    assert len(pd.read_csv(out / "comparison_runs.csv")) == 7
    assert main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no single runs of python -m inner_loop.run" in capsys.readouterr().err


def test_config_hash_ignores_key_order_and_data_hash_tracks_prompts():
    assert config_hash({"a": 1, "b": {"c": 2, "d": 3}}) == config_hash({"b": {"d": 3, "c": 2}, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    base = data_hashes({"train": ["1 + 1 ="]})["train"]
    assert data_hashes({"train": ["1  +  1 =\n"]})["train"] == base  # same prompt, different whitespace
    assert data_hashes({"train": ["1 + 2 ="]})["train"] != base
    assert data_hashes({"train": ["1 + 1 =", "x"]})["train"] != base


def test_seeds_share_a_config_hash_and_an_init_files_content_counts(tmp_path):
    init = tmp_path / "init.pt"
    init.write_bytes(b"one")
    inner = {"task": {"name": "arith"}, "divergence": {"name": "neural_mirror", "init": str(init)}}
    first = build_run_manifest(run_id="single", seed=0, inner=inner, splits=SPLITS)
    assert build_run_manifest(run_id="single", seed=1, inner=inner, splits=SPLITS)["config_hash"] == first["config_hash"]
    init.write_bytes(b"two")
    assert build_run_manifest(run_id="single", seed=0, inner=inner, splits=SPLITS)["config_hash"] != first["config_hash"]
    assert first["kind"] == "single_run" and first["method"] == "neural_mirror" and first["task"] == "arith"
    member = build_run_manifest(run_id="r1", seed=0, inner=inner, splits=SPLITS, params=[0.1, 0.2])
    assert member["kind"] == "es_member" and member["config_hash"] != first["config_hash"]


def test_code_version_has_commit_and_dirty_flag(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "f.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert code_version(repo) == head
    (repo / "f.py").write_text("x = 2\n")
    assert code_version(repo) == f"{head}-dirty"
    (tmp_path / "plain").mkdir()
    assert code_version(tmp_path / "plain") == "unknown"


def test_a_member_records_provenance_before_training(tmp_path, monkeypatch):

    import inner_loop.member.lifecycle as member

    root = Path(__file__).resolve().parents[2] / "conf"
    load = lambda group, name: load_group(group, name, root)  # noqa: E731
    inner = {"task": load("task", "arith"), "model": load("model", "tiny"), "divergence": load("divergence", "kl"),
             "train": load("train", "default")}

    def stop(*args, **kwargs):
        raise RuntimeError("stop before training")

    monkeypatch.setattr(member, "build_trainer", stop)
    work = tmp_path / "single"
    record = member.train_in_process({"run_id": "single", "generation": 0, "index": 0, "seed": 3, "params": [],
                                  "work_dir": str(work), "inner": inner})
    assert record.status == "failed" and "stop before training" in record.error
    result = compare([tmp_path])
    row = result.runs.iloc[0]
    assert (row["method"], row["task"], row["seed"], row["state"]) == ("kl", "arith", 3, "failed")
    assert row["data_hash"].startswith("train:") and "validation:" in row["data_hash"]
    assert row["code_version"] and row["config_hash"]


def test_hydra_multirun_of_inner_loop_runs_every_job_and_compares(tmp_path, monkeypatch):
    """`python -m inner_loop.run -m divergence=kl,prob_l2 seed=0,1` must leave one run dir per job (training
    replaced by a stub that writes what train_member writes, so only the sweep plumbing is under test)."""
    import sys

    import inner_loop.run as inner_run
    from core.records import MemberSpec

    def fake_train(spec: MemberSpec, save_final: bool = False) -> ResultRecord:
        write_run_manifest(spec.work_dir, build_run_manifest(run_id=spec.run_id, seed=spec.seed, inner=spec.inner,
                                                             splits=SPLITS))
        ok = not (spec.inner["divergence"]["name"] == "prob_l2" and spec.seed == 1)
        record = ResultRecord(status="ok" if ok else "failed", fitness=0.5 + 0.1 * spec.seed,
                              mean_response_tokens=10.0, error="" if ok else "diverged")
        write_result(spec.work_dir, record)
        return record

    monkeypatch.setattr(inner_run, "train_member", fake_train)
    sweep = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", ["inner_loop.run", "-m", "divergence=kl,prob_l2", "seed=0,1",
                                      f"hydra.sweep.dir={tmp_path / 'hydra'}",
                                      f"work_dir={sweep}/${{divergence.name}}_seed${{seed}}"])
    inner_run.main()
    result = compare([sweep])
    assert len(result.runs) == 4
    table = result.table.set_index("method")
    assert table.loc["kl", "pass1_mean"] == pytest.approx(0.55) and table.loc["kl", "n_seeds"] == 2
    assert (table.loc["prob_l2", "n_seeds"], table.loc["prob_l2", "n_failed"]) == (1, 1)


def test_test_split_runs_get_their_own_rows_never_averaged_with_validation(tmp_path):
    """eval_split=test runs of a method sit in their own row, labelled by split, and the missing one too."""
    root = tmp_path / "runs"
    for seed, fit in enumerate([0.5, 0.7]):
        make_run(root, "kl", seed, fit, 100.0)
    test_splits = {"train": SPLITS["train"], "test": ["held-out prompt"]}
    for seed, fit in enumerate([0.2, 0.4]):
        work = root / f"test_kl_seed{seed}"
        inner = {"task": {"name": "arith"}, "divergence": {"name": "kl"}, "train": {"learning_rate": 1e-4},
                 "model": {}, "eval_split": "test"}
        write_run_manifest(work, build_run_manifest(run_id="single", seed=seed, inner=inner, splits=test_splits))
        if seed == 0:
            write_result(work, ResultRecord(status="ok", fitness=fit, mean_response_tokens=90.0, eval_split="test"))
    table = compare([root]).table.set_index("split")
    assert list(table["method"]) == ["kl", "kl"]  # labelled by split, not by config hash
    assert table.loc["validation", "pass1_mean"] == pytest.approx(0.6)
    assert (table.loc["test", "pass1_mean"], table.loc["test", "n_seeds"], table.loc["test", "n_failed"]) == (
        pytest.approx(0.2), 1, 1)
    assert "| kl | arith | test | 20.0 |" in to_markdown(compare([root]))

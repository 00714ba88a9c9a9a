"""Staged, offline members (inner_loop/member/staging.py, meta/stage.py): a search stages the hub repositories its members
read into a stage cache, pins them in the manifest, and its members train from the staged snapshots with the hub and
the network out of reach; what is not staged is refused up front, before anything is written.

The fixture "hub" is a stage cache in the hub's own layout (models--org--name/snapshots/<commit>, refs/main): the tiny
model and tokenizer built from their config in code, and MBPP rows from tests/fixtures as the hub's parquet files.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path

import pytest

from inner_loop.config import ModelConfig
from inner_loop.models.tiny import build_tiny_model, build_tiny_tokenizer
from inner_loop.member.staging import hub_references, stage_inner
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MODEL_REPO, DATA_REPO = "fixture/tiny-llama", "fixture/mbpp"
MODEL_COMMIT, DATA_COMMIT = "1" * 40, "2" * 40
#: the overrides of a search whose members read the fixture repositories by hub name
SEARCH = ["new=true", "experiment=tiny_arith", "task=mbpp", f"task.hub_id={DATA_REPO}", "model=hub",
          f"model.name_or_path={MODEL_REPO}", "model.chat_template=false",
          "train.num_threads=1", "population=2", "generations=1", "control_member=false", "reevaluate.top_k=0",
          "train.steps=1", "train.batch_size=4", "train.group_size=2", "train.max_completion_length=8",
          "train.save_every=1", "train.val_max_new_tokens=8"]
#: blocks every network connection of a Python process that starts with this directory on PYTHONPATH
BLOCK_NETWORK = """
import socket
def _refuse(self, address, *args, **kwargs):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        raise OSError("network blocked by the test")
    return _connect(self, address, *args, **kwargs)
_connect = socket.socket.connect
socket.socket.connect = _refuse
"""


def _repo_dir(cache: Path, kind: str, repo: str, commit: str) -> Path:
    base = cache / f"{kind}s--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def stage_fixtures(cache: Path) -> None:
    """The fixture model and dataset as a download into the stage cache would leave them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    model_dir = _repo_dir(cache, "model", MODEL_REPO, MODEL_COMMIT)
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(ModelConfig(), len(tokenizer), tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_dir = _repo_dir(cache, "dataset", DATA_REPO, DATA_COMMIT)
    (data_dir / "full").mkdir()
    for split in ("train", "validation", "test"):
        rows = [json.loads(line) for line in (FIXTURES / f"mbpp_{split}.jsonl").read_text().splitlines() if line]
        pq.write_table(pa.Table.from_pylist(rows), data_dir / "full" / f"{split}-00000-of-00001.parquet")
    (data_dir / "README.md").write_text(
        "---\nconfigs:\n- config_name: full\n  data_files:\n" + "".join(
            f"  - split: {s}\n    path: full/{s}-*\n" for s in ("train", "validation", "test")) + "---\n")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF offline as a user sets it, and any network connection of this process is an error."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def refuse(self: socket.socket, address: object, *args: object) -> None:
        raise AssertionError(f"the test tried to reach the network: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_the_tiny_preset_needs_nothing_from_the_hub():
    from meta.compose import compose

    raw = compose([])
    assert hub_references({n: raw[n] for n in ("task", "model", "divergence", "train")}) == []


def test_the_qwen3_preset_reads_its_model_and_mbpp_from_the_hub():
    from meta.compose import compose

    raw = compose(["experiment=mbpp_qwen3"])
    refs = hub_references({n: raw[n] for n in ("task", "model", "divergence", "train")})
    assert [(r.kind, r.repo_id, r.key) for r in refs] == [("model", "Qwen/Qwen3-1.7B", "model.name_or_path"),
                                                         ("dataset", "google-research-datasets/mbpp", "task.hub_id")]


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """No offline setting, but no connection opens either (a compute node without network); the addresses tried."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    tried: list[object] = []

    def refuse(self: socket.socket, address: object, *args: object) -> None:
        tried.append(address)
        raise OSError("network unreachable (test)")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", port))])  # resolves, as DNS would on a cluster
    return tried


@pytest.mark.parametrize("dry_run", [True, False])
def test_without_network_unstaged_repositories_are_refused_after_one_connection_try(tmp_path, capsys, caplog,
                                                                                    unreachable, dry_run):
    from meta.search.run import main

    caplog.set_level(logging.INFO)
    code = main([*SEARCH, f"stage.cache_dir={tmp_path / 'empty-cache'}", f"run_dir={tmp_path / 'run'}",
                 f"dry_run={str(dry_run).lower()}"])
    assert code == 2 and len(unreachable) == 1  # one try, not huggingface_hub's retries per file
    assert "this host is offline" in caplog.text and "2 of 2 hub item(s) not staged" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_unstaged_repositories_are_refused_up_front_offline(tmp_path, capsys, caplog, offline, dry_run):
    from meta.search.run import main

    caplog.set_level(logging.INFO)
    run_dir = tmp_path / "run"
    code = main([*SEARCH, f"stage.cache_dir={tmp_path / 'empty-cache'}", f"run_dir={run_dir}",
                 f"dry_run={str(dry_run).lower()}"])
    assert code == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("staging:")]
    assert len(lines) == 2, lines  # one line per item
    assert lines[0].startswith(f"staging: missing: model {MODEL_REPO}") and "not in the stage cache" in lines[0]
    assert lines[1].startswith(f"staging: missing: dataset {DATA_REPO}")
    err = capsys.readouterr().err
    assert "2 of 2 hub item(s) not staged" in err and "python -m meta.stage" in err
    assert not run_dir.exists()  # nothing written


def test_a_changed_snapshot_is_not_taken_for_the_pinned_one(tmp_path, offline):
    cache = tmp_path / "cache"
    stage_fixtures(cache)
    inner = {"task": {"name": "mbpp", "hub_id": DATA_REPO}, "model": {"name": "tiny"}}
    [pin] = stage_inner(inner, cache_dir=cache)
    assert (pin["status"], pin["revision"]) == ("staged", DATA_COMMIT)
    readme = Path(pin["path"]) / "README.md"
    readme.write_text(readme.read_text() + "\n")  # the bytes under the pinned commit changed
    [again] = stage_inner(inner, cache_dir=cache, pins=[pin])
    assert again["status"] == "missing" and "no longer holds the pinned content" in again["detail"]


def test_staged_fixtures_train_with_the_network_blocked(tmp_path):
    """meta.run in a process (and members in theirs) where every network connection fails: the search stages from
    the cache, pins the commits, and its members train from the snapshots."""
    cache, run_dir, blocker = tmp_path / "cache", tmp_path / "run", tmp_path / "blocker"
    stage_fixtures(cache)
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_NETWORK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)]), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    done = run_with_progress([sys.executable, "-m", "meta.run", *SEARCH, f"stage.cache_dir={cache}",
                              f"run_dir={run_dir}", "launcher=debug"], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    pins = {item["repo_id"]: item for item in manifest["staged"]["items"]}
    assert pins[MODEL_REPO]["revision"] == MODEL_COMMIT and pins[DATA_REPO]["revision"] == DATA_COMMIT
    assert all(len(item["sha256"]) == 64 and item["bytes"] > 0 for item in pins.values())
    for member in ("member_000", "member_001"):
        record = json.loads((run_dir / "gen_0000" / member / "result.json").read_text())
        assert record["status"] == "ok" and record["steps_done"] == 1, record
        inner = json.loads((run_dir / "gen_0000" / member / "spec.json").read_text())["inner"]
        assert inner["model"]["name_or_path"] == pins[MODEL_REPO]["path"]
        assert inner["task"]["hub_id"] == pins[DATA_REPO]["path"]
    assert f"staging: staged:  model {MODEL_REPO} (model.name_or_path) @ {MODEL_COMMIT}" in done.stderr


def test_meta_stage_prints_each_pin_and_writes_no_run_directory(tmp_path, capsys, offline):
    from meta.stage import main

    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    stage_fixtures(cache)
    assert main([*SEARCH, f"stage.cache_dir={cache}", f"run_dir={run_dir}"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[:4] for row in rows] == [["staged", "model", MODEL_REPO, "@"],
                                                 ["staged", "dataset", DATA_REPO, "@"]]
    assert rows[0].split()[4] == MODEL_COMMIT and rows[1].endswith(DATA_COMMIT)
    assert not run_dir.exists()


def test_a_member_process_reading_nothing_from_the_hub_goes_offline_without_importing_torch(tmp_path):
    code = (
        "import os, sys, json, huggingface_hub.constants as hub\n"
        "import inner_loop.member.entry as entry\n"
        "local = {'task': {'name': 'mbpp', 'hub_id': sys.argv[1]}, 'model': {'name': 'hub', 'name_or_path': "
        "sys.argv[1]}, 'train': {}}\n"
        "by_name = {**local, 'model': {'name': 'qwen3_1_7b'}}\n"
        "entry.settle_member_process(by_name)\n"
        "before = (os.environ.get('HF_HUB_OFFLINE'), hub.HF_HUB_OFFLINE)\n"
        "entry.settle_member_process(local)\n"
        "print(json.dumps([before, (os.environ.get('HF_HUB_OFFLINE'), os.environ.get('HF_DATASETS_OFFLINE'),"
        " hub.HF_HUB_OFFLINE), 'torch' in sys.modules]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
    done = run_with_progress([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, torch_imported = json.loads(done.stdout.splitlines()[-1])
    assert before == [None, False]  # a member that loads Qwen3 by hub name keeps the network
    assert after == ["1", "1", True] and not torch_imported


def test_the_pilot_stages_as_the_search_does(tmp_path, capsys, offline):
    from meta.pilot.cli import main

    run_dir = tmp_path / "pilot"
    assert main([*SEARCH, f"stage.cache_dir={tmp_path / 'empty-cache'}", f"run_dir={run_dir}", "dry_run=true"]) == 2
    assert "2 of 2 hub item(s) not staged" in capsys.readouterr().err and not run_dir.exists()


GSM8K_REPO, GSM8K_COMMIT = "openai/gsm8k", "3" * 40
#: a search whose reporting runs score two transfer tasks: one read from the hub, one from a local package
TRANSFER = ["reevaluate.transfer=[humaneval,gsm8k]"]


def stage_gsm8k(cache: Path) -> None:
    """GSM8K rows as the hub's ``openai/gsm8k`` snapshot (config ``main``) in the stage cache: the fixture's test
    split, and a training split large enough for the task's default validation carve (500), which a transfer task
    keeps (its task.* overrides are dropped)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = _repo_dir(cache, "dataset", GSM8K_REPO, GSM8K_COMMIT)
    (data_dir / "main").mkdir()
    test = [json.loads(line) for line in (FIXTURES / "gsm8k_test.jsonl").read_text().splitlines() if line]
    train = [{"question": f"Tom has {n} apples and buys 1 more. How many apples does he have?",
              "answer": f"{n} + 1 = {n + 1}\n#### {n + 1}"} for n in range(520)]
    for split, rows in (("train", train), ("test", test)):
        pq.write_table(pa.Table.from_pylist(rows), data_dir / "main" / f"{split}-00000-of-00001.parquet")
    (data_dir / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n" + "".join(
        f"  - split: {s}\n    path: main/{s}-*\n" for s in ("train", "test")) + "---\n")


def test_transfer_datasets_are_staged_pinned_and_read_offline_by_the_reporting_runs(tmp_path, caplog, offline,
                                                                                   monkeypatch):
    """meta.run's staging pins the transfer task's dataset with the run's own; the reporting rows read the pinned
    snapshot, and the member's own loading code (inner_loop.training.setup.prepare) reads it with the hub offline."""
    from inner_loop.training.setup import prepare as prepare_member
    from meta.search.after.reporting import _rows
    from meta.search.config import search_center
    from meta.search.run import prepare, write_run_files

    import datasets

    # this test's own datasets cache: the shared one keys a local snapshot by its directory name (the commit)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    caplog.set_level(logging.INFO)
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    stage_fixtures(cache)
    stage_gsm8k(cache)
    cfg, raw, store, manifest, resuming = prepare([*SEARCH, *TRANSFER, f"stage.cache_dir={cache}",
                                                   f"run_dir={run_dir}"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("staging:")]
    assert len(lines) == 4, lines  # model, task data, one line per transfer task
    assert lines[2].startswith(f"staging: staged:  dataset {GSM8K_REPO} (transfer/gsm8k) @ {GSM8K_COMMIT}")
    assert lines[3].startswith("staging: local:   task transfer/humaneval") and "needs nothing from the hub" in lines[3]
    write_run_files(store, raw, manifest, resuming)
    pins = {item["repo_id"]: item for item in json.loads((run_dir / "manifest.json").read_text())["staged"]["items"]}
    assert pins[GSM8K_REPO]["revision"] == GSM8K_COMMIT and len(pins[GSM8K_REPO]["sha256"]) == 64

    exported = {"name": "center", "params": search_center(cfg).tolist()}
    row = _rows(cfg, store, manifest["overrides"], cfg.reevaluate_settings, exported)["rows"][0]
    extras = {extra["name"]: extra["task"] for extra in row["inner"]["extra_evaluations"]}
    assert extras["transfer/gsm8k"]["hub_id"] == pins[GSM8K_REPO]["path"]
    assert hub_references(row["inner"]) == []  # so the member process goes offline (settle_member_process)
    run = prepare_member(row["inner"], seed=0, params=row["params"])
    gsm8k = next(extra for extra in run.extras if extra.name == "transfer/gsm8k")
    assert len(gsm8k.problems) == 3  # the fixture's test split, read from the pinned snapshot with the network blocked


@pytest.mark.parametrize("command", ["meta.run", "meta.stage"])
def test_an_unstaged_transfer_dataset_is_refused_up_front_offline(tmp_path, capsys, caplog, offline, command):
    import importlib

    caplog.set_level(logging.INFO)
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    stage_fixtures(cache)  # the model and the task's data, but not GSM8K
    main = importlib.import_module(command).main
    assert main([*SEARCH, *TRANSFER, f"stage.cache_dir={cache}", f"run_dir={run_dir}", "dry_run=true"]) == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("staging:")]
    assert [line.split()[1] for line in lines] == ["staged:", "staged:", "missing:", "local:"], lines
    assert lines[2].startswith(f"staging: missing: dataset {GSM8K_REPO} (transfer/gsm8k)")
    assert f"1 of 3 hub item(s) not staged (dataset {GSM8K_REPO} (transfer/gsm8k)" in capsys.readouterr().err
    assert not run_dir.exists()


def test_an_unreadable_file_of_a_staged_transfer_dataset_fails_the_preflight_before_anything_is_written(
        tmp_path, capsys, offline):
    """The reporting runs read the transfer snapshot after the whole search: its pre-flight is before the first
    submission, with the run's own model and data."""
    from meta.search.run import main

    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    stage_fixtures(cache)
    stage_gsm8k(cache)
    (_repo_dir(cache, "dataset", GSM8K_REPO, GSM8K_COMMIT) / "main" / "extra.parquet").symlink_to(tmp_path / "gone")
    assert main([*SEARCH, *TRANSFER, f"stage.cache_dir={cache}", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "pre-flight failed on node" in err and "main/extra.parquet is not readable here" in err, err
    assert not run_dir.exists()


#: a tuning whose trial runs read the fixture repositories by hub name: one trial of one run
TUNE = ["new=true", "experiment=tiny_arith", "task=mbpp", f"task.hub_id={DATA_REPO}", "model=hub",
        f"model.name_or_path={MODEL_REPO}", "model.chat_template=false", "train.num_threads=1", "train.steps=1",
        "train.batch_size=4", "train.group_size=2", "train.max_completion_length=8", "train.val_max_new_tokens=8",
        "tune.trials=1", "tune.parallel=1", "tune.seeds=1", "tune.pruner=none", "tune.sampler=random"]


def test_meta_tune_refuses_unstaged_items_offline_before_writing_anything(tmp_path, capsys, offline):
    from meta.tune.cli import main

    run_dir = tmp_path / "tune"
    assert main([*TUNE, f"stage.cache_dir={tmp_path / 'empty-cache'}", f"run_dir={run_dir}", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert f"2 of 2 hub item(s) not staged (model {MODEL_REPO}, dataset {DATA_REPO}" in err
    assert "python -m meta.tune" in err and not run_dir.exists()


def test_meta_tune_stages_before_its_first_trial_which_trains_from_the_pins(tmp_path, offline):
    from meta.tune.cli import main

    cache, run_dir = tmp_path / "cache", tmp_path / "tune"
    stage_fixtures(cache)
    assert main([*TUNE, f"stage.cache_dir={cache}", f"run_dir={run_dir}", "launcher=debug"]) == 0
    pins = {item["repo_id"]: item for item in json.loads((run_dir / "manifest.json").read_text())["staged"]["items"]}
    assert pins[MODEL_REPO]["revision"] == MODEL_COMMIT and pins[DATA_REPO]["revision"] == DATA_COMMIT
    [trial] = sorted((run_dir / "tuning_trials").glob("*/trial.json"))
    inner = json.loads(trial.read_text())["members"][0]["inner"]
    assert inner["model"]["name_or_path"] == pins[MODEL_REPO]["path"]
    assert inner["task"]["hub_id"] == pins[DATA_REPO]["path"]
    [result] = sorted((run_dir / "tuning_trials").glob("*/*/result.json"))
    assert json.loads(result.read_text())["status"] == "ok"

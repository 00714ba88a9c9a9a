"""Data-backed tasks: loading hub-format files, carving disjoint splits, and rejecting bad input clearly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inner_loop.tasks import SplitOverlapError, Task, build_task, check_disjoint, prompt_hash
from inner_loop.tasks.base import Problem

FIXTURES = Path(__file__).parents[2] / "fixtures"
GSM_TRAIN = str(FIXTURES / "gsm8k_train.jsonl")
GSM_TEST = str(FIXTURES / "gsm8k_test.jsonl")
MBPP_TRAIN = str(FIXTURES / "mbpp_train.jsonl")
MBPP_TEST = str(FIXTURES / "mbpp_test.jsonl")


def _gsm(**cfg) -> Task:
    return build_task({"name": "gsm8k", "train_file": GSM_TRAIN, "test_file": GSM_TEST, "validation_size": 3, **cfg})


def _hashes(problems: list[Problem]) -> set[str]:
    return {prompt_hash(p.prompt) for p in problems}


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_validation_is_carved_from_train_and_disjoint() -> None:
    task = _gsm()
    train, validation, test = task.load("train"), task.load("validation"), task.load("test")
    assert (len(train), len(validation), len(test)) == (9, 3, 3)
    # together train and validation are exactly the training file: nothing lost, nothing shared
    file_prompts = {prompt_hash(f"Question: {json.loads(l)['question']}\nAnswer:") for l in open(GSM_TRAIN)}
    assert _hashes(train) | _hashes(validation) == file_prompts
    assert not _hashes(train) & _hashes(validation)
    assert test[0].answer == "180"
    assert [p.answer for p in train + validation if "chickens" in p.prompt] == ["750"]


def test_gsm8k_split_depends_on_seed_only() -> None:
    first = [p.prompt for p in _gsm(split_seed=1).load("validation")]
    assert first == [p.prompt for p in _gsm(split_seed=1).load("validation")]
    assert first != [p.prompt for p in _gsm(split_seed=2).load("validation")]


def test_gsm8k_demonstration_earns_reward() -> None:
    task = _gsm()
    problems = task.load("train")
    assert task.solved_many(problems, [task.demonstration(p) for p in problems]) == [True] * len(problems)


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_gsm8k_reads_json_array_and_parquet(tmp_path: Path, fmt: str) -> None:
    rows = [json.loads(l) for l in open(GSM_TRAIN)]
    path = tmp_path / f"train.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    task = build_task({"name": "gsm8k", "train_file": str(path), "validation_size": 2, "train_size": 5})
    assert len(task.load("train")) == 5 and len(task.load("validation")) == 2
    with pytest.raises(ValueError, match="test_file"):
        task.load("test")


def test_duplicates_and_test_leaks_never_reach_both_sides(tmp_path: Path) -> None:
    rows = [json.loads(l) for l in open(GSM_TRAIN)]
    test_rows = [json.loads(l) for l in open(GSM_TEST)]
    leaky = _write_jsonl(tmp_path / "train.jsonl", rows + rows[:4] + test_rows[:1])
    task = build_task({"name": "gsm8k", "train_file": leaky, "test_file": GSM_TEST, "validation_size": 6})
    train, validation, test = task.load("train"), task.load("validation"), task.load("test")
    assert len(train) + len(validation) == len(rows)  # 4 duplicates and 1 test question dropped
    assert not _hashes(train) & _hashes(validation)
    assert not (_hashes(train) | _hashes(validation)) & _hashes(test)


def test_check_disjoint_fails_loudly_on_overlap() -> None:
    a = Problem(id="a", prompt="What is  2+2?")
    b = Problem(id="b", prompt="What is 2+2? ")  # same after whitespace normalisation
    with pytest.raises(SplitOverlapError, match="'train' and 'validation'"):
        check_disjoint("t", {"train": [a], "validation": [b]})


def test_hub_path_passes_id_config_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []
    rows = [json.loads(l) for l in open(MBPP_TRAIN)]

    def fake_load_dataset(hub_id, config, split):
        calls.append((hub_id, config, split))
        files = {"test": MBPP_TEST, "validation": str(FIXTURES / "mbpp_validation.jsonl")}
        return [json.loads(l) for l in open(files[split])] if split in files else rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = build_task({"name": "mbpp", "train_splits": ["train", "prompt"]})
    train, validation = task.load("train"), task.load("validation")
    assert sorted(calls) == sorted([("google-research-datasets/mbpp", "full", "train"),
                                    ("google-research-datasets/mbpp", "full", "prompt"),
                                    ("google-research-datasets/mbpp", "full", "validation"),
                                    ("google-research-datasets/mbpp", "full", "test")])
    assert len(train) == 5  # the two pools repeat the same rows: deduplicated
    assert len(validation) == 2  # the hub's own validation split, nothing carved from training


def test_hub_failure_suggests_local_files(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match="train_file"):
        build_task({"name": "gsm8k"}).load("validation")


def test_mbpp_full_and_sanitized_formats() -> None:
    full = build_task({"name": "mbpp", "train_file": MBPP_TRAIN, "test_file": MBPP_TEST, "validation_size": 1})
    test = full.load("test")[0]
    assert test.id == "mbpp-606" and test.meta["setup"] == "import math" and len(test.tests) == 3
    assert "square root" in test.prompt and "assert root(4) == 2.0" in test.prompt
    assert "assert root(2)" not in test.prompt  # only the first test is shown
    sanitized = build_task({"name": "mbpp", "train_file": str(FIXTURES / "mbpp_sanitized.json"),
                            "validation_size": 2, "hub_config": "sanitized"})
    problems = sanitized.load("train") + sanitized.load("validation")
    assert len(problems) == 6
    assert {p.meta["setup"] for p in problems if p.id == "mbpp-606"} == {"import math"}


def test_gsm_symbolic_generates_disjoint_deterministic_splits() -> None:
    cfg = {"name": "gsm_symbolic", "train_size": 40, "validation_size": 10, "test_size": 10, "seed": 5}
    task = build_task(cfg)
    train, validation, test = task.load("train"), task.load("validation"), task.load("test")
    assert (len(train), len(validation), len(test)) == (40, 10, 10)
    assert not _hashes(train) & _hashes(validation) and not _hashes(train) & _hashes(test)
    assert [p.prompt for p in build_task(cfg).load("validation")] == [p.prompt for p in validation]
    assert task.solved_many(validation, [task.demonstration(p) for p in validation]) == [True] * 10
    assert task.score(validation[0], "I am not sure, maybe 0.123456") == 0.0


# ---- bad input: every case fails before training with the file/row or key named ----

@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"name": "gsm9k"}, "unknown task 'gsm9k'"),
        ({"name": None}, "task.name"),
        ({"name": "gsm8k", "train_file": "/nonexistent/train.jsonl"}, "task.train_file"),
        ({"name": "gsm8k", "test_file": GSM_TEST}, "task.train_file"),
        ({"name": "gsm8k", "validation_size": -1}, "task.validation_size"),
        ({"name": "gsm8k", "prompt_template": "Q: {query}"}, "task.prompt_template"),
        ({"name": "mbpp", "train_splits": ["train", "test"]}, "task.train_splits"),
        ({"name": "mbpp", "timeout_s": 0}, "task.timeout_s"),
        ({"name": "mbpp", "prompt_template": "{txt}"}, "task.prompt_template"),
        ({"name": "humaneval", "problems_file": "/nonexistent.jsonl"}, "task.problems_file"),
        ({"name": "gsm_symbolic", "seed": -3}, "task.seed"),
        ({"name": "gsm_symbolic", "sizes": 3}, "task.sizes"),
    ],
)
def test_bad_config_is_rejected_at_build_time(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        build_task(cfg)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"validation_size": 12}, "task.validation_size=12"),
        ({"train_size": 10}, "task.train_size=10"),
        ({"test_size": 4}, "task.test_size=4"),
    ],
)
def test_split_sizes_larger_than_the_data(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        _gsm(**cfg).load("train")


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q1", "answer": "#### 1"}\n{"question": "q2"}\n', r"row 2: missing field 'answer'"),
        ('{"question": "q1", "answer": "#### 1"}\n{"question": "q2", "answer": "no marker"}\n', "row 2: no '####'"),
        ('{"question": "q1", "answer": "#### twelve"}\n', "row 1: gold answer 'twelve'"),
        ('{"question": "q1", "answer": "#### 1"}\n{oops\n', "line 2: not valid JSON"),
        ('{"question": 5, "answer": "#### 1"}\n', "row 1: field 'question'"),
        ('[1, 2]', "row 1: expected a JSON object"),
    ],
)
def test_malformed_gsm8k_rows_name_file_and_row(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / ("bad.json" if content.startswith("[") else "bad.jsonl")
    path.write_text(content)
    task = build_task({"name": "gsm8k", "train_file": str(path), "validation_size": 1})
    with pytest.raises(ValueError, match=message) as info:
        task.load("train")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"task_id": 1, "code": "x=1", "test_list": ["assert x == 1"]}, "'text'"),
        ({"task_id": 1, "text": "t", "code": "x=1", "test_list": []}, "non-empty list"),
        ({"task_id": 1, "text": "t", "code": "x=1", "test_list": "assert x == 1"}, "field 'test_list'"),
        ({"task_id": 1, "text": "t", "test_list": ["assert x == 1"]}, "missing field 'code'"),
    ],
)
def test_malformed_mbpp_rows_name_file_and_row(tmp_path: Path, row: dict, message: str) -> None:
    good = json.loads(open(MBPP_TRAIN).readline())
    path = _write_jsonl(tmp_path / "mbpp.jsonl", [good, row])
    task = build_task({"name": "mbpp", "train_file": path, "validation_size": 1})
    with pytest.raises(ValueError, match=message) as info:
        task.load("validation")
    assert "row 2" in str(info.value) and path in str(info.value)


def test_unsupported_file_format(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("question,answer\n")
    with pytest.raises(ValueError, match="unsupported format '.csv'"):
        build_task({"name": "gsm8k", "train_file": str(path)}).load("train")


def test_unknown_split_name() -> None:
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        _gsm().load("valid")

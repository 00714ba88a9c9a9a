"""The embedded arithmetic task: splits, determinism, difficulty knobs, demonstrations and bad configs."""
from __future__ import annotations

import pytest

from inner_loop.tasks import build_task, prompt_hash
from inner_loop.tasks.arith import MAX_PROMPT_CHARS, ArithConfig, ArithTask


def _all_splits(cfg: dict) -> dict:
    task = build_task({"name": "arith", **cfg})
    return {s: task.load(s) for s in ("train", "validation", "test")}


def test_splits_have_requested_sizes_and_are_disjoint() -> None:
    splits = _all_splits({"train_size": 1500, "validation_size": 150, "test_size": 100})
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [1500, 150, 100]
    hashes = {s: {prompt_hash(p.prompt) for p in probs} for s, probs in splits.items()}
    assert all(len(hashes[s]) == len(splits[s]) for s in splits)  # no duplicates inside a split
    assert not hashes["train"] & hashes["validation"]
    assert not hashes["train"] & hashes["test"]
    assert not hashes["validation"] & hashes["test"]


def test_deterministic_from_seed_and_validation_independent_of_train_size() -> None:
    a = _all_splits({"seed": 3})
    b = _all_splits({"seed": 3})
    assert [p.prompt for p in a["validation"]] == [p.prompt for p in b["validation"]]
    assert [p.prompt for p in a["train"]] == [p.prompt for p in b["train"]]
    other_seed = _all_splits({"seed": 4})
    assert [p.prompt for p in a["validation"]] != [p.prompt for p in other_seed["validation"]]
    smaller_train = _all_splits({"seed": 3, "train_size": 500})
    assert [p.prompt for p in smaller_train["validation"]] == [p.prompt for p in a["validation"]]


def test_answers_are_correct_and_prompts_short() -> None:
    task = build_task({"name": "arith", "operators": ["+", "-", "*"], "max_digits": 3, "allow_negative": True})
    problems = task.load("train")
    assert {p.meta["op"] for p in problems} == {"+", "-", "*"}
    assert any(int(p.answer) < 0 for p in problems)
    for p in problems:
        a, op, b = p.meta["a"], p.meta["op"], p.meta["b"]
        assert p.prompt == f"{a:02d}{op}{b:02d}="  # the default, zero-padded template
        assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert len(p.prompt) <= MAX_PROMPT_CHARS
        assert a < 1000 and b < 1000


def test_no_negative_answers_unless_allowed() -> None:
    problems = build_task({"name": "arith", "operators": ["-"], "train_size": 1000}).load("train")
    assert all(int(p.answer) >= 0 for p in problems)


def test_digit_range_is_respected() -> None:
    problems = build_task({"name": "arith", "min_digits": 2, "max_digits": 2, "train_size": 300}).load("train")
    assert all(10 <= p.meta["a"] <= 99 and 10 <= p.meta["b"] <= 99 for p in problems)


def test_demonstration_scores_full_reward() -> None:
    task = build_task({"name": "arith", "operators": ["+", "-", "*"], "allow_negative": True})
    problems = task.load("validation")
    demos = [task.demonstration(p) for p in problems]
    assert all(len(d) <= 6 for d in demos)  # short completions for the tiny model
    assert task.solved_many(problems, demos) == [True] * len(problems)


@pytest.mark.parametrize(
    "override, key",
    [
        ({"operators": ["/"]}, "task.operators"),
        ({"operators": []}, "task.operators"),
        ({"min_digits": 3, "max_digits": 2}, "task.min_digits"),
        ({"max_digits": 12}, "task.max_digits"),
        ({"validation_size": 5000}, "task.validation_size"),  # more than the problem space holds
        ({"train_size": -1}, "task.train_size"),
        ({"prompt_template": "{a}{op}="}, "task.prompt_template"),
        ({"prompt_template": "Please compute: {a} {op} {b} ="}, "task.max_digits"),  # too long for the tiny model
        ({"validaton_size": 10}, "task.validaton_size"),  # typo: unknown key
        ({"train_size": "many"}, "task.train_size"),
        ({"allow_negative": "yes"}, "task.allow_negative"),
    ],
)
def test_bad_config_names_the_key(override: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_task({"name": "arith", **override})


def test_prompt_template_format_specs_zero_pad_operands():
    # The default template pads operands to two digits so the tiny model sees the digits at fixed positions.
    task = ArithTask(ArithConfig(operators=["+"], prompt_template="{a:02d}{op}{b:02d}=", train_size=50,
                                 validation_size=20, test_size=20))
    for problem in task.load("train"):
        a, b = problem.meta["a"], problem.meta["b"]
        assert problem.prompt == f"{a:02d}+{b:02d}=" and len(problem.prompt) == 6
        assert int(problem.answer) == a + b
    with pytest.raises(ValueError, match="task.prompt_template"):
        ArithTask(ArithConfig(prompt_template="{a:02d}{op}="))


def test_a_config_drawn_twice_in_one_process_gives_equal_problems_that_share_nothing_and_any_change_redraws():
    """A dry run validates the same config for every baseline row: a second task of the same config gets equal
    problems, as objects of its own; a changed key (seed, size, template) draws anew."""
    config = dict(train_size=30, validation_size=10, test_size=10, seed=7)
    first, second = ArithTask(ArithConfig(**config)), ArithTask(ArithConfig(**config))
    a, b = first.load("train"), second.load("train")
    assert a == b and [p.meta for p in a] == [p.meta for p in b]
    a[0].meta["a"] = -1  # a caller's change to its own problems reaches no other task's
    assert ArithTask(ArithConfig(**config)).load("train")[0].meta["a"] != -1
    assert ArithTask(ArithConfig(**{**config, "seed": 8})).load("train") != b
    assert len(ArithTask(ArithConfig(**{**config, "train_size": 31})).load("train")) == 31
    longer = ArithTask(ArithConfig(**config, prompt_template="Q: {a:02d}{op}{b:02d}=")).load("train")
    assert all(p.prompt.startswith("Q: ") for p in longer)


def test_a_config_s_problems_are_drawn_once_per_process(monkeypatch):
    """A search's up-front check validates each member config it will run (the embedded default: 9, one task
    config), and each drew the same 4,400 problems again."""
    drawn = []
    generate = ArithTask._generate
    monkeypatch.setattr(ArithTask, "_generate", lambda self, split: drawn.append(split) or generate(self, split))
    config = dict(train_size=40, validation_size=10, test_size=10, seed=11)
    for _ in range(3):
        assert len(ArithTask(ArithConfig(**config)).load("train")) == 40
    assert sorted(drawn) == ["test", "train", "validation"]

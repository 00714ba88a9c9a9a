"""Hand-written reward cases for the math tasks: what a completion must say to earn reward 1."""
from __future__ import annotations

from fractions import Fraction

import pytest

from inner_loop.tasks import Problem, build_task
from inner_loop.tasks.gsm8k import answer_matches, gold_answer
from inner_loop.tasks.common.numbers import find_numbers, first_integer, last_number, parse_number


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("She has 3 + 4 = 7 apples. #### 7", "7", True),
        ("The answer is 18.", "18", True),  # trailing period is punctuation
        ("Total: 1,234 dollars", "1234", True),  # thousands separator
        ("It costs $1,200.", "1200", True),  # dollar sign, commas and a period together
        ("He pays $12.50 in total", "12.5", True),  # decimal against a decimal gold
        ("so 10 / 2 = 5.0", "5", True),  # numeric equality, not string equality
        ("The temperature is -5 degrees", "-5", True),  # negative
        ("The change is -$3", "-3", True),  # minus before the dollar sign
        ("Each gets 3/4 of a pizza", "0.75", True),  # simple fraction equals its decimal
        ("Each gets 0.75", "3/4", True),  # and the other way round
        ("First 12, then 15 and finally 20", "12", False),  # only the LAST number counts
        ("I think it is 7 or maybe 8", "7", False),
        ("between 3-4 hours", "-4", False),  # a range's hyphen is not a minus
        ("no number here", "3", False),
        ("1,23", "123", False),  # malformed grouping is two numbers: 1 and 23
        ("#### 1,000,000", "1000000", True),
        ("It is 72.", "72.0", True),
        ("It is 72.5", "72", False),
    ],
)
def test_gsm8k_last_number_rule(completion: str, gold: str, expected: bool) -> None:
    assert answer_matches(completion, gold) is expected


def test_number_values_are_exact() -> None:
    assert find_numbers("a 1,234.5 b -2 c 3/4 d $7.") == [Fraction(24690, 20), -2, Fraction(3, 4), 7]
    assert last_number("nothing") is None
    assert parse_number(" $1,000. ") == 1000
    assert parse_number("12 apples") is None  # parse_number wants exactly one number
    assert first_integer("  -12 then 5") == -12
    assert first_integer("x") is None


def test_gold_answer_takes_text_after_last_marker() -> None:
    assert gold_answer("step 1 #### 5\nfix: #### 1,250") == "1,250"
    with pytest.raises(ValueError, match="####"):
        gold_answer("no marker here")


def test_gsm8k_task_scores_with_last_number_rule() -> None:
    task = build_task({"name": "gsm8k", "train_file": None})
    problem = Problem(id="p", prompt="q", answer="1,250")
    assert task.score(problem, "So 1000 + 250 = 1,250.") == 1.0
    assert task.score(problem, "1250 is wrong? no, it is 1251") == 0.0
    assert task.solved_many([problem, problem], ["1250", "12"]) == [True, False]


@pytest.mark.parametrize(
    "completion, expected",
    [("42", 1.0), (" 42", 1.0), ("42\n17", 1.0), ("42 is it", 1.0), ("4", 0.0), ("421", 0.0), ("-42", 0.0),
     ("", 0.0), ("answer 42", 1.0), ("41 42", 0.0)],
)
def test_arith_reward_reads_first_integer(completion: str, expected: float) -> None:
    task = build_task({"name": "arith"})
    assert task.score(Problem(id="p", prompt="40+2=", answer="42"), completion) == expected


def test_arith_negative_answers_score() -> None:
    task = build_task({"name": "arith", "allow_negative": True})
    assert task.score(Problem(id="p", prompt="3-10=", answer="-7"), "-7") == 1.0
    assert task.score(Problem(id="p", prompt="3-10=", answer="-7"), "7") == 0.0

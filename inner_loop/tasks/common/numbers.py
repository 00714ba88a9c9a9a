"""Reading numbers out of free text, for the math tasks' rewards.

Rewards compare numbers, not strings: "$1,200." and "1200" are the same answer, and so are "5.0" and "5" or
"0.75" and "3/4". Values are exact `Fraction`s so equality never depends on float rounding.
"""
from __future__ import annotations

import re
from fractions import Fraction

# One number as people write it in worked solutions. Pieces, in order:
#   an optional minus that does not directly follow a word character or a closing bracket (so the range
#   "3-4" reads as 3 and 4, not 3 and -4), an optional "$", the integer part (either comma-grouped
#   thousands like 1,234,567 or plain digits), then either a decimal part (".5"; a bare trailing period is
#   punctuation, not a decimal point) or a simple fraction "/4" with a non-zero denominator.
_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)\]])-)?"
    r"\$?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
    r"(?:(?P<dec>\.\d+)|/(?P<den>[1-9]\d*))?"
)

# The first integer of a completion, for the arithmetic task whose answers are whole numbers.
_INTEGER = re.compile(r"-?\d+")


def _value(match: re.Match[str]) -> Fraction:
    digits = match.group("int").replace(",", "")
    if match.group("dec"):
        value = Fraction(digits + match.group("dec"))
    elif match.group("den"):
        value = Fraction(int(digits), int(match.group("den")))
    else:
        value = Fraction(int(digits))
    return -value if match.group("sign") else value


def find_numbers(text: str) -> list[Fraction]:
    """Every number in ``text``, left to right."""
    return [_value(m) for m in _NUMBER.finditer(text)]


def last_number(text: str) -> Fraction | None:
    """The last number in ``text`` (the GSM8K answer convention), or None when there is none."""
    found = find_numbers(text)
    return found[-1] if found else None


def first_integer(text: str) -> int | None:
    """The first integer in ``text`` (an optional minus and digits), or None when there is none."""
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


def parse_number(text: str) -> Fraction | None:
    """``text`` read as exactly one number (surrounding spaces, "$", commas, a trailing period allowed)."""
    stripped = text.strip().rstrip(".").strip()
    match = _NUMBER.fullmatch(stripped)
    return _value(match) if match else None

"""Getting the program out of a code completion.

Models answer in two styles: Markdown with a fenced block (```python ... ```), or raw code - including raw code
that ends with a closing fence because the prompt itself opened one. Both must run, or the reward measures
formatting rather than programming.
"""
from __future__ import annotations

import re

_FENCED = re.compile(r"```[ \t]*(?P<lang>[\w+-]*)[ \t]*\n(?P<code>.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_LANGS = {"", "python", "python3", "py"}


def extract_code(completion: str) -> str:
    """The code of ``completion``: its first Python (or unlabelled) fenced block; else the text before a
    stray closing fence; else the completion itself."""
    blocks = [m for m in _FENCED.finditer(completion) if m.group("lang").lower() in _PYTHON_LANGS]
    if blocks and not _starts_as_code_then_fence(completion):
        return blocks[0].group("code").rstrip() + "\n"
    if "```" in completion:
        return completion.split("```", 1)[0].rstrip() + "\n"
    return completion


def _starts_as_code_then_fence(completion: str) -> bool:
    """Raw code closed by a fence the prompt opened: the first fence is preceded by code, not prose, and is a
    bare closing fence (nothing after it on its line)."""
    head, _, tail = completion.partition("```")
    first_line_after = tail.split("\n", 1)[0].strip()
    return bool(head.strip()) and first_line_after == "" and _looks_like_code(head)


def _looks_like_code(text: str) -> bool:
    return bool(re.search(r"^\s*(def |class |import |from |return |[\w.]+\s*=)", text, re.MULTILINE))

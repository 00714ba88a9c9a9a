"""Plain-data codec for values crossing the grading channel, with exact builtin types only.

Why: a program's return value must reach the trusted grader as data, never as an object the program made
(an object can lie in ``__eq__``, ``__hash__`` or ``__bool__``). Only exact instances of None, bool, int,
float, complex, str, bytes, list, tuple, dict, set and frozenset are encoded; a subclass or any other type
raises ``Unsendable``. Decoding builds fresh builtin objects and bounds size and nesting depth.

Standard library only and no project imports: the sandbox's zygote source is this file's text followed by
``sandbox_zygote.py``, so the sandboxed side encodes with the same rules the parent decodes with.
"""
from __future__ import annotations

import json

MAX_DEPTH = 100  # nesting of containers; deeper values are refused, so decoding cannot blow the stack
MAX_MESSAGE_BYTES = 1 << 20  # one encoded value; bigger answers are refused before parsing
_SCALARS = (type(None), bool, int, float, str)
_TAGGED = ("tuple", "set", "frozenset", "dict", "bytes", "complex")


class Unsendable(ValueError):
    """A value that is not exact plain builtin data (or is too deep / too big to cross the channel)."""


def to_plain(value: object, depth: int = 0) -> object:
    """JSON-able form of `value`; exact builtin types only (``type(x) is int``, never isinstance)."""
    if depth > MAX_DEPTH:
        raise Unsendable(f"value nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list:
        return [to_plain(item, depth + 1) for item in value]
    if kind is tuple:
        return {"tuple": [to_plain(item, depth + 1) for item in value]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [to_plain(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise Unsendable(f"type {kind.__name__!r} is not exact plain builtin data")


def from_plain(data: object, depth: int = 0) -> object:
    """Inverse of to_plain on parsed JSON; anything off-format raises Unsendable."""
    if depth > MAX_DEPTH:
        raise Unsendable(f"value nested deeper than {MAX_DEPTH}")
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is list:
        return [from_plain(item, depth + 1) for item in data]
    if kind is not dict or len(data) != 1:
        raise Unsendable("malformed value")
    (tag, body), = data.items()
    if tag not in _TAGGED:
        raise Unsendable(f"unknown tag {tag!r}")
    if tag == "bytes":
        if type(body) is not str:
            raise Unsendable("malformed bytes")
        return bytes.fromhex(body)
    if type(body) is not list:
        raise Unsendable(f"malformed {tag}")
    if tag == "complex":
        if len(body) != 2 or any(type(part) is not float for part in body):
            raise Unsendable("malformed complex")
        return complex(body[0], body[1])
    items = [from_plain(item, depth + 1) for item in body]
    try:
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(items)
        if tag == "frozenset":
            return frozenset(items)
        if any(type(pair) is not list or len(pair) != 2 for pair in items):
            raise Unsendable("malformed dict")
        return {pair[0]: pair[1] for pair in items}
    except TypeError as exc:  # an unhashable key or member (a list inside a set): not a real value
        raise Unsendable(f"malformed {tag}: {exc}") from None


def encode(value: object) -> str:
    """One-line JSON text of `value` (raises Unsendable)."""
    try:
        text = json.dumps(to_plain(value), separators=(",", ":"))
    except (ValueError, RecursionError) as exc:  # e.g. an int too long to print
        raise Unsendable(str(exc)) from None
    if len(text) > MAX_MESSAGE_BYTES:
        raise Unsendable(f"value larger than {MAX_MESSAGE_BYTES} bytes")
    return text


def decode(text: str | bytes) -> object:
    """Fresh builtin value from encode()'s text; size, depth and format are checked."""
    if len(text) > MAX_MESSAGE_BYTES:
        raise Unsendable(f"value larger than {MAX_MESSAGE_BYTES} bytes")
    try:
        return from_plain(json.loads(text))
    except (ValueError, RecursionError) as exc:
        raise Unsendable(f"undecodable value: {exc}") from None

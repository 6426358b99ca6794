"""Size caps on what a runtime sends, applied on arrival. Pure.

A tool's arguments and result can be megabytes (the event body allows 8 MiB), while the card shows a
few lines of them and the snapshot only needs what the card shows. Each is kept to ``MAX_TOOL_VALUE_BYTES``
of compact JSON: values that fit are kept as they are (the common case, one ``json.dumps``); larger ones
are shrunk structurally — long strings cut, long lists and objects shortened, deep nesting flattened — so
the parsers that read results (image grids, answers, subagent rows) still find their fields. The runtime
keeps the original; this is only what the card and the snapshot are built from.
"""

from __future__ import annotations

import json
from typing import Any

MAX_TOOL_VALUE_BYTES = 16 * 1024
CUT_MARKER = "…"
_MAX_ITEMS = 50
_MAX_DEPTH = 8
# Each pass halves the per-string cap; after this many passes what is left is cut as text.
_PASSES = 8


# The most UTF-8 bytes one character can take in compact JSON: a control character written as \u001f.
_MAX_BYTES_PER_CHAR = 6
_MAX_SCALAR_BYTES = 32  # true/false/null, an int of ≤ 20 digits or a float's repr: never longer
_BOUND_DEPTH = 4  # deeper values are measured exactly


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (non-JSON values as their ``str``)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8"))


def fits(value: Any, max_bytes: int) -> bool:
    """Whether ``value``'s compact JSON is at most ``max_bytes``.

    Called for every tool argument update (most events of a busy task): a quick upper bound answers
    for the common small values without serialising them; only values near the limit are measured.
    """
    bound = _size_bound(value, max_bytes, 0)
    return (bound is not None and bound <= max_bytes) or json_size(value) <= max_bytes


def _size_bound(value: Any, budget: int, depth: int) -> int | None:
    """An upper bound of ``value``'s compact JSON size, or None once it passes ``budget`` (or is unusual)."""
    if type(value) is str:
        return _MAX_BYTES_PER_CHAR * len(value) + 2
    if value is None or type(value) in (bool, float) or (type(value) is int and -(10**19) < value < 10**19):
        return _MAX_SCALAR_BYTES
    if depth >= _BOUND_DEPTH:
        return None
    if type(value) is dict:
        total = 2 + 4 * len(value)  # braces; per item two quotes, a colon and a comma
        for key, item in value.items():
            if type(key) is not str:
                return None
            part = _size_bound(item, budget, depth + 1)
            if part is None:
                return None
            total += _MAX_BYTES_PER_CHAR * len(key) + part
            if total > budget:
                return None
        return total
    if type(value) is list:
        total = 2 + len(value)
        for item in value:
            part = _size_bound(item, budget, depth + 1)
            if part is None:
                return None
            total += part
            if total > budget:
                return None
        return total
    return None


def bound_json(value: Any, max_bytes: int = MAX_TOOL_VALUE_BYTES) -> Any:
    """``value`` if its JSON fits ``max_bytes``, else a smaller value of the same shape that does."""
    if fits(value, max_bytes):
        return value
    string_cap = max_bytes // 4
    for _ in range(_PASSES):
        shrunk = _shrink(value, string_cap, 0)
        if json_size(shrunk) <= max_bytes:
            return shrunk
        string_cap //= 2
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return _cut(text, max_bytes // 4)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + CUT_MARKER


def _shrink(value: Any, string_cap: int, depth: int) -> Any:
    if isinstance(value, str):
        return _cut(value, string_cap)
    if isinstance(value, bool | int | float) or value is None:
        return value
    if depth >= _MAX_DEPTH:
        return _cut(json.dumps(value, ensure_ascii=False, default=str), string_cap)
    if isinstance(value, dict):
        items = list(value.items())[:_MAX_ITEMS]
        return {str(key)[:200]: _shrink(item, string_cap, depth + 1) for key, item in items}
    if isinstance(value, list | tuple):
        return [_shrink(item, string_cap, depth + 1) for item in value[:_MAX_ITEMS]]
    return _cut(str(value), string_cap)

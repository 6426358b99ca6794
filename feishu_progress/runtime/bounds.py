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


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (non-JSON values as their ``str``)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8"))


def bound_json(value: Any, max_bytes: int = MAX_TOOL_VALUE_BYTES) -> Any:
    """``value`` if its JSON fits ``max_bytes``, else a smaller value of the same shape that does."""
    if json_size(value) <= max_bytes:
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

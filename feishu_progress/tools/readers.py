"""Defensive readers for untrusted tool arguments and results: every reader returns a safe default."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from feishu_progress.i18n.user_text import cut_text, one_line

# A raw result shown in the card is bounded: cards/ has a 30 KB budget for the whole card.
RAW_RESULT_LIMIT = 3000
EMPTY: Mapping[str, Any] = {}


def parse_result(result: Any) -> Any:
    """The result as data: a string holding a JSON object or array is decoded, anything else is kept."""
    if isinstance(result, str | bytes | bytearray):
        text = result.decode("utf-8", "replace") if isinstance(result, bytes | bytearray) else result
        stripped = text.strip()
        if stripped[:1] in ("{", "["):
            try:
                return json.loads(stripped)
            except (ValueError, RecursionError):  # not JSON after all: the text is the result
                return text
        return text
    return result


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else EMPTY


def get_str(node: Mapping[str, Any], *keys: str) -> str:
    """The first non-blank string among ``keys`` (stripped), else ""."""
    for key in keys:
        value = node.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def as_int(value: Any) -> int | None:
    """An integer (or an integral finite float), never a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def get_int(node: Mapping[str, Any], *keys: str) -> int | None:
    """The first integer among ``keys``."""
    for key in keys:
        number = as_int(node.get(key))
        if number is not None:
            return number
    return None


def get_list(node: Mapping[str, Any], *keys: str) -> list[Any] | None:
    """The first list among ``keys``."""
    for key in keys:
        value = node.get(key)
        if isinstance(value, list):
            return value
    return None


def first_chars(text: str, limit: int) -> str:
    """The first ``limit`` characters of the one-line form, no ellipsis (the seed's ``slice(0, n)``)."""
    return cut_text(one_line(text), limit, ellipsis="")


def shorten(text: str, limit: int) -> str:
    """The one-line form cut to ``limit`` characters, with an ellipsis when something was dropped."""
    return cut_text(one_line(text), limit)


def compact_text(value: Any, limit: int = RAW_RESULT_LIMIT) -> str:
    """A compact text of any result: strings as they are, everything else as compact JSON."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
    return cut_text(text, limit)

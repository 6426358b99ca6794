"""The card's size budget: limits per shrink level, measurement, and the longest prefix that fits.

Feishu refuses a card over 30 KB, 200 elements or 5 levels. The builder renders with the most
generous ``Limits`` first and steps down the ladder until the card fits ``TARGET_BYTES`` (a margin
under 30 KB) and ``MAX_ELEMENTS``; the streamed content then gets whatever bytes are left. Rich
views and old tool calls shrink first; the status line and the buttons never go.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from feishu_progress.cards.validate import MAX_ELEMENTS, element_count

TARGET_BYTES = 28 * 1024
ELEMENT_TARGET = MAX_ELEMENTS - 2  # room for the content element and its truncation marker
MIN_CONTENT_BYTES = 2 * 1024  # below this the content is cut to nothing useful: shrink the rest first
MAX_CONTENT_SCAN = 40_000  # characters of content ever looked at: more can never fit in 30 KB


@dataclass(frozen=True, slots=True)
class Limits:
    """How much of each section one build may show."""

    tools: int  # newest tool calls shown
    views: bool  # rich views / raw results as collapsible panels
    view_chars: int  # per long text inside a view (raw result, recent output, answer)
    view_items: int  # rows per view (answers, subagent rows)
    asktool_chars: int  # free text of one asktool summary, all questions, answers and options together
    images: int  # images per grid (≤ 9)
    questions: int  # form questions per ask
    options: int  # options per form question
    error_chars: int
    title_chars: int


# asktool_chars: level 0 never cuts anything a card can hold (30 KB is ~10 000 CJK characters, and
# each markdown text is there once per locale); the next levels cut the longest texts harder.
LEVELS: tuple[Limits, ...] = (
    Limits(tools=30, views=True, view_chars=3000, view_items=20, asktool_chars=30_000, images=9,
           questions=10, options=30, error_chars=3000, title_chars=200),
    Limits(tools=20, views=True, view_chars=1200, view_items=12, asktool_chars=4000, images=9,
           questions=10, options=20, error_chars=1500, title_chars=200),
    Limits(tools=12, views=True, view_chars=400, view_items=6, asktool_chars=1500, images=6,
           questions=8, options=12, error_chars=800, title_chars=120),
    Limits(tools=8, views=True, view_chars=150, view_items=3, asktool_chars=600, images=3,
           questions=5, options=8, error_chars=400, title_chars=100),
    Limits(tools=5, views=False, view_chars=0, view_items=0, asktool_chars=0, images=0,
           questions=3, options=5, error_chars=200, title_chars=80),
    Limits(tools=2, views=False, view_chars=0, view_items=0, asktool_chars=0, images=0,
           questions=1, options=3, error_chars=100, title_chars=60),
)  # fmt: skip
MIN_TEXT_CAP = 12  # a text cut to fit keeps at least this much: enough to recognise it


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (how Feishu measures the card)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def fits(card: dict[str, Any], reserve_bytes: int = 0) -> bool:
    """Whether the card leaves ``reserve_bytes`` under the target and stays under the element cap."""
    return json_bytes(card) + reserve_bytes <= TARGET_BYTES and element_count(card) <= ELEMENT_TARGET


def longest_prefix(text: str, max_bytes: int, size: Callable[[str], int]) -> int:
    """The largest n such that ``size(text[:n]) <= max_bytes`` (``size`` grows with n)."""
    low, high = 0, len(text)
    if size(text) <= max_bytes:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if size(text[:middle]) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return low


def fair_cap(lengths: list[int], budget: int) -> int | None:
    """The longest length every text may keep so that together they fit ``budget``; None if all fit.

    Water-filling: texts shorter than the cap stay whole and only the longest are cut, all to the
    same length. Never below ``MIN_TEXT_CAP``: the texts are all shown, so each keeps a recognisable
    head even when that overshoots the budget (the builder's smaller levels then take over).
    """
    if sum(lengths) <= budget:
        return None
    remaining, count = budget, len(lengths)
    for length in sorted(lengths):
        if length * count > remaining:
            return max(remaining // count, MIN_TEXT_CAP)
        remaining -= length
        count -= 1
    return None  # unreachable: the sum exceeds the budget, so some text is longer than its share

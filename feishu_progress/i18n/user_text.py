"""Untrusted user text shaped for display: flattened to one line, and the one text cutter.

The cutter shortens text without splitting a character as people see it.
A cut never falls inside a grapheme cluster (an emoji with its skin tone or ZWJ sequence, a flag's
two regional indicators, a letter and its combining marks, a Hangul syllable's jamo, CR LF), so a
card never shows half an emoji or a stray accent. Lengths count code points, like ``len``.

One ellipsis rule: ``limit`` is the number of characters kept; when something was dropped the
``ellipsis`` comes after them, with the kept part's trailing whitespace removed. Seeds fix a few
exact forms: a failure reason is the first 40 characters with no ellipsis (seed 000 §3.3), a
subagent title 40 characters + ``...`` (seed 002 cleanTitle); callers pass those ellipses.
"""

from __future__ import annotations

import re
import unicodedata

ELLIPSIS = "…"
_CONTROL_AND_NEWLINES = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\ufeff]+")
_SPACES = re.compile(r"\s+")
_ZWJ = "\u200d"
_MARK_CATEGORIES = frozenset({"Mn", "Me", "Mc"})
# Code point ranges that attach to the character before them.
_EXTENDING_RANGES = (
    (0xFE00, 0xFE0F),  # variation selectors (text / emoji presentation)
    (0xE0100, 0xE01EF),  # variation selectors supplement
    (0x1F3FB, 0x1F3FF),  # emoji skin tone modifiers
    (0xE0020, 0xE007F),  # tag characters (subdivision flags)
    (0x1160, 0x11FF),  # Hangul jamo vowels and trailing consonants
    (0xD7B0, 0xD7FF),  # Hangul jamo extended-B
)


def one_line(text: str) -> str:
    """Control characters and line breaks as spaces, every run of whitespace one space, stripped."""
    return _SPACES.sub(" ", _CONTROL_AND_NEWLINES.sub(" ", text)).strip()


def _extends(char: str) -> bool:
    """A code point that belongs to the one before it."""
    if char == _ZWJ or unicodedata.category(char) in _MARK_CATEGORIES:
        return True
    code = ord(char)
    return any(low <= code <= high for low, high in _EXTENDING_RANGES)


def _is_regional_indicator(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _splits_flag(text: str, index: int) -> bool:
    """True when ``index`` falls between the two regional indicators of one flag."""
    run = 0
    while index - run - 1 >= 0 and _is_regional_indicator(text[index - run - 1]):
        run += 1
    return run % 2 == 1 and _is_regional_indicator(text[index])


def _inside_cluster(text: str, index: int) -> bool:
    """True when a cut at ``index`` (0 < index < len) would split a grapheme cluster."""
    before, after = text[index - 1], text[index]
    if before == "\r" and after == "\n":
        return True
    return _extends(after) or before == _ZWJ or _splits_flag(text, index)


def cut_index(text: str, limit: int) -> int:
    """How many characters of ``text`` a cut at ``limit`` keeps: ``limit``, moved back to a cluster edge.

    All of ``text`` when it is not longer than ``limit``. A single cluster longer than ``limit``
    (zalgo text: one letter under a hundred marks) is cut at ``limit`` anyway: some text beats none.
    """
    limit = max(limit, 0)
    if len(text) <= limit:
        return len(text)
    index = limit
    while index > 0 and _inside_cluster(text, index):
        index -= 1
    return index or limit


def cut_text(text: str, limit: int, ellipsis: str = ELLIPSIS) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit`` + ``ellipsis``."""
    index = cut_index(text, limit)
    if index == len(text):
        return text
    kept = text[:index]
    return kept.rstrip() + ellipsis if ellipsis else kept

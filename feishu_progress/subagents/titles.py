"""Title rules for running subagents (seed 002 §4.1.2, §5.2). Pure: no I/O, no clock."""

from __future__ import annotations

import re
import unicodedata

MAX_TITLE_CHARS = 40
ELLIPSIS = "..."
# The title the runtime generates when the model gives none: "后台子代理(explorer): <task>".
# Full-width brackets and colon are accepted too: the prefix is machine-made, but editors rewrite it.
AUTO_TITLE_PREFIX = re.compile(r"^\s*后台子代理\s*[(（][^)）]*[)）]\s*[:：]\s*")
_WHITESPACE = re.compile(r"\s+")
_ZWJ = "\u200d"


def _is_control(char: str) -> bool:
    return unicodedata.category(char) == "Cc"


def _continues_cluster(char: str) -> bool:
    """A code point that belongs to the character before it (combining mark, emoji modifier, ZWJ...)."""
    if char == _ZWJ or unicodedata.category(char) in {"Mn", "Me", "Mc"}:
        return True
    code = ord(char)
    # Variation selectors, emoji skin tones, tag characters of flag sequences.
    return 0xFE00 <= code <= 0xFE0F or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F


def _is_regional_indicator(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _splits_flag(text: str, cut: int) -> bool:
    """True when ``cut`` falls between the two regional indicators of one flag."""
    run = 0
    while cut - run - 1 >= 0 and _is_regional_indicator(text[cut - run - 1]):
        run += 1
    return run % 2 == 1 and _is_regional_indicator(text[cut])


def _cut_point(text: str, limit: int) -> int:
    """``limit``, moved back so the cut never splits an emoji sequence, a flag or a combined character."""
    cut = limit
    while cut > 0 and (_continues_cluster(text[cut]) or text[cut - 1] == _ZWJ or _splits_flag(text, cut)):
        cut -= 1
    return cut or limit


def strip_auto_prefix(title: str) -> str:
    """Drop the ``后台子代理(type): `` prefix so the type is not said twice on the card."""
    return AUTO_TITLE_PREFIX.sub("", title, count=1)


def clean_title(raw: str | None, limit: int = MAX_TITLE_CHARS) -> str | None:
    """Control characters out, whitespace collapsed, cut at ``limit`` chars + ``...``; None if empty."""
    if raw is None:
        return None
    text = "".join(" " if _is_control(char) else char for char in raw)
    text = _WHITESPACE.sub(" ", text).strip()
    if not text:
        return None
    if len(text) > limit:
        text = text[: _cut_point(text, limit)].rstrip() + ELLIPSIS
    return text


def fallback_title(child_session_id: int | None, execution_id: int) -> str:
    """The label of a subagent with no usable title: ``子代理 #<child session or execution id>``."""
    return f"子代理 #{child_session_id if child_session_id is not None else execution_id}"


def running_subagent_title(
    child_title: str | None, task_description: str | None, child_session_id: int | None, execution_id: int
) -> str:
    """The card title of a running subagent: its session title, else its task, else ``子代理 #id``."""
    from_title = clean_title(strip_auto_prefix(child_title)) if child_title else None
    return from_title or clean_title(task_description) or fallback_title(child_session_id, execution_id)

"""Title rules for running subagents (seed 002 §4.1.2, §5.2). Pure: no I/O, no clock."""

from __future__ import annotations

import re
import unicodedata

from feishu_progress.i18n.user_text import cut_text

MAX_TITLE_CHARS = 40
ELLIPSIS = "..."  # seed 002 cleanTitle: 40 characters + "..."
# The title the runtime generates when the model gives none: "后台子代理(explorer): <task>".
# Full-width brackets and colon are accepted too: the prefix is machine-made, but editors rewrite it.
AUTO_TITLE_PREFIX = re.compile(r"^\s*后台子代理\s*[(（][^)）]*[)）]\s*[:：]\s*")
_WHITESPACE = re.compile(r"\s+")


def _is_control(char: str) -> bool:
    return unicodedata.category(char) == "Cc"


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
    return cut_text(text, limit, ELLIPSIS)


def fallback_title(child_session_id: int | None, execution_id: int) -> str:
    """The label of a subagent with no usable title: ``子代理 #<child session or execution id>``."""
    return f"子代理 #{child_session_id if child_session_id is not None else execution_id}"


def running_subagent_title(
    child_title: str | None, task_description: str | None, child_session_id: int | None, execution_id: int
) -> str:
    """The card title of a running subagent: its session title, else its task, else ``子代理 #id``."""
    from_title = clean_title(strip_auto_prefix(child_title)) if child_title else None
    return from_title or clean_title(task_description) or fallback_title(child_session_id, execution_id)

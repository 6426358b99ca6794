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
    """The card title of a running subagent: its session title, else its task, else ``子代理 #id``.

    Exactly seed 002 §4.1.2: a non-blank session title is the source even when nothing is left once the
    auto prefix is gone (``后台子代理(explorer): `` alone gives ``子代理 #id``, not the task). The
    runtime writes that prefix before the task's first 40 characters, so a bare prefix means the task
    it was made from was blank too; the description is only for a session with no title at all.
    """
    raw: str | None
    if child_title is not None and child_title.strip():
        raw = strip_auto_prefix(child_title)
    else:
        raw = task_description
    return clean_title(raw) or fallback_title(child_session_id, execution_id)

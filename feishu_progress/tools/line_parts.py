"""Building blocks of a tool line: labels, details, counts and the failure rules (seed 000 §3.3, D9).

Every line is an ``i18n.Msg``: ``{label} ({detail})``, ``{label} (失败: {reason})`` or ``{label} (失败)``.
A label is a verb from the catalog plus an untrusted target (path, query, command...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.i18n import Msg, Text, plural
from feishu_progress.i18n.user_text import one_line
from feishu_progress.tools.readers import first_chars, get_str

# Seed 000 §3.3: the reason is the first 40 characters of ``error``.
REASON_LIMIT = 40


def label(verb: str | Msg, target: Text = "", *, colon: bool = False) -> Msg:
    """``{verb} {target}`` (or ``{verb}: {target}``); the bare verb when there is no target."""
    verb_msg = verb if isinstance(verb, Msg) else Msg(verb)
    if not target:
        return verb_msg
    return Msg("tool.label.colon" if colon else "tool.label.space", {"verb": verb_msg, "target": target})


def with_detail(line_label: Msg, detail: Msg | None) -> Msg:
    """``{label} ({detail})``, or the label alone."""
    if detail is None:
        return line_label
    return Msg("tool.line.detail", {"label": line_label, "detail": detail})


def count(key: str, n: int) -> Msg:
    """A counted noun: ``<key>.one`` or ``<key>.other``, picked by the locale's plural rule on translation."""
    return plural(key, "n", {"n": n})


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed result: ``reason`` is what the line shows ("" = none to give), ``full`` the whole error."""

    reason: str
    full: str

    @property
    def truncated(self) -> bool:
        """True when the line shows less of the error than the result holds."""
        return one_line(self.full) != self.reason


def failure_of(node: Any) -> Failure | None:
    """Whether a result reports failure, and why.

    A failure is a mapping with an ``error`` that is a non-blank string (or an object with a non-blank
    ``message``), or with ``success: false``. ``success: false`` without an error has no reason (D9).
    """
    if not isinstance(node, Mapping):
        return None
    error = node.get("error")
    text = error.strip() if isinstance(error, str) else ""
    if not text and isinstance(error, Mapping):
        text = get_str(error, "message", "msg")
    if text:
        return Failure(reason=first_chars(text, REASON_LIMIT), full=text)
    if node.get("success") is False:
        return Failure(reason="", full="")
    return None


def failed(line_label: Msg, failure: Failure) -> Msg:
    """``{label} (失败: {reason})``, or a bare ``{label} (失败)`` — never empty parentheses."""
    if failure.reason:
        return Msg("tool.line.failed", {"label": line_label, "reason": failure.reason})
    return Msg("tool.line.failed_bare", {"label": line_label})

"""What the multi-instance tests assert, computed from the sandbox's update log (GET /_sandbox/messages).

Pure functions of that JSON: each returns the problems it found (empty: the rule held) or a measurement,
so a failing test names the message, the instances and the times. The sandbox's clock is the host's
``time.monotonic()``, the same clock the harness stamps its kills and pauses with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from feishu_progress.cards.sections import state_word
from feishu_progress.domain import TaskStatus
from feishu_progress.i18n import translate
from feishu_progress.i18n.locales import CATALOG_LOCALES

Message = Mapping[str, Any]
Update = Mapping[str, Any]

# Every state word in every catalog locale, back to its status (the header's text tag carries it).
_STATUS_OF_WORD: dict[str, TaskStatus] = {
    translate(state_word(status), locale): status for status in TaskStatus for locale in CATALOG_LOCALES
}
_MARK = re.compile(r"ev(\d+);")
RATE_LIMIT_CODES = frozenset({230020, 99991400, 429})


def event_mark(index: int) -> str:
    """The text a test streams as event ``index`` of a task, so the card shows which events it applied."""
    return f"ev{index};"


def card_status(card: Mapping[str, Any]) -> TaskStatus | None:
    """The status a progress card shows in its header's text tag (None: not a progress card)."""
    header = card.get("header")
    tags = header.get("text_tag_list") if isinstance(header, Mapping) else None
    if not tags or not isinstance(tags[0], Mapping):
        return None
    text = tags[0].get("text")
    if not isinstance(text, Mapping):
        return None
    words = [text.get("content"), *(text.get("i18n_content") or {}).values()]
    return next((_STATUS_OF_WORD[w] for w in words if isinstance(w, str) and w in _STATUS_OF_WORD), None)


def card_marks(card: Mapping[str, Any]) -> list[int]:
    """The event marks (``event_mark``) the card's text shows, in order."""
    return [int(number) for number in _MARK.findall(_all_text(card))]


def _all_text(node: Any) -> str:
    if isinstance(node, Mapping):
        return " ".join(_all_text(value) for key, value in node.items() if key != "i18n_content")
    if isinstance(node, list):
        return " ".join(_all_text(item) for item in node)
    return node if isinstance(node, str) else ""


def _end(update: Update) -> float:
    """When an update stopped being in flight: answered, or abandoned unapplied (its client died first)."""
    ended = update.get("answered")
    if ended is None:
        ended = update.get("abandoned")
    return math.inf if ended is None else float(ended)


def _who(update: Update) -> str:
    return f"{update['endpoint']} from {update.get('instance') or '?'} at {update['arrived']:.3f}"


# --- the rules ------------------------------------------------------------------------------------


def overlapping_updates(messages: Iterable[Message]) -> list[str]:
    """Updates of one message (or its card) in flight at the same time: there must be none."""
    problems: list[str] = []
    for message in messages:
        busy_until, busy_with = -math.inf, None
        for update in message["updates"]:
            if update["arrived"] < busy_until or update.get("concurrent", 0) > 0:
                problems.append(f"{message['message_id']}: {_who(update)} overlapped {busy_with}")
            if _end(update) >= busy_until:
                busy_until, busy_with = _end(update), _who(update)
    return problems


def regressions_after_final(messages: Iterable[Message]) -> list[str]:
    """Cards that changed status after showing a terminal one (needs ``history``): there must be none."""
    problems: list[str] = []
    for message in messages:
        final: TaskStatus | None = None
        for version, shown in enumerate(message["history"]):
            status = card_status(shown["card"])
            if final is not None and status is not final:
                problems.append(f"{message['message_id']}: version {version} shows {status} after {final}")
            if final is None and status is not None and status.is_terminal:
                final = status
    return problems


def undelivered_finals(messages: Iterable[Message], expected: Mapping[str, TaskStatus]) -> list[str]:
    """Messages whose last card does not show the final status the test ended their task with."""
    shown = {message["message_id"]: card_status(message["card"]) for message in messages}
    return [
        f"{message_id}: shows {shown.get(message_id)}, expected {status}"
        for message_id, status in expected.items()
        if shown.get(message_id) is not status
    ]


def rate_limit_answers(messages: Iterable[Message]) -> list[str]:
    """Updates answered with a rate limit (per message, per card, or the app's gateway)."""
    return [
        f"{message['message_id']}: {_who(update)} answered {update['code']}"
        for message in messages
        for update in message["updates"]
        if update.get("code") in RATE_LIMIT_CODES
    ]


def out_of_order_events(messages: Iterable[Message], expected: Mapping[str, int]) -> list[str]:
    """Every event applied once, in order (needs ``history``): each card shows marks 0, 1, 2, … with no
    gap, repeat or reordering, and the last card shows all ``expected[message_id]`` of them."""
    problems: list[str] = []
    by_id = {message["message_id"]: message for message in messages}
    for message_id, count in expected.items():
        message = by_id.get(message_id)
        if message is None:
            problems.append(f"{message_id}: no such message in the sandbox")
            continue
        for version, shown in enumerate(message["history"]):
            marks = card_marks(shown["card"])
            if marks != list(range(len(marks))):
                problems.append(f"{message_id}: version {version} shows events {marks}")
        last = card_marks(message["card"])
        if last != list(range(count)):
            problems.append(f"{message_id}: the last card shows {len(last)} events, expected {count}")
    return problems


# --- who wrote what, when ------------------------------------------------------------------------


def last_writers(messages: Iterable[Message], before: float) -> dict[str, str]:
    """Per message, the instance of the last update that arrived before ``before``."""
    writers: dict[str, str] = {}
    for message in messages:
        earlier = [u for u in message["updates"] if u["arrived"] < before and u.get("instance")]
        if earlier:
            writers[message["message_id"]] = str(earlier[-1]["instance"])
    return writers


def takeover_seconds(messages: Iterable[Message], victim: str, since: float) -> dict[str, float]:
    """For each card ``victim`` wrote last before ``since``: seconds from ``since`` until another instance
    first updated it (``math.inf`` when none ever did)."""
    messages = list(messages)
    owned = {message_id for message_id, who in last_writers(messages, since).items() if who == victim}
    seconds: dict[str, float] = {}
    for message in messages:
        if message["message_id"] not in owned:
            continue
        later = [
            u["arrived"] - since
            for u in message["updates"]
            if u["arrived"] >= since and u.get("instance") not in (None, victim)
        ]
        seconds[message["message_id"]] = min(later, default=math.inf)
    return seconds


def writes_by(
    messages: Iterable[Message], instance: str, since: float, message_ids: Iterable[str] | None = None
) -> list[str]:
    """Updates ``instance`` sent that arrived at or after ``since`` (on ``message_ids`` only, if given)."""
    wanted = None if message_ids is None else set(message_ids)
    return [
        f"{message['message_id']}: {_who(update)}"
        for message in messages
        if wanted is None or message["message_id"] in wanted
        for update in message["updates"]
        if update.get("instance") == instance and update["arrived"] >= since
    ]


def writer_changes(messages: Iterable[Message]) -> list[tuple[str, float, str, str]]:
    """Every time a message's writer changed: (message_id, arrival, from instance, to instance)."""
    changes: list[tuple[str, float, str, str]] = []
    for message in messages:
        previous: str | None = None
        for update in message["updates"]:
            who = update.get("instance")
            if previous is not None and who is not None and who != previous:
                changes.append((message["message_id"], float(update["arrived"]), previous, str(who)))
            previous = who or previous
    return changes

"""The callback contract of the card: button values, form field names, and the answers decoder.

Every button carries ``{"v": 1, "action": ..., "session_id": <int>, "ask_id"?, "approval_id"?}`` in
``behaviors[callback].value``. A pending ask is a form whose fields are named ``q<a>_<q>`` (the
select, multi-select or text input of question ``q`` of the ``a``-th pending ask) and
``q<a>_<q>_other`` (the optional typed answer); option values are option indexes as strings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from feishu_progress.domain import AskQuestion, PendingAsk

CALLBACK_VERSION = 1
MAX_ANSWER_CHARS = 1000  # Feishu's input max_length

# approve_always: 始终允许(本任务), on an approval whose runtime said it can honour it (allow_always).
Action = Literal["cancel", "retry", "dislike", "answers", "approve", "approve_always", "deny"]
ACTIONS: frozenset[str] = frozenset(
    {"cancel", "retry", "dislike", "answers", "approve", "approve_always", "deny"}
)

_FIELD = re.compile(r"^q(\d{1,4})_(\d{1,4})(_other)?$")


def callback_value(
    action: Action, session_id: int, *, ask_id: str | None = None, approval_id: str | None = None
) -> dict[str, Any]:
    """The value object a card button sends back."""
    value: dict[str, Any] = {"v": CALLBACK_VERSION, "action": action, "session_id": session_id}
    if ask_id is not None:
        value["ask_id"] = ask_id
    if approval_id is not None:
        value["approval_id"] = approval_id
    return value


def field_name(ask_index: int, question_index: int) -> str:
    """Form field of a question's select / multi-select / text input."""
    return f"q{ask_index}_{question_index}"


def other_field_name(ask_index: int, question_index: int) -> str:
    """Form field of a question's optional typed answer."""
    return f"{field_name(ask_index, question_index)}_other"


def form_name(ask_index: int) -> str:
    """Name of the form of the ``ask_index``-th pending ask."""
    return f"ask_{ask_index}"


def submit_name(ask_index: int) -> str:
    """Name of that form's submit button."""
    return f"submit_{ask_index}"


def decode_form_answers(
    ask: PendingAsk, form_value: Mapping[str, Any], *, ask_index: int | None = None
) -> list[tuple[list[str], str]]:
    """Per question of ``ask``: (selected option labels, typed text). Raises ValueError naming the field.

    A question without a field in ``form_value`` is unanswered (``([], "")``): Feishu leaves out
    fields the user did not touch, and the card may show only the first questions of a long ask.
    """
    if not isinstance(form_value, Mapping):
        raise ValueError("form_value: expected an object")
    answers: list[tuple[list[str], str]] = [([], "") for _ in ask.questions]
    for name, raw in form_value.items():
        question_index, is_other = _parse_field(name, ask, ask_index)
        question = ask.questions[question_index]
        labels, text = answers[question_index]
        if is_other or not question.options:
            text = _decode_text(name, raw)
        else:
            labels = _decode_choice(name, raw, question)
        answers[question_index] = (labels, text)
    return answers


def _parse_field(name: object, ask: PendingAsk, ask_index: int | None) -> tuple[int, bool]:
    match = _FIELD.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"{name!r}: not a field of this form")
    if ask_index is not None and int(match.group(1)) != ask_index:
        raise ValueError(f"{name}: belongs to another question set")
    question_index = int(match.group(2))
    if question_index >= len(ask.questions):
        raise ValueError(f"{name}: no question {question_index + 1} in this ask")
    is_other = match.group(3) is not None
    if is_other and not ask.questions[question_index].options:
        raise ValueError(f"{name}: this question has no options, answer it in its own field")
    return question_index, is_other


def _decode_text(name: str, raw: Any) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ValueError(f"{name}: expected text")
    if len(raw) > MAX_ANSWER_CHARS:
        raise ValueError(f"{name}: longer than {MAX_ANSWER_CHARS} characters")
    return raw.strip()


def _decode_choice(name: str, raw: Any, question: AskQuestion) -> list[str]:
    if raw is None or raw == "":
        return []
    if question.multi_select:
        if not isinstance(raw, list):
            raise ValueError(f"{name}: expected a list of options")
        indexes = [_option_index(name, item, question) for item in raw]
    else:
        indexes = [_option_index(name, raw, question)]
    unique = list(dict.fromkeys(indexes))
    return [question.options[index].label for index in unique]


def _option_index(name: str, raw: Any, question: AskQuestion) -> int:
    if not isinstance(raw, str) or not (raw.isascii() and raw.isdigit()) or len(raw) > 4:
        raise ValueError(f"{name}: {raw!r} is not an option")
    index = int(raw)
    if index >= len(question.options):
        raise ValueError(f"{name}: option {raw} does not exist")
    return index

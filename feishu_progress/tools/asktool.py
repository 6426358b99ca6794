"""asktool answer summary (seed 001 §4.1): questions from the call's args, answers from its result text.

Any doubt returns None so the card falls back to the raw result: a half-parsed card is worse than none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from feishu_progress.domain import AskOption, AskQuestion
from feishu_progress.i18n import Msg, plural
from feishu_progress.tools.readers import as_mapping, get_str
from feishu_progress.tools.view_models import AskToolHeadline, AskToolView

ASK_TOOL_NAME = "asktool"
# Rule 1: a provider or plugin prefix is removed (``provider__tool``, ``provider.tool``, ``plugin:tool``),
# then the rest must equal ``asktool``: ``plugin:asktool`` is asktool, ``plugin:asktool_x`` is not, and
# ``plugin_asktool`` is another tool's whole name (an underscore is no separator).
_PREFIX_SEPARATORS = ("__", ".", ":")
SEGMENT_SEPARATOR = "\n---\n"
ANSWER_SEPARATOR = "、"
QUESTION_COLON = "："


def bare_tool_name(name: str) -> str:
    """The name without a provider/plugin prefix: ``functions.asktool`` / ``plugin:asktool`` → ``asktool``."""
    bare = name.strip()
    for separator in _PREFIX_SEPARATORS:
        bare = bare.rsplit(separator, 1)[-1]
    return bare


def is_asktool_name(name: Any) -> bool:
    """True for ``asktool`` itself or a provider- or plugin-prefixed ``asktool`` (``plugin:asktool``)."""
    return isinstance(name, str) and bare_tool_name(name) == ASK_TOOL_NAME


def normalize_option(raw: Any) -> AskOption | None:
    """A string or ``{label, description}``; anything else (or a blank label) is dropped."""
    if isinstance(raw, str):
        return AskOption(label=raw) if raw.strip() else None
    node = as_mapping(raw)
    label = node.get("label")
    if not isinstance(label, str) or not label.strip():
        return None
    description = node.get("description")
    return AskOption(label=label, description=description if isinstance(description, str) else "")


def _question(raw: Any) -> AskQuestion | None:
    node = as_mapping(raw)
    text = node.get("question")
    if not isinstance(text, str) or not text.strip():
        return None
    options = node.get("options")
    normalized = (normalize_option(option) for option in options) if isinstance(options, list) else ()
    return AskQuestion(
        question=text,
        options=tuple(option for option in normalized if option is not None),
        multi_select=node.get("multiSelect") is True,
    )


def parse_questions(args: Any) -> tuple[AskQuestion, ...]:
    """Rule 2: the valid questions of ``args.questions`` (illegal items dropped)."""
    raw = as_mapping(args).get("questions")
    if not isinstance(raw, list):
        return ()
    return tuple(question for question in map(_question, raw) if question is not None)


def _envelope_text(node: Mapping[str, Any]) -> str | None:
    content = node.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [get_str(as_mapping(part), "text") for part in content]
        texts = [part for part in parts if part]
        return "\n".join(texts) if texts else None
    return None


def result_text(result: Any) -> str | None:
    """Rule 3: the text of a bare string or of a ``{content, details}`` envelope (also JSON-encoded)."""
    if isinstance(result, Mapping):
        return _envelope_text(result)
    if not isinstance(result, str):
        return None
    if result.lstrip().startswith("{"):
        try:
            decoded = json.loads(result)
        except (ValueError, RecursionError):
            return result
        if isinstance(decoded, Mapping) and "content" in decoded:
            return _envelope_text(decoded)
    return result


def _answer_for(question: str, index: int, segments: list[str]) -> tuple[bool, tuple[str, ...] | None]:
    """Rule 4 for one question: (matched, answer). Segment ``index`` is preferred when it matches."""
    prefix = question + QUESTION_COLON
    ordered = segments[index : index + 1] + segments
    for segment in ordered:
        if segment.startswith(prefix):
            rest = segment[len(prefix) :]
            return True, (tuple(rest.split(ANSWER_SEPARATOR)) if rest else None)
    return False, None


def match_answers(questions: tuple[AskQuestion, ...], text: str) -> tuple[tuple[str, ...] | None, ...] | None:
    """Rules 4-5: one answer (or None = skipped/declined) per question; None if any question is unmatched."""
    segments = text.replace("\r\n", "\n").split(SEGMENT_SEPARATOR)
    answers: list[tuple[str, ...] | None] = []
    for index, question in enumerate(questions):
        matched, answer = _answer_for(question.question, index, segments)
        if not matched:
            return None
        answers.append(answer)
    return tuple(answers)  # rule 5 holds by construction: one answer per question, or None above


def _headline(pending: bool, answered: int) -> AskToolHeadline:
    if pending:
        return AskToolHeadline.PENDING
    return AskToolHeadline.ANSWERED if answered else AskToolHeadline.UNANSWERED


def parse_asktool(args: Any, result: Any) -> AskToolView | None:
    """The asktool view, or None when the call cannot be read with certainty (seed 001 §4.1 rules 1-6)."""
    questions = parse_questions(args)
    if not questions:
        return None
    text = result_text(result)
    if text is None:
        answers: tuple[tuple[str, ...] | None, ...] | None = (None,) * len(questions)
    else:
        answers = match_answers(questions, text)
    if answers is None:
        return None
    answered = sum(answer is not None for answer in answers)
    pending = text is None
    return AskToolView(
        questions=questions,
        answers=answers,
        pending=pending,
        headline=_headline(pending, answered),
        answered=answered,
    )


def is_custom_answer(question: AskQuestion, value: str) -> bool:
    """Rule 6: a value that is none of the question's option labels was typed by the user."""
    return not any(option.label == value for option in question.options)


def asktool_headline(view: AskToolView) -> Msg:
    """A-3 headline text after 提问 ·: answered n / N, unanswered, or waiting for an answer."""
    total = len(view.questions)
    base = {
        AskToolHeadline.ANSWERED: "view.asktool.summaryAnswered",
        AskToolHeadline.UNANSWERED: "view.asktool.summaryUnanswered",
        AskToolHeadline.PENDING: "view.asktool.summaryPending",
    }[view.headline]
    return plural(base, "total", {"total": total, "answered": view.answered})


def asktool_line(view: AskToolView) -> Msg:
    """The collapsed line: ``提问 · 2 个问题 · 已作答 2 / 2``."""
    return Msg("tool.asktool.line", {"name": Msg("view.asktool.name"), "summary": asktool_headline(view)})

"""Rich-view parsers (seed 000 goals 1, 3, 4): each returns None for a shape it does not recognise."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from feishu_progress.tools.readers import as_int, as_mapping, get_int, get_list, get_str, parse_result
from feishu_progress.tools.view_models import (
    AskAnswer,
    AskAnswersView,
    ImageGridView,
    ImageItem,
    StatusKind,
    SubagentRow,
    SubagentRowsView,
    WaitSummary,
)

_STATUS_KINDS = {"RUNNING": StatusKind.RUNNING, "COMPLETED": StatusKind.OK, "FAILED": StatusKind.FAIL}


def _text_or_none(node: Mapping[str, Any], key: str) -> str | None:
    value = node.get(key)
    return value if isinstance(value, str) and value.strip() else None


def _size_bytes(value: Any) -> int | None:
    """A byte count: a finite number, rounded down (1536.7 → 1536, like formatImageBytes' Math.floor)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None  # seed 000 D7: a non-finite size gets no badge
    size = math.floor(value)
    return size if size >= 0 else None


def _image_item(raw: Any) -> ImageItem | None:
    node = as_mapping(raw)
    url, path = _text_or_none(node, "image_url"), _text_or_none(node, "image_path")
    if url is None and path is None:
        return None
    return ImageItem(
        url=url, path=path, size_bytes=_size_bytes(node.get("size_bytes")), mime=_text_or_none(node, "mime")
    )


def parse_image_gen(result: Any, fallback_prompt: str = "") -> ImageGridView | None:
    """generate_image / edit_image: ``{images: [{image_url, image_path, size_bytes, mime}], model, size}``.

    Seed 000 D7: ``images`` must be a non-empty list whose first item has a string ``image_url``, else
    the result is not an image view (the card shows it raw). Every later item with a url or a path is
    kept (the card shows the first 9). ``fallback_prompt`` is the call's prompt argument.
    """
    node = as_mapping(parse_result(result))
    images = node.get("images")
    if (
        not isinstance(images, list)
        or not images
        or not isinstance(as_mapping(images[0]).get("image_url"), str)
    ):
        return None
    items = tuple(item for item in map(_image_item, images) if item is not None)
    if not items:
        return None  # a blank url and no path: nothing to show
    return ImageGridView(
        prompt=get_str(node, "prompt") or fallback_prompt,
        model=get_str(node, "model"),
        size=get_str(node, "size"),
        items=items,
    )


def _ask_answer(raw: Any) -> AskAnswer | None:
    node = as_mapping(raw)
    question = get_str(node, "question")
    if not question:
        return None
    labels = node.get("selectedLabels")
    custom = node.get("customInput")
    return AskAnswer(
        question=question,
        labels=tuple(label for label in labels if isinstance(label, str)) if isinstance(labels, list) else (),
        custom_input=custom if isinstance(custom, str) else "",
    )


def parse_ask_answers(result: Any) -> AskAnswersView | None:
    """ask_user_questions: ``{answers: [{question, selectedLabels, customInput}]}``; null input → ""."""
    answers = get_list(as_mapping(parse_result(result)), "answers")
    if not answers:
        return None
    pairs = tuple(pair for pair in map(_ask_answer, answers) if pair is not None)
    return AskAnswersView(answers=pairs) if pairs else None


def status_kind(status: str) -> StatusKind:
    """RUNNING → running, COMPLETED → ok, FAILED → fail, anything else → muted."""
    return _STATUS_KINDS.get(status.upper(), StatusKind.MUTED)


def _task_id(node: Mapping[str, Any]) -> str:
    value = node.get("taskId", node.get("task_id"))
    if isinstance(value, str):
        return value.strip()
    number = as_int(value)
    return "" if number is None else str(number)


def _subagent_row(raw: Any) -> SubagentRow | None:
    node = as_mapping(raw)
    if not node:
        return None
    status = get_str(node, "status")
    recent = node.get("recentOutput")
    return SubagentRow(
        task_id=_task_id(node),
        agent_type=get_str(node, "agentType", "agent_type"),
        status=status,
        status_kind=status_kind(status),
        rounds=get_int(node, "totalRounds"),
        tool_calls=get_int(node, "totalToolCalls"),
        prompt_tokens=get_int(node, "totalPromptTokens"),
        completion_tokens=get_int(node, "totalCompletionTokens"),
        recent_output=recent if isinstance(recent, str) else "",
    )


def _rows(items: list[Any]) -> tuple[SubagentRow, ...]:
    return tuple(row for row in map(_subagent_row, items) if row is not None)


def wait_summary(node: Mapping[str, Any]) -> WaitSummary | None:
    """The ``completed`` / ``all_completed`` / ``timed_out`` summary of a wait_subagents result."""
    completed = get_int(node, "completed")
    if completed is None and "all_completed" not in node and "timed_out" not in node:
        return None
    return WaitSummary(
        completed=max(completed or 0, 0),
        all_completed=node.get("all_completed") is True,
        timed_out=node.get("timed_out") is True,
    )


def _check_rows(node: Mapping[str, Any]) -> tuple[SubagentRow, ...]:
    listed = node.get("background_subagents")
    if isinstance(listed, list):
        return _rows(listed)
    if "taskId" in node or "status" in node:
        return _rows([node])
    return ()


def parse_subagent_rows(name: str, result: Any) -> SubagentRowsView | None:
    """check_subagent / wait_subagents progress rows (D3: wait only in its timeout branch)."""
    node = as_mapping(parse_result(result))
    if name == "check_subagent":
        rows = _check_rows(node)
        return SubagentRowsView(rows=rows) if rows else None
    if name == "wait_subagents":
        listed = node.get("background_subagents")
        rows = _rows(listed) if isinstance(listed, list) else ()
        return SubagentRowsView(rows=rows, wait=wait_summary(node)) if rows else None
    return None

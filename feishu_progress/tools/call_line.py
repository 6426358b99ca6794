"""Entry point from cards/: ``line_for_call`` turns one ToolCall into its ToolLine (summary, state, view).

Never raises: whatever the runtime reported, the card gets a line (a generic one at worst).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from feishu_progress.domain import ToolCall
from feishu_progress.i18n import Msg
from feishu_progress.i18n.user_text import one_line
from feishu_progress.tools.asktool import asktool_line, is_asktool_name, parse_asktool, result_text
from feishu_progress.tools.line_model import LineState, ToolLine
from feishu_progress.tools.line_parts import failure_of, label
from feishu_progress.tools.readers import as_mapping, compact_text, parse_result
from feishu_progress.tools.specs import finished_summary, running_summary, view_for, wants_view


def _raw(result: Any) -> str | None:
    text = compact_text(result)
    return text if text.strip() else None


def _finished_line(call: ToolCall, name: str) -> ToolLine:
    args = as_mapping(call.args)
    node = parse_result(call.result)
    summary = finished_summary(name, args, node)
    failed = failure_of(node) is not None
    view = None if failed else view_for(name, args, node)
    # A tool meant for a rich view shows its raw result when no view could be built from it.
    wants_raw = summary.show_raw or (wants_view(name) and not failed and node is not None)
    raw = _raw(call.result) if view is None and wants_raw else None
    return ToolLine(call.call_id, name, summary.text, summary.state, view=view, raw_result=raw)


def _asktool_line(call: ToolCall, name: str) -> ToolLine:
    failed = call.finished and failure_of(parse_result(call.result)) is not None
    view = None if failed else parse_asktool(call.args, call.result if call.finished else None)
    if view is not None:
        # Rule 3: a finished call with no result text has no answer yet either: 等待回答, not 调用 asktool.
        state = LineState.OK if call.finished else LineState.RUNNING
        return ToolLine(call.call_id, name, asktool_line(view), state, view=view)
    # A-5 / R5: what cannot be read with certainty (a failure, a text that does not match the questions,
    # half-streamed arguments) keeps the old view: the plain line, the result text and the questions.
    line = _plain_line(call, name)
    text = result_text(call.result) if call.finished and not failed else None
    raw_result = text if text and text.strip() else line.raw_result
    return replace(line, raw_result=raw_result, raw_args=_raw(call.args) if call.args else None)


def _plain_line(call: ToolCall, name: str) -> ToolLine:
    if call.finished:
        return _finished_line(call, name)
    return ToolLine(call.call_id, name, running_summary(name, as_mapping(call.args)), LineState.RUNNING)


def _fallback(call: Any) -> ToolLine:
    """The line of last resort: the tool's name, and the result as text."""
    name = getattr(call, "name", "")
    name = name if isinstance(name, str) else ""
    finished = getattr(call, "finished", False) is True
    call_id = getattr(call, "call_id", "")
    return ToolLine(
        call_id=call_id if isinstance(call_id, str) else "",
        name=name,
        summary=label(Msg("tool.generic", {"name": one_line(name) or "?"})),
        state=LineState.OK if finished else LineState.RUNNING,
        raw_result=_raw(getattr(call, "result", None)) if finished else None,
    )


def line_for_call_strictly(call: ToolCall) -> ToolLine:
    """``line_for_call`` without the safety net (tests prove no input needs the net)."""
    name = call.name if isinstance(call.name, str) else ""
    if is_asktool_name(name):
        return _asktool_line(call, name)
    return _plain_line(call, name)


def line_for_call(call: ToolCall) -> ToolLine:
    """One line of 本轮工具 for ``call``: running → input preview; finished → summary + view/raw result."""
    try:
        return line_for_call_strictly(call)
    except Exception:  # a pure room cannot log; the raw result keeps the information on the card
        return _fallback(call)

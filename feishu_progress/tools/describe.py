"""Entry point from cards/: turn one ToolCall into its ToolLine.

PLACEHOLDER generic implementation; the tools/ work replaces it with per-tool summaries.
"""

from __future__ import annotations

from feishu_progress.domain import ToolCall
from feishu_progress.tools.types import LineState, ToolLine


def describe_tool_call(call: ToolCall) -> ToolLine:
    state = LineState.OK if call.finished else LineState.RUNNING
    return ToolLine(call_id=call.call_id, name=call.name, summary=call.name, state=state)

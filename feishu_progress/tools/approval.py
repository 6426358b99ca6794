"""Approval titles (seed 000 D8): what the approval block says the agent is waiting for."""

from __future__ import annotations

from typing import Any

from feishu_progress.i18n import Msg
from feishu_progress.tools.specs import TOOLS

MCP_PREFIX = "mcp:"


def approval_title(tool_name: Any) -> Msg:
    """The title its spec names (shell, write_file, edit_file), ``mcp:<server>`` → ``MCP <server> 待审批``,
    else 操作待审批."""
    if not isinstance(tool_name, str):
        return Msg("tool.approval.generic")
    spec = TOOLS.get(tool_name)
    if spec is not None and spec.approval is not None:
        return Msg(spec.approval)
    if tool_name.startswith(MCP_PREFIX):
        server = tool_name[len(MCP_PREFIX) :].strip()
        if server:
            return Msg("tool.approval.mcp", {"server": server})
    return Msg("tool.approval.generic")

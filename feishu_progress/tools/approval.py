"""Approval titles (seed 000 D8): what the approval block says the agent is waiting for."""

from __future__ import annotations

from typing import Any

from feishu_progress.i18n import Msg

MCP_PREFIX = "mcp:"
_STATIC_TITLES = {
    "shell": "tool.approval.shell",
    "write_file": "tool.approval.write_file",
    "edit_file": "tool.approval.edit_file",
}


def approval_title(tool_name: Any) -> Msg:
    """shell / write_file / edit_file titles, ``mcp:<server>`` → ``MCP <server> 待审批``, else 操作待审批."""
    if not isinstance(tool_name, str):
        return Msg("tool.approval.generic")
    static = _STATIC_TITLES.get(tool_name)
    if static is not None:
        return Msg(static)
    if tool_name.startswith(MCP_PREFIX):
        server = tool_name[len(MCP_PREFIX) :].strip()
        if server:
            return Msg("tool.approval.mcp", {"server": server})
    return Msg("tool.approval.generic")

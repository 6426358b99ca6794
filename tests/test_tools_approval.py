"""Approval titles (seed 000 D8)."""

from __future__ import annotations

from typing import Any

import pytest

from feishu_progress.i18n import translate
from feishu_progress.tools.approval import approval_title


@pytest.mark.parametrize(
    ("tool_name", "zh", "en"),
    [
        ("shell", "命令执行待审批", "Command awaiting approval"),
        ("write_file", "文件写入待审批", "File write awaiting approval"),
        ("edit_file", "文件编辑待审批", "File edit awaiting approval"),
        ("mcp:github", "MCP github 待审批", "MCP github awaiting approval"),
        ("mcp:", "操作待审批", "Action awaiting approval"),
        ("mcp:   ", "操作待审批", "Action awaiting approval"),
        ("read_file", "操作待审批", "Action awaiting approval"),
        ("MCP:github", "操作待审批", "Action awaiting approval"),
        ("", "操作待审批", "Action awaiting approval"),
    ],
)
def test_approval_title(tool_name: str, zh: str, en: str) -> None:
    title = approval_title(tool_name)
    assert translate(title, "zh_cn") == zh
    assert translate(title, "en_us") == en


def test_server_name_is_a_param_so_cards_escape_it() -> None:
    title = approval_title("mcp:<at id=all></at>")
    assert title.params == {"server": "<at id=all></at>"}


@pytest.mark.parametrize("tool_name", [None, 3, ["mcp:x"]])
def test_non_string_tool_name_is_generic(tool_name: Any) -> None:
    assert translate(approval_title(tool_name)) == "操作待审批"

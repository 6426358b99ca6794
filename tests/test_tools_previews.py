"""Input previews (seed 000 §3.4): the seven exact cases, per-tool keys, the generic fallback, bad values."""

from __future__ import annotations

from typing import Any

import pytest

from feishu_progress.i18n import Msg
from feishu_progress.tools.specs import input_preview, input_preview_text


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        # seed 000 §3.4, the seven cases
        ("check_subagent", {"task_id": 5}, "任务 #5"),
        ("check_subagent", {}, ""),
        ("cancel_subagent", {"task_id": 12}, "任务 #12"),
        ("create_scheduled_task", {"name": "一二三四五六七八九十" * 4}, ("一二三四五六七八九十" * 3)),
        ("create_scheduled_task", {}, ""),
        ("update_scheduled_task", {"name": "早报", "task_id": 3}, "早报"),
        ("update_scheduled_task", {"task_id": 3}, "任务 #3"),
        ("update_scheduled_task", {}, ""),
        ("delete_scheduled_task", {"task_id": 9}, "任务 #9"),
        ("delete_scheduled_task", {}, ""),
        ("send_wechat_image", {"image": "/tmp/a b.png"}, "/tmp/a b.png"),
        ("send_wechat_file", {"file_name": "报告.pdf", "file": "/x/1.pdf"}, "报告.pdf"),
        ("send_wechat_file", {"file": "/x/1.pdf"}, "/x/1.pdf"),
        ("send_wechat_file", {}, ""),
        # per tool
        ("shell", {"command": "ls -la"}, "ls -la"),
        ("shell", {"session_id": "s", "input": "yes"}, "yes"),
        ("read_file", {"path": "src/a.py"}, "src/a.py"),
        ("web_search", {"query": "飞书 限流"}, "飞书 限流"),
        ("open_web_page", {"url": "https://example.com/" + "x" * 60}, ("example.com/" + "x" * 60)[:40]),
        ("mcp_call", {"server": "github", "tool": "search"}, "github.search"),
        ("feishu_send_image", {"image": "a.png"}, "a.png"),
        ("dingtalk_send_file", {"file": "b.zip"}, "b.zip"),
        # no case: nothing worth showing
        ("list_scheduled_tasks", {"name": "x"}, ""),
        ("wait_subagents", {"timeout_seconds": 30}, ""),
        # erratum 1: subagent_followup is covered by the task key
        ("subagent_followup", {"child_session_id": 3, "task": "补充一下数据"}, "补充一下数据"),
    ],
)
def test_preview(name: str, args: dict[str, Any], expected: str) -> None:
    assert input_preview(name, args) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"task": "写周报"}, "写周报"),
        ({"task_id": 4}, "任务 #4"),
        ({"name": "n"}, "n"),
        ({"image": "i.png"}, "i.png"),
        ({"file": "f"}, "f"),
        ({"file_name": "fn"}, "fn"),
        ({"query": "q"}, "q"),
        ({"path": "p"}, "p"),
        ({"url": "http://u.io/x"}, "u.io/x"),
        ({"command": "make"}, "make"),
        ({"task": "", "name": "second"}, "second"),
        ({"other": "x"}, ""),
    ],
)
def test_generic_fallback_keys(args: dict[str, Any], expected: str) -> None:
    assert input_preview("some_future_tool", args) == expected


@pytest.mark.parametrize("task_id", [0, -1, 1.5, "3", True, None, [], {"a": 1}, float("nan")])
def test_task_number_must_be_a_positive_integer(task_id: Any) -> None:
    assert input_preview("check_subagent", {"task_id": task_id}) == ""
    assert input_preview("delete_scheduled_task", {"task_id": task_id}) == ""


@pytest.mark.parametrize("args", [None, "{", 3, [], {"command": 3}, {"command": None}, {"command": "  "}])
def test_malformed_arguments_give_empty_preview(args: Any) -> None:
    assert input_preview("shell", args) == ""


@pytest.mark.parametrize("name", ["send_wechat_image", "create_scheduled_task", "send_wechat_file"])
@pytest.mark.parametrize("value", [1, None, ["a"], {"x": 1}, ""])
def test_malformed_values_in_seed_cases_give_empty_preview(name: str, value: Any) -> None:
    args = {"image": value, "name": value, "file_name": value, "file": value}
    assert input_preview(name, args) == ""


def test_task_word_comes_from_the_catalog() -> None:
    assert input_preview_text("cancel_subagent", {"task_id": 2}) == Msg("tool.preview.task", {"id": 2})
    assert input_preview("cancel_subagent", {"task_id": 2}, "en_us") == "task #2"
    assert input_preview("cancel_subagent", {"task_id": 2}, "de_de") == "Aufgabe #2"


def test_preview_is_never_a_loading_placeholder() -> None:
    for name in ("shell", "read_file", "check_subagent", "unknown"):
        assert input_preview(name, {}) == ""

"""Golden one-line summaries of every tool (seed 000 §3.3 failure rules, D9), rendered in zh_cn and en_us."""

from __future__ import annotations

from typing import Any

import pytest

from feishu_progress.domain import ToolCall
from feishu_progress.i18n import translate
from feishu_progress.tools.call_line import line_for_call
from feishu_progress.tools.line_model import LineState

LONG_ERROR = (
    "这是一个非常长的错误信息,用来验证失败原因只保留前四十个字符,后面的内容都不会出现在工具行里面了对吧"
)
IMAGES = {
    "images": [{"image_url": "/uploads/a.png", "image_path": "/data/a.png"}] * 3,
    "model": "m",
    "size": "1",
}
SUBAGENT = {"taskId": 7, "agentType": "research", "status": "RUNNING", "totalRounds": 2}

# (tool name, args, result, zh_cn line, state)
GOLDEN: list[tuple[str, dict[str, Any], Any, str, LineState]] = [
    # files
    ("read_file", {"path": "a.py"}, {"content": "1\n2\n3\n"}, "读取 a.py (3 行)", LineState.OK),
    ("read_file", {"path": "a.py"}, {"total_lines": 120, "content": "x"}, "读取 a.py (120 行)", LineState.OK),
    (
        "read_file",
        {"path": "cat.png"},
        {"media_type": "image", "data_uri": "x"},
        "读取 cat.png (图片)",
        LineState.OK,
    ),
    (
        "read_file",
        {"path": "a.py"},
        {"error": "文件不存在"},
        "读取 a.py (失败: 文件不存在)",
        LineState.FAILED,
    ),
    ("write_file", {"path": "b.py", "content": "a\nb"}, {"ok": True}, "写入 b.py (2 行)", LineState.OK),
    (
        "write_file",
        {"path": "/etc/x"},
        {"error": "权限不足"},
        "写入 /etc/x (失败: 权限不足)",
        LineState.FAILED,
    ),
    ("edit_file", {"path": "c.py"}, {"replacements": 2}, "编辑 c.py (2 处修改)", LineState.OK),
    (
        "edit_file",
        {"path": "c.py"},
        {"error": "old_string 未找到"},
        "编辑 c.py (失败: old_string 未找到)",
        LineState.FAILED,
    ),
    (
        "glob_search",
        {"pattern": "**/*.py"},
        {"files": ["a", "b"]},
        "查找文件 **/*.py (2 个文件)",
        LineState.OK,
    ),
    (
        "glob_search",
        {"pattern": "**/*.py"},
        {"error": "目录不存在"},
        "查找文件 **/*.py (失败: 目录不存在)",
        LineState.FAILED,
    ),
    ("grep_search", {"pattern": "TODO"}, {"matches": [1, 2, 3]}, "搜索代码 TODO (3 处匹配)", LineState.OK),
    ("grep_search", {"pattern": "("}, {"error": "正则无效"}, "搜索代码 ( (失败: 正则无效)", LineState.FAILED),
    # shell: exec and write_stdin
    ("shell", {"command": "ls -la"}, {"exit_code": 0, "stdout": "x"}, "执行 ls -la (exit 0)", LineState.OK),
    ("shell", {"command": "false"}, {"exit_code": 2}, "执行 false (exit 2)", LineState.FAILED),
    ("shell", {"command": "sleep 99"}, {"completed": False}, "执行 sleep 99 (未完成/超时)", LineState.FAILED),
    (
        "shell",
        {"command": "rm -rf /"},
        {"error": "命令被拒绝执行策略"},
        "执行 rm -rf / (失败: 命令被拒绝执行策略)",
        LineState.FAILED,
    ),
    (
        "shell",
        {"command": "npm run dev"},
        {"async": True, "session_id": "s"},
        "执行 npm run dev (后台运行)",
        LineState.OK,
    ),
    ("shell", {"command": "echo"}, {"stdout": ""}, "执行 echo", LineState.OK),
    ("shell", {"session_id": "s1", "input": "yes"}, {"output": "ok"}, "写入 stdin: yes", LineState.OK),
    (
        "shell",
        {"action": "write_stdin", "input": "q"},
        {"exit_code": 0},
        "写入 stdin: q (exit 0)",
        LineState.OK,
    ),
    (
        "shell",
        {"session_id": "s1", "input": "y"},
        {"completed": False},
        "写入 stdin: y (未完成/超时)",
        LineState.FAILED,
    ),
    (
        "shell",
        {"session_id": "s1", "input": "y"},
        {"error": "会话不存在"},
        "写入 stdin: y (失败: 会话不存在)",
        LineState.FAILED,
    ),
    # web
    (
        "web_search",
        {"query": "飞书卡片限流"},
        {"results": [{}] * 8},
        "搜索 飞书卡片限流 (8 条结果)",
        LineState.OK,
    ),
    (
        "web_search",
        {"query": "飞书卡片限流"},
        {"error": "无可用搜索凭据"},
        "搜索 飞书卡片限流 (失败: 无可用搜索凭据)",
        LineState.FAILED,
    ),
    (
        "open_web_page",
        {"url": "https://example.com/xx"},
        {"content": "..."},
        "打开网页 example.com/xx",
        LineState.OK,
    ),
    (
        "open_web_page",
        {"url": "https://example.com/xx"},
        {"error": "页面加载超时"},
        "打开网页 example.com/xx (失败: 页面加载超时)",
        LineState.FAILED,
    ),
    (
        "http_call",
        {"method": "get", "url": "https://api.x.io/v1"},
        {"status": 200},
        "请求 GET api.x.io/v1 (HTTP 200)",
        LineState.OK,
    ),
    ("http_call", {"url": "https://api.x.io"}, {"status": 404}, "请求 api.x.io (HTTP 404)", LineState.FAILED),
    (
        "http_call",
        {"url": "http://10.0.0.1"},
        {"error": "禁止访问私网地址"},
        "请求 10.0.0.1 (失败: 禁止访问私网地址)",
        LineState.FAILED,
    ),
    # images
    ("generate_image", {"prompt": "一只猫"}, IMAGES, "生成图片: 一只猫 (3 张)", LineState.OK),
    (
        "generate_image",
        {"prompt": "一只猫"},
        {"error": "内容违规"},
        "生成图片: 一只猫 (失败: 内容违规)",
        LineState.FAILED,
    ),
    ("edit_image", {"prompt": "换成蓝色"}, IMAGES, "编辑图片: 换成蓝色 (3 张)", LineState.OK),
    ("edit_image", {"prompt": "换成蓝色"}, {"success": False}, "编辑图片: 换成蓝色 (失败)", LineState.FAILED),
    # senders
    (
        "send_wechat_image",
        {"image": "/tmp/a.png"},
        {"success": True},
        "发送微信图片 /tmp/a.png",
        LineState.OK,
    ),
    (
        "send_wechat_image",
        {"image": "/tmp/a.png"},
        {"error": "未绑定微信"},
        "发送微信图片 /tmp/a.png (失败: 未绑定微信)",
        LineState.FAILED,
    ),
    (
        "send_wechat_file",
        {"file_name": "报告.pdf", "file": "/x"},
        {"success": True},
        "发送微信文件 报告.pdf",
        LineState.OK,
    ),
    (
        "send_wechat_file",
        {"file": "/x/y.zip"},
        {"success": False},
        "发送微信文件 /x/y.zip (失败)",
        LineState.FAILED,
    ),
    ("dingtalk_send_message", {"text": "hi"}, {"success": True}, "钉钉 send_message", LineState.OK),
    (
        "dingtalk_send_message",
        {},
        {"success": False, "error": "机器人未配置"},
        "钉钉 send_message (失败: 机器人未配置)",
        LineState.FAILED,
    ),
    ("dingtalk_send_message", {}, {"success": False}, "钉钉 send_message (失败)", LineState.FAILED),
    ("feishu_send_file", {"file_name": "a.txt"}, {"message_id": "om"}, "飞书 send_file: a.txt", LineState.OK),
    (
        "feishu_search_docs",
        {"query": "周报"},
        {"error": "token 过期"},
        "飞书 search_docs: 周报 (失败: token 过期)",
        LineState.FAILED,
    ),
    # MCP
    (
        "mcp_call",
        {"server": "github", "tool": "create_issue"},
        {"id": 1},
        "调用 MCP github.create_issue",
        LineState.OK,
    ),
    (
        "mcp_call",
        {"server": "github", "tool": "x"},
        {"error": "server 未连接"},
        "调用 MCP github.x (失败: server 未连接)",
        LineState.FAILED,
    ),
    (
        "mcp_describe",
        {"server": "github"},
        {"tools": [1, 2]},
        "查看 MCP 工具 github (2 个工具)",
        LineState.OK,
    ),
    (
        "mcp_describe",
        {"server": "github"},
        {"success": False},
        "查看 MCP 工具 github (失败)",
        LineState.FAILED,
    ),
    # scheduled tasks
    (
        "create_scheduled_task",
        {"name": "早报"},
        {"task_id": 12},
        "创建定时任务 早报 (任务 #12)",
        LineState.OK,
    ),
    (
        "create_scheduled_task",
        {"name": "每天早上九点提醒我喝水并汇报昨日的全部进度"},
        {"error": "cron 表达式无法解析"},
        "创建定时任务 每天早上九点提醒我喝水并汇报昨日的全部进 (失败: cron 表达式无法解析)",
        LineState.FAILED,
    ),
    (
        "update_scheduled_task",
        {"task_id": 3, "cron": "0 9 * * *"},
        {"ok": True},
        "更新定时任务 任务 #3",
        LineState.OK,
    ),
    (
        "update_scheduled_task",
        {"task_id": 3},
        {"error": "任务不存在"},
        "更新定时任务 (失败: 任务不存在)",
        LineState.FAILED,
    ),
    ("delete_scheduled_task", {"task_id": 3}, {"deleted": True}, "删除定时任务 任务 #3", LineState.OK),
    (
        "delete_scheduled_task",
        {"task_id": 3},
        {"error": "任务不存在"},
        "删除定时任务 (失败: 任务不存在)",
        LineState.FAILED,
    ),
    ("list_scheduled_tasks", {}, {"tasks": [{}, {}]}, "查询定时任务 (2 个任务)", LineState.OK),
    (
        "list_scheduled_tasks",
        {},
        {"error": "无法获取当前用户信息"},
        "查询定时任务 (失败: 无法获取当前用户信息)",
        LineState.FAILED,
    ),
    # subagents
    (
        "spawn_subagent",
        {"task": "调研卡片限流"},
        {"taskId": 7},
        "启动子代理: 调研卡片限流 (任务 #7)",
        LineState.OK,
    ),
    (
        "spawn_subagent",
        {"task": "调研"},
        {"error": "并发已满"},
        "启动子代理: 调研 (失败: 并发已满)",
        LineState.FAILED,
    ),
    (
        "subagent_followup",
        {"child_session_id": 9, "task": "补充数据"},
        {"ok": True},
        "追问子代理: 补充数据",
        LineState.OK,
    ),
    (
        "subagent_followup",
        {"task": "补充"},
        {"error": "子会话已结束"},
        "追问子代理: 补充 (失败: 子会话已结束)",
        LineState.FAILED,
    ),
    (
        "check_subagent",
        {},
        {"background_subagents": [SUBAGENT, SUBAGENT]},
        "查看子代理 (2 个任务)",
        LineState.OK,
    ),
    # Seed 000 step 5: the single-object answer is one task, like a list of one (its status is in the row).
    ("check_subagent", {"task_id": 7}, SUBAGENT, "查看子代理 任务 #7 (1 个任务)", LineState.OK),
    ("check_subagent", {}, {"background_subagents": []}, "查看子代理 (0 个任务)", LineState.OK),
    (
        "check_subagent",
        {"task_id": 8},
        {"error": "任务不存在"},
        "查看子代理 任务 #8 (失败: 任务不存在)",
        LineState.FAILED,
    ),
    (
        "wait_subagents",
        {},
        {"completed": 2, "all_completed": True, "results": []},
        "等待后台子代理 (完成 2 个 · 全部完成)",
        LineState.OK,
    ),
    (
        "wait_subagents",
        {"timeout_seconds": 30},
        {"completed": 1, "timed_out": True, "background_subagents": [SUBAGENT]},
        "等待后台子代理 (完成 1 个 · 已超时)",
        LineState.OK,
    ),
    (
        "wait_subagents",
        {},
        {"error": "没有后台子代理"},
        "等待后台子代理 (失败: 没有后台子代理)",
        LineState.FAILED,
    ),
    ("cancel_subagent", {"task_id": 7}, {"cancelled": True}, "取消子代理 任务 #7", LineState.OK),
    (
        "cancel_subagent",
        {"task_id": 7},
        {"error": "任务已结束"},
        "取消子代理 任务 #7 (失败: 任务已结束)",
        LineState.FAILED,
    ),
    # questions
    (
        "ask_user_questions",
        {"questions": [{}]},
        {"answers": [{"question": "选哪个?", "selectedLabels": ["A"], "customInput": None}]},
        "向用户提问 (1 组问答)",
        LineState.OK,
    ),
    # Seed 000 step 4: the count is of the pairs shown; an answer with a blank question is not one.
    (
        "ask_user_questions",
        {},
        {
            "answers": [
                {"question": "选哪个?", "selectedLabels": ["A"], "customInput": None},
                {"question": "  ", "selectedLabels": ["B"], "customInput": None},
                {"question": "为什么?", "selectedLabels": [], "customInput": "因为"},
            ]
        },
        "向用户提问 (2 组问答)",
        LineState.OK,
    ),
    ("ask_user_questions", {}, {"error": "用户取消"}, "向用户提问 (失败: 用户取消)", LineState.FAILED),
    # unknown tools
    (
        "page_screenshot",
        {"url": "https://a.b/c"},
        {"media_type": "image"},
        "调用 page_screenshot: a.b/c",
        LineState.OK,
    ),
    (
        "page_screenshot",
        {},
        {"error": "浏览器未启动"},
        "调用 page_screenshot (失败: 浏览器未启动)",
        LineState.FAILED,
    ),
]


def _line(name: str, args: Any, result: Any, finished: bool = True) -> Any:
    return line_for_call(ToolCall(call_id="c1", name=name, args=args, result=result, finished=finished))


@pytest.mark.parametrize(("name", "args", "result", "expected", "state"), GOLDEN, ids=[g[3] for g in GOLDEN])
def test_golden_line_zh_cn(name: str, args: Any, result: Any, expected: str, state: LineState) -> None:
    line = _line(name, args, result)
    assert translate(line.summary, "zh_cn") == expected
    assert line.state is state


def test_every_seed_tool_has_a_success_and_a_failure_golden() -> None:
    seed_tools = {
        "read_file", "write_file", "edit_file", "glob_search", "grep_search", "shell", "web_search",
        "open_web_page", "http_call", "generate_image", "edit_image", "send_wechat_image", "send_wechat_file",
        "dingtalk_send_message", "mcp_call", "mcp_describe", "create_scheduled_task", "update_scheduled_task",
        "delete_scheduled_task", "list_scheduled_tasks", "spawn_subagent", "subagent_followup",
        "check_subagent", "wait_subagents", "cancel_subagent", "ask_user_questions",
    }  # fmt: skip
    ok = {g[0] for g in GOLDEN if g[4] is LineState.OK}
    failed = {g[0] for g in GOLDEN if g[4] is LineState.FAILED}
    assert seed_tools <= ok
    assert seed_tools <= failed
    for prefix in ("feishu_", "dingtalk_"):
        assert any(name.startswith(prefix) for name in ok)
        assert any(name.startswith(prefix) for name in failed)


@pytest.mark.parametrize(
    ("name", "args", "result", "expected"),
    [
        ("read_file", {"path": "a.py"}, {"content": "x"}, "Read a.py (1 line)"),
        ("web_search", {"query": "rate limit"}, {"results": [1, 2]}, "Search rate limit (2 results)"),
        ("web_search", {"query": "q"}, {"error": "no credentials"}, "Search q (failed: no credentials)"),
        ("shell", {"command": "make"}, {"completed": False}, "Run make (not finished/timed out)"),
        ("generate_image", {"prompt": "a cat"}, IMAGES, "Generate image: a cat (3 images)"),
        ("update_scheduled_task", {"task_id": 3}, {"success": False}, "Update scheduled task (failed)"),
        (
            "wait_subagents",
            {},
            {"completed": 3, "timed_out": True},
            "Wait for background subagents (3 done · timed out)",
        ),
    ],
)
def test_golden_line_en_us(name: str, args: Any, result: Any, expected: str) -> None:
    assert translate(_line(name, args, result).summary, "en_us") == expected


def test_reason_is_the_first_40_characters_of_error() -> None:
    text = translate(_line("web_search", {"query": "q"}, {"error": LONG_ERROR}).summary)
    assert text == f"搜索 q (失败: {LONG_ERROR[:40]})"
    assert LONG_ERROR[:41] not in text


def test_truncated_reason_keeps_the_whole_error_in_raw_result() -> None:
    line = _line("web_search", {"query": "q"}, {"error": LONG_ERROR})
    assert line.raw_result is not None
    assert LONG_ERROR in line.raw_result
    short = _line("web_search", {"query": "q"}, {"error": "短"})
    assert short.raw_result is None


def test_multiline_error_becomes_one_line_reason() -> None:
    text = translate(_line("mcp_call", {"server": "s"}, {"error": "line one\n  line two"}).summary)
    assert text == "调用 MCP s (失败: line one line two)"


@pytest.mark.parametrize(
    "result",
    [{"error": "boom", "results": []}, {"error": "boom", "count": 0}, '{"error": "boom", "results": []}'],
)
def test_web_search_failure_never_says_zero_results(result: Any) -> None:
    text = translate(_line("web_search", {"query": "q"}, result).summary)
    assert "(0 条结果)" not in text
    assert text == "搜索 q (失败: boom)"


def test_genuinely_empty_search_says_zero_results() -> None:
    assert translate(_line("web_search", {"query": "q"}, {"results": []}).summary) == "搜索 q (0 条结果)"


@pytest.mark.parametrize("result", [{"error": "denied"}, {"stdout": "x"}, {}, None, "plain output"])
def test_shell_never_shows_exit_minus_one_for_a_missing_exit_code(result: Any) -> None:
    assert "exit -1" not in translate(_line("shell", {"command": "x"}, result).summary)


def test_error_beats_every_success_statistic() -> None:
    result = {"error": "策略拒绝", "exit_code": 0, "completed": False, "async": True}
    assert translate(_line("shell", {"command": "x"}, result).summary) == "执行 x (失败: 策略拒绝)"


@pytest.mark.parametrize("error", ["", "   ", None, 0, [], {}])
def test_blank_or_non_text_error_is_not_a_failure(error: Any) -> None:
    line = _line("web_search", {"query": "q"}, {"error": error, "results": [1]})
    assert line.state is LineState.OK
    assert translate(line.summary) == "搜索 q (1 条结果)"


def test_error_object_with_message_is_a_reason() -> None:
    text = translate(_line("http_call", {"url": "a.io"}, {"error": {"message": "超时", "code": 1}}).summary)
    assert text == "请求 a.io (失败: 超时)"


def test_failure_never_renders_empty_parentheses() -> None:
    for name, args, result, _, _ in GOLDEN:
        for locale in ("zh_cn", "en_us", "fr_fr", "tr"):
            text = translate(_line(name, args, result).summary, locale)
            assert "()" not in text
            assert ": )" not in text


def test_json_string_results_are_parsed() -> None:
    text = translate(_line("grep_search", {"pattern": "x"}, '{"matches": [1, 2]}').summary)
    assert text == "搜索代码 x (2 处匹配)"


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("shell", {"command": "ls -la"}, "执行 ls -la"),
        ("shell", {}, "执行"),
        ("read_file", {"path": "a.py"}, "读取 a.py"),
        ("web_search", {"query": "飞书"}, "搜索 飞书"),
        ("generate_image", {"prompt": "一只猫"}, "生成图片: 一只猫"),
        ("wait_subagents", {"timeout_seconds": 30}, "等待后台子代理 (执行中)"),
        ("check_subagent", {"task_id": 4}, "查看子代理 任务 #4"),
        ("create_scheduled_task", {"name": "早报"}, "创建定时任务 早报"),
        ("send_wechat_file", {"file_name": "a.pdf"}, "发送微信文件 a.pdf"),
        ("ask_user_questions", {"questions": [{}, {}]}, "向用户提问 (2 个问题)"),
        ("something_new", {"query": "abc"}, "调用 something_new: abc"),
        ("something_new", None, "调用 something_new"),
    ],
)
def test_running_line_comes_from_the_input_preview(name: str, args: Any, expected: str) -> None:
    line = _line(name, args, None, finished=False)
    assert line.state is LineState.RUNNING
    assert translate(line.summary) == expected
    assert line.view is None
    assert line.raw_result is None


def test_long_command_is_cut_for_the_line() -> None:
    text = translate(_line("shell", {"command": "echo " + "x" * 200}, {"exit_code": 0}).summary)
    assert text.endswith("… (exit 0)")
    assert len(text) < 100


def test_untrusted_text_is_a_param_not_a_template() -> None:
    line = _line("web_search", {"query": "{verb} <at id=all></at>"}, {"error": "{label}"})
    assert translate(line.summary) == "搜索 {verb} <at id=all></at> (失败: {label})"

"""A golden card for every case of the seeds' examples and test tables (UPDATE_GOLDEN=1 rewrites them).

Each card is built through the real builder from the tool call (or model) the seed describes: tools/
parses, cards/ renders, nothing is substituted. Every card carries zh_cn (``content``) and en_us
(``i18n_content``), and each case also names the lines the seed asks for in both languages, read back
from the golden card itself (entities decoded), so a golden regenerated over a departure still fails.

Seed rule → golden: the table below is the record (``CASES``: name, seed rule, card, zh lines, en lines).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.cards.builder import build_progress_card
from feishu_progress.db.engine import Database
from feishu_progress.domain import (
    IMAGE_UPLOADING,
    CardModel,
    PendingApproval,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)
from feishu_progress.subagents.manager import SubagentManager
from tests.fakes import card_model, card_state
from tests.test_cards_seed_golden import matches_golden

GOLDEN = Path(__file__).parent / "golden" / "cards"


def texts(node: Any, locale: str, out: list[str]) -> list[str]:
    """Every text of the card as ``locale`` reads it, in order."""
    if isinstance(node, dict):
        if isinstance(node.get("content"), str):
            out.append(node.get("i18n_content", {}).get(locale, node["content"]))
        for key, value in node.items():
            if key not in ("content", "i18n_content"):
                texts(value, locale, out)
    elif isinstance(node, list):
        for value in node:
            texts(value, locale, out)
    return out


def lines(card: dict[str, Any], locale: str) -> list[str]:
    """The card's lines in ``locale``, entities decoded and list bullets dropped."""
    return [
        html.unescape(line).removeprefix("- ")
        for text in texts(card, locale, [])
        for line in text.split("\n")
    ]


def card(*calls: ToolCall, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"session_id": 7, "status": TaskStatus.RUNNING, "round": 2, "tools": calls}
    return build_progress_card(card_model(**{**base, **changes}))


def done(name: str, args: dict[str, Any], result: Any) -> dict[str, Any]:
    return card(ToolCall("c1", name, args, result, finished=True))


def running(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return card(ToolCall("c1", name, args))


@dataclass(frozen=True)
class Case:
    name: str
    rule: str
    build: Callable[[], dict[str, Any]]
    zh: tuple[str, ...]
    en: tuple[str, ...]


LONG_TASK = "每日早报推送给产品团队全体成员并抄送给研发负责人"  # 24 characters: §3.3 keeps 20

# -- seed 000 §3.3: every failure line says why (A class: error before any statistic; B class) ----------
FAILURES = [
    Case(
        "seed_000_fail_shell_exec",
        "000 §3.3 A: shell exec error, not (exit -1)",
        lambda: done("shell", {"command": "rm -rf /"}, {"error": "命令被拒绝执行策略"}),
        ("执行 rm -rf / (失败: 命令被拒绝执行策略)",),
        ("Run rm -rf / (failed: 命令被拒绝执行策略)",),
    ),
    Case(
        "seed_000_fail_shell_write_stdin",
        "000 §3.3 A: write_stdin error",
        lambda: done("shell", {"session_id": "s1", "input": "y\n"}, {"error": "会话不存在"}),
        ("写入 stdin: y (失败: 会话不存在)",),
        ("Write stdin: y (failed: 会话不存在)",),
    ),
    Case(
        "seed_000_shell_incomplete",
        "000 §3.3 shell special: completed false stays (未完成/超时)",
        lambda: done("shell", {"command": "sleep 99"}, {"completed": False}),
        ("执行 sleep 99 (未完成/超时)",),
        ("Run sleep 99 (not finished/timed out)",),
    ),
    Case(
        "seed_000_shell_exit_code",
        "000 §3.3 shell special: exit_code N stays (exit N)",
        lambda: done("shell", {"command": "false"}, {"exit_code": 2}),
        ("执行 false (exit 2)",),
        ("Run false (exit 2)",),
    ),
    Case(
        "seed_000_fail_web_search",
        "000 §3.3 A: web_search error, not (0 条结果)",
        lambda: done("web_search", {"query": "飞书卡片"}, {"error": "无可用搜索凭据", "results": []}),
        ("搜索 飞书卡片 (失败: 无可用搜索凭据)",),
        ("Search 飞书卡片 (failed: 无可用搜索凭据)",),
    ),
    Case(
        "seed_000_fail_open_web_page",
        "000 §3.3 A: open_web_page failure carries the url",
        lambda: done("open_web_page", {"url": "https://example.com/xx"}, {"error": "页面加载超时"}),
        ("打开网页 example.com/xx (失败: 页面加载超时)",),
        ("Open page example.com/xx (failed: 页面加载超时)",),
    ),
    Case(
        "seed_000_fail_create_scheduled_task",
        "000 §3.3 A: create_scheduled_task failure carries the name, cut at 20",
        lambda: done("create_scheduled_task", {"name": LONG_TASK}, {"error": "cron 表达式无法解析"}),
        (f"创建定时任务 {LONG_TASK[:20]} (失败: cron 表达式无法解析)",),
        (f"Create scheduled task {LONG_TASK[:20]} (failed: cron 表达式无法解析)",),
    ),
    Case(
        "seed_000_fail_update_scheduled_task",
        "000 §3.3 A: update_scheduled_task",
        lambda: done("update_scheduled_task", {"task_id": 3}, {"error": "任务不存在"}),
        ("更新定时任务 (失败: 任务不存在)",),
        ("Update scheduled task (failed: 任务不存在)",),
    ),
    Case(
        "seed_000_fail_delete_scheduled_task",
        "000 §3.3 A: delete_scheduled_task",
        lambda: done("delete_scheduled_task", {"task_id": 3}, {"error": "任务不存在"}),
        ("删除定时任务 (失败: 任务不存在)",),
        ("Delete scheduled task (failed: 任务不存在)",),
    ),
    Case(
        "seed_000_fail_list_scheduled_tasks",
        "000 §3.3 A: list_scheduled_tasks",
        lambda: done("list_scheduled_tasks", {}, {"error": "无法获取当前用户信息"}),
        ("查询定时任务 (失败: 无法获取当前用户信息)",),
        ("List scheduled tasks (failed: 无法获取当前用户信息)",),
    ),
    Case(
        "seed_000_fail_generate_image",
        "000 §3.3 B: image failure keeps the prompt",
        lambda: done("generate_image", {"prompt": "一只猫"}, {"error": "模型拒绝了提示词"}),
        ("生成图片: 一只猫 (失败: 模型拒绝了提示词)",),
        ("Generate image: 一只猫 (failed: 模型拒绝了提示词)",),
    ),
    Case(
        "seed_000_fail_send_wechat_file",
        "000 §3.3 B: wechat file failure says why",
        lambda: done("send_wechat_file", {"file_name": "报告.pdf"}, {"error": "文件过大"}),
        ("发送微信文件 报告.pdf (失败: 文件过大)",),
        ("Send WeChat file 报告.pdf (failed: 文件过大)",),
    ),
    Case(
        "seed_000_fail_dingtalk_bare",
        "000 D9 B: success false without error keeps a bare (失败), never empty parentheses",
        lambda: done("dingtalk_send_message", {"content": "hi"}, {"success": False}),
        ("钉钉 send_message (失败)",),
        ("DingTalk send_message (failed)",),
    ),
    Case(
        "seed_000_fail_mcp_call",
        "000 §3.3 B: mcp_call failure says why",
        lambda: done("mcp_call", {"server": "github", "tool": "search"}, {"error": "服务器无响应"}),
        ("调用 MCP github.search (失败: 服务器无响应)",),
        ("Call MCP github.search (failed: 服务器无响应)",),
    ),
    Case(
        "seed_000_fail_reason_cut_40",
        "000 §3.3: the reason is the error's first 40 characters",
        lambda: done("read_file", {"path": "a.py"}, {"error": "权" * 50}),
        ("读取 a.py (失败: " + "权" * 40 + ")",),
        ("Read a.py (failed: " + "权" * 40 + ")",),
    ),
]

# -- seed 000 §3.3 / §5: the success line of every tool (unchanged by the failure work) ----------------
SUCCESS_TABLE = [
    ("read_file", {"path": "a.py"}, {"content": "a\nb\nc\n"}, "读取 a.py (3 行)", "Read a.py (3 lines)"),
    (
        "write_file",
        {"path": "b.py", "content": "x\n"},
        {"ok": True},
        "写入 b.py (1 行)",
        "Write b.py (1 line)",
    ),
    ("edit_file", {"path": "c.py"}, {"replacements": 2}, "编辑 c.py (2 处修改)", "Edit c.py (2 edits)"),
    (
        "glob_search",
        {"pattern": "**/*.py"},
        {"files": ["a", "b", "c"]},
        "查找文件 **/*.py (3 个文件)",
        "Find files **/*.py (3 files)",
    ),
    (
        "grep_search",
        {"pattern": "TODO"},
        {"total_matches": 1},
        "搜索代码 TODO (1 处匹配)",
        "Search code TODO (1 match)",
    ),
    (
        "web_search",
        {"query": "飞书"},
        {"results": [1, 2, 3, 4, 5]},
        "搜索 飞书 (5 条结果)",
        "Search 飞书 (5 results)",
    ),
    (
        "http_call",
        {"url": "https://api.example.com/v1", "method": "GET"},
        {"status": 404},
        "请求 GET api.example.com/v1 (HTTP 404)",
        "Request GET api.example.com/v1 (HTTP 404)",
    ),
    (
        "mcp_describe",
        {"server": "github"},
        {"tools": [1, 2]},
        "查看 MCP 工具 github (2 个工具)",
        "Describe MCP tools github (2 tools)",
    ),
    (
        "create_scheduled_task",
        {"name": "早报"},
        {"task_id": 12},
        "创建定时任务 早报 (任务 #12)",
        "Create scheduled task 早报 (task #12)",
    ),
    ("list_scheduled_tasks", {}, {"tasks": [1]}, "查询定时任务 (1 个任务)", "List scheduled tasks (1 task)"),
    (
        "spawn_subagent",
        {"task": "调研卡片"},
        {"taskId": 7},
        "启动子代理: 调研卡片 (任务 #7)",
        "Start subagent: 调研卡片 (task #7)",
    ),
    (
        "wait_subagents",
        {},
        {"completed": 2, "all_completed": True, "results": []},
        "等待后台子代理 (完成 2 个 · 全部完成)",
        "Wait for background subagents (2 done · all completed)",
    ),
    ("cancel_subagent", {"task_id": 7}, {"cancelled": True}, "取消子代理 任务 #7", "Cancel subagent task #7"),
]


def _success_case(name: str, args: dict[str, Any], result: Any, zh: str, en: str) -> Case:
    return Case(
        f"seed_000_ok_{name}",
        f"000 §3.3: {name}'s success line",
        lambda: done(name, args, result),
        (zh,),
        (en,),
    )


SUCCESS = [_success_case(*row) for row in SUCCESS_TABLE]

# -- seed 000 §3.4: input previews while the call streams; D8 approval titles ----------------------------
PREVIEWS = [
    Case(
        "seed_000_preview_check_subagent",
        "000 §3.4: check_subagent task_id → 任务 #N",
        lambda: running("check_subagent", {"task_id": 12}),
        ("查看子代理 任务 #12",),
        ("Check subagents task #12",),
    ),
    Case(
        "seed_000_preview_update_scheduled_task",
        "000 §3.4: update_scheduled_task without a name → 任务 #<task_id>",
        lambda: running("update_scheduled_task", {"task_id": 5}),
        ("更新定时任务 任务 #5",),
        ("Update scheduled task task #5",),
    ),
    Case(
        "seed_000_preview_send_wechat_file",
        "000 §3.4: send_wechat_file shows file_name before file",
        lambda: running("send_wechat_file", {"file": "/tmp/x/报告.pdf", "file_name": "报告.pdf"}),
        ("发送微信文件 报告.pdf",),
        ("Send WeChat file 报告.pdf",),
    ),
    Case(
        "seed_000_preview_cancel_subagent",
        "000 §3.4: cancel_subagent task_id → 任务 #N",
        lambda: running("cancel_subagent", {"task_id": 7}),
        ("取消子代理 任务 #7",),
        ("Cancel subagent task #7",),
    ),
    Case(
        "seed_000_preview_check_subagent_all",
        "000 §3.4: check_subagent without task_id (all of them) has no preview",
        lambda: running("check_subagent", {}),
        ("查看子代理",),
        ("Check subagents",),
    ),
    Case(
        "seed_000_preview_create_scheduled_task",
        "000 §3.4: create_scheduled_task name cut to 30 characters",
        lambda: running("create_scheduled_task", {"name": "长" * 40}),
        ("创建定时任务 " + "长" * 30,),
        ("Create scheduled task " + "长" * 30,),
    ),
    Case(
        "seed_000_preview_delete_scheduled_task",
        "000 §3.4: delete_scheduled_task → 任务 #<task_id>",
        lambda: running("delete_scheduled_task", {"task_id": 4}),
        ("删除定时任务 任务 #4",),
        ("Delete scheduled task task #4",),
    ),
    Case(
        "seed_000_preview_subagent_followup",
        "000 §3.2 erratum 1: subagent_followup's task through the generic fallback",
        lambda: running("subagent_followup", {"child_session_id": 3, "task": "补充数据"}),
        ("追问子代理: 补充数据",),
        ("Follow up with subagent: 补充数据",),
    ),
    Case(
        "seed_000_approval_titles",
        "000 D8: shell static title, mcp:<server> → MCP <server> 待审批, unknown → 操作待审批; "
        "a runtime that can keep the rule offers 始终允许(本任务) (issue 22)",
        lambda: card(
            status=TaskStatus.WAITING,
            pending_approvals=(
                PendingApproval("a1", "shell", "rm -rf build"),
                PendingApproval("a2", "mcp:github", "search", allow_always=True),
                PendingApproval("a3", "mcp:", ""),
            ),
        ),
        ("**命令执行待审批**", "**MCP github 待审批**", "**操作待审批**", "始终允许(本任务)"),
        (
            "**Command awaiting approval**",
            "**MCP github awaiting approval**",
            "**Action awaiting approval**",
            "Always allow (this task)",
        ),
    ),
]

# -- seed 000 goals 1, 3, 4: the rich views -------------------------------------------------------------
TWELVE = {
    "images": [
        {"image_url": f"/u/{i}.png", "image_path": f"/p/{i}.png", "size_bytes": 2048, "mime": "image/png"}
        for i in range(12)
    ],
    "model": "gpt-image-1",
    "size": "1024x1024",
}
SUBAGENT = {
    "taskId": 12,
    "childSessionId": 90,
    "agentType": "explorer",
    "status": "RUNNING",
    "totalRounds": 3,
    "totalToolCalls": 5,
    "totalPromptTokens": 1200,
    "totalCompletionTokens": 300,
    "recentOutput": "正在读取 progress-card.ts",
}
VIEWS = [
    Case(
        "seed_000_image_grid_twelve",
        "000 D1: at most 9 images, 共 N 张,其余 N-9 张略",
        lambda: card(
            ToolCall("c1", "generate_image", {"prompt": "猫"}, TWELVE, finished=True),
            image_keys={f"/p/{i}.png": f"img_v3_{i}" for i in range(12)},
        ),
        ("共 12 张,其余 3 张略", "12 张图 · gpt-image-1 · 1024x1024"),
        ("12 in total, 3 more not shown", "12 images · gpt-image-1 · 1024x1024"),
    ),
    Case(
        "seed_000_image_uploading",
        "000 D5: an upload in flight is on its way, not 图片不可达",
        lambda: card(
            ToolCall(
                "c1", "generate_image", {"prompt": "猫"}, {"images": TWELVE["images"][:1]}, finished=True
            ),
            image_keys={"/p/0.png": IMAGE_UPLOADING},
        ),
        ("1. 2 KB · PNG 图片上传中",),
        ("1. 2 KB · PNG Image on its way",),
    ),
    Case(
        "seed_000_ask_answers",
        "000 goal 3: question, chosen label tags, custom input quoted; N 组问答 counts the pairs shown",
        lambda: done(
            "ask_user_questions",
            {},
            {
                "answers": [
                    {"question": "选哪个方案?", "selectedLabels": ["方案 A", "方案 B"], "customInput": None},
                    {"question": " ", "selectedLabels": ["丢弃"], "customInput": None},
                    {"question": "还有补充吗?", "selectedLabels": [], "customInput": "先做 A"},
                ]
            },
        ),
        ("向用户提问 (2 组问答)", "**选哪个方案?**", "> 先做 A"),
        ("Ask the user (2 answers)", "**选哪个方案?**", "> 先做 A"),
    ),
    Case(
        "seed_000_check_subagent_rows",
        "000 goal 4: background_subagents rows (type, status tag, N 轮 / M 次工具 / X+Y tok)",
        lambda: done(
            "check_subagent",
            {},
            {"background_subagents": [SUBAGENT, {**SUBAGENT, "taskId": 13, "status": "FAILED"}]},
        ),
        (
            "查看子代理 (2 个任务)",
            "#12 · explorer · <text_tag color='blue'>运行中</text_tag> · 3 轮 / 5 次工具 / 1200+300 tok",
        ),
        (
            "Check subagents (2 tasks)",
            "#12 · explorer · <text_tag color='blue'>Running</text_tag> · 3 rounds / 5 tool calls"
            " / 1200+300 tok",
        ),
    ),
    Case(
        "seed_000_check_subagent_single",
        "000 step 5: a single check_subagent object is 1 个任务",
        lambda: done("check_subagent", {"task_id": 12}, SUBAGENT),
        ("查看子代理 任务 #12 (1 个任务)",),
        ("Check subagents task #12 (1 task)",),
    ),
    Case(
        "seed_000_wait_subagents_timeout",
        "000 D3: wait_subagents rows only in its timeout branch, with 完成 N 个 · 已超时",
        lambda: done(
            "wait_subagents", {}, {"completed": 1, "timed_out": True, "background_subagents": [SUBAGENT]}
        ),
        ("等待后台子代理 (完成 1 个 · 已超时)",),
        ("Wait for background subagents (1 done · timed out)",),
    ),
]

# -- seed 001: asktool answers -----------------------------------------------------------------------
ASK = {
    "questions": [
        {"question": "优先优化哪部分?", "options": ["列表性能", "工具行视觉"]},
        {"question": "要哪些验收物?", "options": ["demo", "截图", "单测"], "multiSelect": True},
    ]
}


def ask(result: str | None, args: dict[str, Any] = ASK) -> dict[str, Any]:
    return card(ToolCall("c1", "asktool", args, result, finished=True))


ASKTOOL = [
    Case(
        "seed_001_asktool_declined",
        "001 §4.1 rule 4: every answer empty → 已全部拒绝, 未作答 headline",
        lambda: ask("优先优化哪部分?：\n---\n要哪些验收物?："),
        ("提问 · 2 个问题 · 未作答", "已全部拒绝"),
        ("Asked · 2 questions · unanswered",),
    ),
    Case(
        "seed_001_asktool_skipped",
        "001 §4.1 rule 4: one empty answer is skipped, the other answered",
        lambda: ask("优先优化哪部分?：列表性能\n---\n要哪些验收物?："),
        ("提问 · 2 个问题 · 已作答 1 / 2", "✓ 列表性能"),
        ("Asked · 2 questions · answered 1 / 2", "✓ 列表性能"),
    ),
    Case(
        "seed_001_asktool_custom",
        "001 §4.3: an answer that is no option is the custom answer",
        lambda: ask("优先优化哪部分?：都要\n---\n要哪些验收物?：单测"),
        ("✓ 都要", "✎ 输入的其他答案: 都要"),
        ("✓ 都要", "✎ Typed answer: 都要"),
    ),
    Case(
        "seed_001_asktool_multi_select",
        "001 §4.1 rule 4: a multi-select answer is split on 、, every chosen option ticked",
        lambda: ask("优先优化哪部分?：工具行视觉\n---\n要哪些验收物?：demo、截图"),
        ("✓ demo、截图", "☑ **demo**", "☑ **截图**", "☐ 单测"),
        ("✓ demo、截图", "☑ **demo**", "☑ **截图**", "☐ 单测"),
    ),
    Case(
        "seed_001_asktool_plugin_prefixed",
        "001 §4.1 rule 1: plugin:asktool is asktool once the prefix is removed",
        lambda: card(
            ToolCall(
                "c1",
                "plugin:asktool",
                ASK,
                "优先优化哪部分?：列表性能\n---\n要哪些验收物?：单测",
                finished=True,
            )
        ),
        ("提问 · 2 个问题 · 已作答 2 / 2",),
        ("Asked · 2 questions · answered 2 / 2",),
    ),
    Case(
        "seed_001_asktool_link_in_question",
        "001 §6: a question makes no link, image or raw HTML",
        lambda: ask(
            None,
            {"questions": [{"question": "看 [链接](https://example.com) 和 ![x](k) <b>", "options": ["好"]}]},
        ),
        ("**1.** 单选 · 看 [链接](https://example.com) 和 ![x](k) <b>",),
        ("**1.** Single choice · 看 [链接](https://example.com) 和 ![x](k) <b>",),
    ),
    Case(
        "seed_001_asktool_long_text",
        "001 §6: a long question is cut with a visible marker, never silently",
        lambda: ask(None, {"questions": [{"question": "长" * 3000, "options": ["好"]}]}),
        ("提问 · 1 个问题 · 等待回答",),
        ("Asked · 1 question · waiting for an answer",),
    ),
]

# -- seed 002: running subagents -------------------------------------------------------------------------


def running_card(*subagents: SubagentSummary) -> dict[str, Any]:
    return card(content="正文", subagents=subagents)


def sub(
    task_id: int, agent_type: str | None, title: str, status: str = "RUNNING", rnd: int = 0
) -> SubagentSummary:
    return SubagentSummary(task_id, agent_type, title, status, rnd)


UNKNOWN_TYPE = "custom-data-pipeline-validator-for-nightly-reports"  # 50 characters: shown whole
SUBAGENTS = [
    Case(
        "seed_002_no_subagents",
        "002 §2.1 goal 3 / §6.1: no subagents, no section",
        running_card,
        ("正文",),
        ("正文",),
    ),
    Case(
        "seed_002_one_subagent",
        "002 §6.2 step 1: **子代理 · 1 个运行中** and the round",
        lambda: running_card(sub(1, "explorer", "调研飞书卡片进度链路", rnd=2)),
        ("**子代理 · 1 个运行中**", "调研 · 调研飞书卡片进度链路 · 第 2 轮"),
        ("**Subagents · 1 running**", "Research · 调研飞书卡片进度链路 · round 2"),
    ),
    Case(
        "seed_002_five_subagents",
        "002 D3: five are all listed",
        lambda: running_card(*(sub(i, "worker", f"任务 {i}") for i in range(5))),
        ("**子代理 · 5 个运行中**", "开发 · 任务 4"),
        ("**Subagents · 5 running**", "Build · 任务 4"),
    ),
    Case(
        "seed_002_six_subagents",
        "002 D3 / §6.1: six show five and 另有 1 个运行中",
        lambda: running_card(*(sub(i, "reviewer", f"任务 {i}") for i in range(6))),
        ("**子代理 · 6 个运行中**", "审查 · 任务 4", "另有 1 个运行中"),
        ("**Subagents · 6 running**", "Review · 任务 4", "1 more running"),
    ),
    Case(
        "seed_002_recovering",
        "002 §4.2.3 / §6.1: RECOVERING ends with 恢复中",
        lambda: running_card(sub(1, "worker", "实现子代理展示", status="RECOVERING")),
        ("开发 · 实现子代理展示 · 恢复中",),
        ("Build · 实现子代理展示 · recovering",),
    ),
    Case(
        "seed_002_unknown_and_empty_type",
        "002 §4.2.1/§4.2.3: an unknown type raw, an empty one 子代理; only the seed's specials become spaces",
        lambda: running_card(sub(1, UNKNOWN_TYPE, "back\\slash *粗* [链]"), sub(2, None, "无类型")),
        (f"{UNKNOWN_TYPE} · back\\slash 粗 链", "子代理 · 无类型"),
        (f"{UNKNOWN_TYPE} · back\\slash 粗 链", "Subagent · 无类型"),
    ),
    Case(
        "seed_002_terminal",
        "002 §5.5: a terminal card has no section",
        lambda: card(status=TaskStatus.COMPLETED, content="完成", subagents=(sub(1, "explorer", "x"),)),
        ("完成",),
        ("完成",),
    ),
]

CASES = SUCCESS + FAILURES + PREVIEWS + VIEWS + ASKTOOL + SUBAGENTS


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_seed_case_golden(case: Case) -> None:
    built = case.build()
    assert matches_golden(built, case.name)
    for locale, expected in (("zh_cn", case.zh), ("en_us", case.en)):
        shown = lines(built, locale)
        missing = [line for line in expected if line not in shown]
        assert not missing, (locale, missing, shown)


def test_subagent_only_cases_say_no_section_where_the_seed_says_none() -> None:
    for build in (SUBAGENTS[0].build, SUBAGENTS[-1].build):
        assert not any(
            "子代理" in line or "Subagent" in line
            for line in lines(build(), "zh_cn") + lines(build(), "en_us")
        )


def test_long_question_is_cut_with_a_marker() -> None:
    shown = lines(ASKTOOL[-1].build(), "zh_cn")
    assert any(line.startswith("…(已截断 ") for line in shown)
    assert not any("长" * 2000 in line for line in shown)


async def test_seed_002_query_failure_golden(tmp_path: Path) -> None:
    """002 §4.1.2 / §5.1 / §6.1: the running query fails → nothing listed, the card omits the section."""
    broken = Database.open(f"sqlite+aiosqlite:///{tmp_path / 'unmigrated.db'}")  # "no such table"
    try:
        listed = await SubagentManager(broken).list_running(7)
    finally:
        await broken.close()
    state = card_state(status=TaskStatus.RUNNING, round=2, content="正文照常")
    model = CardModel.from_state(
        state,
        session_id=7,
        title="",
        locales=("zh_cn", "en_us"),
        session_detail_url=None,
        started_at=0.0,
        now=0.0,
        subagents=tuple(listed),
    )
    built = build_progress_card(model)
    assert matches_golden(built, "seed_002_query_failure")
    assert "正文照常" in lines(built, "zh_cn")
    assert not any("子代理" in line for line in lines(built, "zh_cn"))
    assert not any("Subagent" in line for line in lines(built, "en_us"))


def test_the_link_in_a_question_is_defused_in_the_golden() -> None:
    """Decoded lines read the same either way; the raw markdown must hold no live ``](https``."""
    raw = json.dumps(ASKTOOL[5].build(), ensure_ascii=False)
    assert "&#93;(https://example.com)" in raw and "](https" not in raw and "<b>" not in raw

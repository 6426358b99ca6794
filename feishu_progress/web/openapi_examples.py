"""Examples for the OpenAPI document: real payloads (the demo's events, the sandbox's ids).

tests/test_openapi.py validates every one against the schema it illustrates and parses every request
example with the pydantic model the service validates with, so an example cannot go stale either.
"""

from __future__ import annotations

from typing import Any

# One example per event type (keyed by ``type``); the test checks that no type lacks one.
EVENT_EXAMPLES: dict[str, dict[str, Any]] = {
    "status": {"type": "status", "status": "RUNNING", "round": 1},
    "content": {"type": "content", "text": "已按回答优先处理**子代理展示**;限流部分由子代理并行排查。"},
    "content_delta": {"type": "content_delta", "text": "我先梳理一下**进度卡**的更新链路,"},
    "tool_started": {
        "type": "tool_started",
        "call_id": "c3",
        "name": "shell",
        "args": {"command": "pytest -q tests/"},
    },
    "tool_args": {"type": "tool_args", "call_id": "c4", "args": {"query": "飞书卡片 限流 230020"}},
    "tool_finished": {
        "type": "tool_finished",
        "call_id": "c3",
        "result": {"exit_code": 2, "stdout": "2 failed, 40 passed"},
    },
    "round_finished": {"type": "round_finished", "round": 1},
    "subagent_started": {
        "type": "subagent_started",
        "task_id": 11,
        "child_session_id": 9001,
        "agent_type": "explorer",
        "title": "后台子代理(explorer): 排查卡片进度链路",
        "invocation_type": "BACKGROUND",
    },
    "subagent_round": {"type": "subagent_round", "task_id": 11, "round": 2},
    "subagent_status": {"type": "subagent_status", "task_id": 12, "status": "RECOVERING"},
    "subagent_finished": {
        "type": "subagent_finished",
        "task_id": 11,
        "status": "COMPLETED",
        "total_rounds": 3,
    },
    "ask": {
        "type": "ask",
        "ask_id": "ask-1",
        "questions": [
            {"question": "先优化哪一部分?", "options": ["卡片限流", "子代理展示", "工具摘要"]},
            {
                "question": "验收时想看到什么?",
                "options": [{"label": "本地 demo", "description": "feishu-progress demo"}, "截图对比"],
                "multiSelect": True,
            },
        ],
    },
    "approval": {
        "type": "approval",
        "approval_id": "ap-1",
        "tool_name": "mcp__github__create_pull_request",
        "summary": "在 acme/progress 上创建 PR: 修复进度卡限流",
        "allow_always": True,
    },
    "finished": {
        "type": "finished",
        "status": "COMPLETED",
        "content": "限流已修复:进度卡每条消息 250 ms 内至多更新一次。",
    },
}

CREATE_TASK_EXAMPLES: dict[str, dict[str, Any]] = {
    "to_a_chat": {
        "summary": "A card in a group chat",
        "value": {
            "receive_id": "oc_demo_chat",
            "receive_id_type": "chat_id",
            "requester_open_id": "ou_alice",
            "title": "调研飞书卡片限流并修复进度卡",
        },
    },
    "as_a_reply": {
        "summary": "A reply to the user's message, with the agent's own session id, in English",
        "value": {
            "session_id": 42,
            "receive_id": "ou_alice",
            "receive_id_type": "open_id",
            "requester_open_id": "ou_alice",
            "title": "Fix the progress card's rate limit",
            "reply_to_message_id": "om_dc13264520392913993dd051dba21dcf",
            "locale": "en_us",
        },
    },
}


def _batch(summary: str, *types: str) -> dict[str, Any]:
    return {"summary": summary, "value": {"events": [EVENT_EXAMPLES[kind] for kind in types]}}


EVENT_BATCH_EXAMPLES: dict[str, dict[str, Any]] = {
    "round": _batch(
        "A round starts: text streams in, a tool runs, a subagent starts",
        "status",
        "content_delta",
        "tool_started",
        "tool_finished",
        "subagent_started",
    ),
    "ask": _batch("The agent asks the user two questions (the card waits for the answers)", "ask"),
    "approval": _batch("A tool call waits for the user's approval", "approval"),
    "finish": _batch("The task ends", "subagent_finished", "finished"),
}

TASK_CREATED_EXAMPLE = {"session_id": 1, "message_id": "om_sandbox_000001"}
EVENTS_ACCEPTED_EXAMPLE = {"accepted": 5}
TASK_VIEW_EXAMPLE = {
    "session_id": 1,
    "status": "RUNNING",
    "round": 1,
    "message_id": "om_sandbox_000001",
    "disliked": False,
    "stop_reason": None,
    "app": "default",
    "card": {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": "正在处理 · 第 1 轮"}},
        "header": {
            "title": {"tag": "plain_text", "content": "调研飞书卡片限流并修复进度卡"},
            "template": "blue",
            "text_tag_list": [
                {"tag": "text_tag", "text": {"tag": "plain_text", "content": "正在处理"}, "color": "blue"}
            ],
        },
        "body": {"elements": [{"tag": "markdown", "content": "状态:正在处理 · 第 1 轮 · 已用时 12 秒"}]},
    },
}
ACTIONS_EXAMPLE = {
    "actions": [
        {
            "cursor": 7,
            "kind": "answers",
            "operator_open_id": "ou_alice",
            "payload": {
                "ask_id": "ask-1",
                "answers": [
                    {"question": "先优化哪一部分?", "selected_labels": ["子代理展示"], "custom_input": ""},
                    {
                        "question": "验收时想看到什么?",
                        "selected_labels": ["本地 demo"],
                        "custom_input": "再加一份指标截图",
                    },
                ],
            },
            "created_at": "2026-05-28T09:15:02.318000Z",
        },
        {
            "cursor": 8,
            "kind": "approval",
            "operator_open_id": "ou_alice",
            "payload": {
                "approval_id": "ap-1",
                "tool_name": "mcp__github__create_pull_request",
                "approved": True,
                "always": True,
            },
            "created_at": "2026-05-28T09:15:40.112000Z",
        },
        {
            "cursor": 9,
            "kind": "cancel",
            "operator_open_id": "ou_alice",
            "payload": {},
            "created_at": "2026-05-28T09:16:40.007000Z",
        },
    ],
    "cursor": 9,
}
NO_ACTIONS_EXAMPLE = {"actions": [], "cursor": 9}
IMAGE_UPLOADED_EXAMPLE = {
    "image_ref": "fpimg:5d41402abc4b2a76b9719d911017c592",
    "image_key": "img_v3_sandbox_000001",
    "mime": "image/png",
    "bytes": 2048,
}

# (name, error code, message, extra fields) for the error bodies each status shows.
ErrorExample = tuple[str, str, str, dict[str, Any]]
UNAUTHORIZED: ErrorExample = (
    "unauthorized",
    "unauthorized",
    "a valid 'Authorization: Bearer <FP_API__TOKEN>' header is required",
    {},
)
UNKNOWN_TASK: ErrorExample = ("unknown_task", "unknown_task", "no task 42", {})
INVALID_JSON: ErrorExample = ("invalid_json", "invalid_json", "the body is not valid JSON", {})
TOO_LARGE: ErrorExample = ("body_too_large", "body_too_large", "the body is over 8388608 bytes", {})
SLOW_BODY: ErrorExample = ("body_timeout", "body_timeout", "the body did not arrive within 10 s", {})
NOT_JSON: ErrorExample = ("unsupported_media_type", "unsupported_media_type", "send application/json", {})
UNAVAILABLE: ErrorExample = (
    "unavailable",
    "unavailable",
    "Feishu or the database did not answer; retry later",
    {"retry_after": 1},
)
FIRST_CARD_FAILED: ErrorExample = (
    "first_card_failed",
    "unavailable",
    "the first card could not be sent: FeishuAPIError",
    {"retry_after": 2},
)

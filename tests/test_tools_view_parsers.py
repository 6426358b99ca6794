"""Rich-view parsers (seed 000 goals 1, 3, 4; D1, D3) and the view texts cards/ renders."""

from __future__ import annotations

import json
from typing import Any

import pytest

from feishu_progress.i18n import translate
from feishu_progress.tools.view_labels import (
    format_image_bytes,
    image_footer,
    image_hidden,
    mime_tag,
    subagent_stats,
    subagent_status_text,
    wait_summary_msg,
)
from feishu_progress.tools.view_models import ImageItem, StatusKind, WaitSummary
from feishu_progress.tools.view_parsers import parse_ask_answers, parse_image_gen, parse_subagent_rows


def _image(n: int) -> dict[str, Any]:
    return {
        "image_url": f"/uploads/{n}.png",
        "image_path": f"/data/{n}.png",
        "size_bytes": 2048,
        "source": "api",
        "mime": "image/png",
    }


def test_image_gen_keeps_every_item_and_raw_fields() -> None:
    result = {
        "images": [_image(n) for n in range(12)],
        "model": "gpt-image-1",
        "size": "1024x1024",
        "prompt": "猫",
    }
    view = parse_image_gen(result)
    assert view is not None
    assert len(view.items) == 12
    assert view.items[0] == ImageItem(
        url="/uploads/0.png", path="/data/0.png", size_bytes=2048, mime="image/png"
    )
    assert (view.prompt, view.model, view.size) == ("猫", "gpt-image-1", "1024x1024")
    assert translate(image_hidden(view) or "") == "共 12 张,其余 3 张略"
    assert translate(image_footer(view)) == "12 张图 · gpt-image-1 · 1024x1024"


def test_image_gen_from_json_string_and_path_only_later_items() -> None:
    result = json.dumps({"images": [{"image_url": "u"}, {"image_path": "/p.png"}, "junk", {}]})
    view = parse_image_gen(result, fallback_prompt="args prompt")
    assert view is not None
    assert [(i.url, i.path) for i in view.items] == [("u", None), (None, "/p.png")]
    assert view.prompt == "args prompt"
    assert image_hidden(view) is None
    assert translate(image_footer(view)) == "2 张图"


@pytest.mark.parametrize(
    "result",
    [
        None,
        "not json",
        {"images": []},
        {"images": "x"},
        {"images": [{"image_url": 3}]},
        {"images": ["a.png"]},
        {"images": [{"other": 1}, _image(1)]},  # the first item decides
        {"images": [{"image_path": "/p.png"}, _image(1)]},  # seed 000 D7: a string image_url first
        {"images": [{"image_url": ""}]},  # nothing to show
        [_image(1)],
    ],
)
def test_image_gen_unrecognised_shapes(result: Any) -> None:
    assert parse_image_gen(result) is None


@pytest.mark.parametrize("size", [-1, "big", True, None, float("inf"), float("-inf"), float("nan")])
def test_image_size_that_is_not_a_count_is_dropped(size: Any) -> None:
    view = parse_image_gen({"images": [{"image_url": "u", "size_bytes": size}]})
    assert view is not None
    assert view.items[0].size_bytes is None


@pytest.mark.parametrize(("size", "badge"), [(1536.7, "1 KB"), (2048.0, "2 KB"), (0.5, "0 B"), (3, "3 B")])
def test_finite_non_integer_size_is_rounded_down(size: float, badge: str) -> None:
    """Seed 000 step 3: 1536.7 bytes still gets a badge (Math.floor), only a non-finite size has none."""
    view = parse_image_gen({"images": [{"image_url": "u", "size_bytes": size}]})
    assert view is not None
    assert format_image_bytes(view.items[0].size_bytes) == badge


def test_image_byte_and_mime_labels() -> None:
    assert [format_image_bytes(n) for n in (None, 512, 2048, 3 * 1024 * 1024 + 5)] == [
        "",
        "512 B",
        "2 KB",
        "3 MB",
    ]
    assert [mime_tag(m) for m in ("image/png", "image/jpeg", None, "png")] == ["PNG", "JPEG", "", ""]


def test_ask_answers() -> None:
    result = {
        "answers": [
            {"question": "语言?", "selectedLabels": ["Python", "Go"], "customInput": None},
            {"question": "其他?", "selectedLabels": [], "customInput": "都行"},
            {"question": "", "selectedLabels": ["x"]},
            {"question": "坏标签", "selectedLabels": ["a", 3, None]},
        ]
    }
    view = parse_ask_answers(result)
    assert view is not None
    assert [(a.question, a.labels, a.custom_input) for a in view.answers] == [
        ("语言?", ("Python", "Go"), ""),
        ("其他?", (), "都行"),
        ("坏标签", ("a",), ""),
    ]


@pytest.mark.parametrize(
    "result", [None, {}, {"answers": []}, {"answers": [{"question": ""}]}, {"answers": "x"}, []]
)
def test_ask_answers_unrecognised(result: Any) -> None:
    assert parse_ask_answers(result) is None


ROW = {
    "taskId": 7,
    "childSessionId": 70,
    "agentType": "research",
    "status": "RUNNING",
    "totalRounds": 3,
    "totalToolCalls": 11,
    "totalPromptTokens": 1200,
    "totalCompletionTokens": 340,
    "recentOutput": "正在读取文件",
}


def test_check_subagent_array() -> None:
    statuses = ["RUNNING", "COMPLETED", "FAILED", "CANCELLED", "WEIRD"]
    result = {"background_subagents": [{**ROW, "taskId": i, "status": s} for i, s in enumerate(statuses)]}
    view = parse_subagent_rows("check_subagent", result)
    assert view is not None
    assert view.wait is None
    assert [r.status_kind for r in view.rows] == [
        StatusKind.RUNNING, StatusKind.OK, StatusKind.FAIL, StatusKind.MUTED, StatusKind.MUTED,
    ]  # fmt: skip
    first = view.rows[0]
    assert (first.task_id, first.agent_type, first.rounds, first.tool_calls) == ("0", "research", 3, 11)
    assert (first.prompt_tokens, first.completion_tokens, first.recent_output) == (1200, 340, "正在读取文件")
    assert [translate(part) for part in subagent_stats(first)] == ["3 轮", "11 次工具", "1200+340 tok"]
    assert translate(subagent_status_text(first)) == "运行中"
    assert subagent_status_text(view.rows[4]) == "WEIRD"


def test_check_subagent_single_object() -> None:
    view = parse_subagent_rows("check_subagent", {"taskId": "t-1", "status": "COMPLETED"})
    assert view is not None
    (row,) = view.rows
    assert (row.task_id, row.status_kind, row.rounds, row.recent_output) == ("t-1", StatusKind.OK, None, "")
    assert subagent_stats(row) == ()


def test_wait_subagents_rows_only_in_timeout_branch() -> None:
    timeout = {"completed": 1, "all_completed": False, "timed_out": True, "background_subagents": [ROW]}
    view = parse_subagent_rows("wait_subagents", timeout)
    assert view is not None
    assert len(view.rows) == 1
    assert view.wait == WaitSummary(completed=1, all_completed=False, timed_out=True)
    assert translate(wait_summary_msg(view.wait)) == "完成 1 个 · 已超时"
    done = {"completed": 2, "all_completed": True, "timed_out": False, "results": [ROW, ROW]}
    assert parse_subagent_rows("wait_subagents", done) is None  # D3: results[] is not a progress shape
    assert translate(wait_summary_msg(WaitSummary(2, True, False))) == "完成 2 个 · 全部完成"


@pytest.mark.parametrize(
    ("name", "result"),
    [
        ("check_subagent", None),
        ("check_subagent", {"background_subagents": []}),
        ("check_subagent", {"other": 1}),
        ("check_subagent", "text"),
        ("wait_subagents", {"background_subagents": "x"}),
        ("read_file", {"background_subagents": [ROW]}),
    ],
)
def test_subagent_rows_unrecognised(name: str, result: Any) -> None:
    assert parse_subagent_rows(name, result) is None

"""Golden cards of the seed cases, end to end (tools/ parses, cards/ renders). UPDATE_GOLDEN=1 rewrites."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.cards.builder import build_progress_card
from feishu_progress.cards.plaintext import card_as_text
from feishu_progress.domain import IMAGE_UPLOADING, TaskStatus, ToolCall
from tests.fakes import card_model
from tests.test_cards_builder import assert_valid, panel_of

GOLDEN = Path(__file__).parent / "golden" / "cards"
ASK_ARGS = {
    "questions": [
        {
            "question": "你希望我优先优化**哪一部分**？",
            "options": [{"label": "转录列表性能", "description": "滚动"}, "工具行视觉"],
        },
        {
            "question": "验收时想看到哪些内容？",
            "options": ["本地 demo 预览", "截图对比", "单测"],
            "multiSelect": True,
        },
    ]
}
ANSWERED = "你希望我优先优化**哪一部分**？：工具行视觉\n---\n验收时想看到哪些内容？：本地 demo 预览、截图对比"


def card_for(call: ToolCall, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"session_id": 7, "status": TaskStatus.RUNNING, "round": 2, "tools": (call,)}
    return build_progress_card(card_model(**{**base, **changes}))


def matches_golden(card: dict[str, Any], name: str) -> bool:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(card, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    assert_valid(card)
    return bool(card == json.loads(path.read_text(encoding="utf-8")))


def panel_lines(card: dict[str, Any]) -> list[str]:
    return card_as_text({"body": {"elements": [panel_of(card)]}}).split("\n")


def test_seed_000_image_grid() -> None:
    """Step 3: the badge reads size then type; a fractional size is floored; no path for a missing image."""
    result = {
        "images": [
            {
                "image_url": "/uploads/cat.png",
                "image_path": "/data/cat.png",
                "size_bytes": 2048,
                "mime": "image/png",
            },
            {
                "image_url": "/uploads/gone.png",
                "image_path": "/secret/gone.png",
                "size_bytes": 1536.7,
                "mime": "image/jpeg",
            },
        ],
        "model": "gpt-image-1",
        "size": "1024x1024",
        "prompt": "一只猫",
    }
    call = ToolCall("c1", "generate_image", {"prompt": "一只猫"}, result, finished=True)
    card = card_for(call, image_keys={"/data/cat.png": "img_v3_cat"})
    assert matches_golden(card, "seed_000_image_grid")
    assert panel_lines(card) == [
        "▸ 生成图片: 一只猫 (2 张)",
        "  提示词: 一只猫",
        "  [image]",
        "  1. 2 KB · PNG",
        "  2. 1 KB · JPEG 图片不可达 · gone.png",
        "  2 张图 · gpt-image-1 · 1024x1024",
    ]
    # D5's path and copy button become the file's name: the directory never reaches the chat.
    assert "/secret" not in json.dumps(card) and "/uploads" not in json.dumps(card)


def test_seed_000_image_on_its_way_is_not_unreachable() -> None:
    """D5 is for an image that cannot be reached; one whose upload is in flight says it is on its way."""
    result = {
        "images": [{"image_url": "/uploads/cat.png", "image_path": "/data/cat.png", "size_bytes": 2048}]
    }
    call = ToolCall("c1", "generate_image", {"prompt": "猫"}, result, finished=True)
    card = card_for(call, image_keys={"/data/cat.png": IMAGE_UPLOADING})
    assert panel_lines(card)[2] == "  1. 2 KB 图片上传中"
    assert "[image]" not in panel_lines(card) and "图片不可达" not in json.dumps(card, ensure_ascii=False)


def test_seed_001_asktool_answered() -> None:
    """§4.1-4.5: heading 问答, each question as markdown, its answers ✓ and every option."""
    card = card_for(ToolCall("c1", "asktool", ASK_ARGS, ANSWERED, finished=True))
    assert matches_golden(card, "seed_001_asktool_answered")
    assert panel_lines(card) == [
        "▸ 提问 · 2 个问题 · 已作答 2 / 2",
        "  **问答**",
        "  ",
        "  **1.** 单选 · 你希望我优先优化**哪一部分**？",
        "  ✓ 工具行视觉",
        "  ☐ 转录列表性能",
        "  ☑ **工具行视觉**",
        "  ",
        "  **2.** 多选 · 验收时想看到哪些内容？",
        "  ✓ 本地 demo 预览、截图对比",
        "  ☑ **本地 demo 预览**",
        "  ☑ **截图对比**",
        "  ☐ 单测",
    ]


@pytest.mark.parametrize(
    ("result", "headline"),
    [(None, "提问 · 2 个问题 · 等待回答"), ("对不上的文本", "调用 asktool")],
)
def test_seed_001_asktool_pending_and_fallback(result: str | None, headline: str) -> None:
    """Rule 3: no result text yet is 等待回答; A-5: an unreadable text keeps 输出 and the questions."""
    card = card_for(ToolCall("c1", "asktool", ASK_ARGS, result, finished=True))
    name = "seed_001_asktool_pending" if result is None else "seed_001_asktool_fallback"
    assert matches_golden(card, name)
    lines = panel_lines(card)
    assert lines[0] == f"▸ {headline}"
    if result is not None:
        assert lines[1:3] == ["  **输出**", "  对不上的文本"]
        assert lines[3] == "  **输入**"
        assert json.loads(lines[4].strip()) == ASK_ARGS

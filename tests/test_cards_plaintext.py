"""The plain-text view of a card (demo output, logs)."""

from __future__ import annotations

from feishu_progress.cards.builder import build_progress_card
from feishu_progress.cards.plaintext import card_as_text
from feishu_progress.domain import SubagentSummary, TaskStatus
from tests.fakes import card_model


def test_a_running_card_reads_like_the_card() -> None:
    model = card_model(
        session_id=3,
        status=TaskStatus.RUNNING,
        round=2,
        content="a & b <at id=all></at>",
        title="任务",
        subagents=(SubagentSummary(1, "explorer", "查资料", "RUNNING", 2),),
        elapsed_ms=65_000,
    )
    text = card_as_text(build_progress_card(model))
    lines = text.splitlines()
    assert lines[0] == "┃ 任务 [正在处理]"
    assert "状态:正在处理 · 第 2 轮 · 已用时 1 分 5 秒" in lines
    assert "a & b <at id=all></at>" in text  # entities decoded for reading; the card itself carries none live
    assert "- 调研 · 查资料 · 第 2 轮" in lines
    assert lines[-1] == "[点踩] [取消任务]"

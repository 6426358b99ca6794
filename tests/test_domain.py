"""CardModel.from_state: the one constructor the task service and the live card share."""

from __future__ import annotations

import dataclasses

import pytest

from feishu_progress.domain import (
    CardModel,
    CardPanels,
    CardState,
    Notice,
    PendingApproval,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
    elapsed_ms,
)

SUBAGENTS = (SubagentSummary(1, "explorer", "查资料", "RUNNING", 2),)


def full_state(status: TaskStatus = TaskStatus.RUNNING, finished_at: float | None = None) -> CardState:
    panels = CardPanels(
        status=status,
        round=7,
        tools=(ToolCall("c1", "shell", {"command": "ls"}),),
        pending_asks=(PendingAsk("a1", ()),),
        pending_approvals=(PendingApproval("p1", "shell"),),
        disliked=True,
        notice=Notice.CANCELLING,
        error="boom",
        image_keys={"/p.png": "img_1"},
        finished_at=finished_at,
    )
    return CardState(panels, content="正文", content_chars=2)


def build(state: CardState, now: float = 1_000.5) -> CardModel:
    return CardModel.from_state(
        state,
        session_id=42,
        title="任务",
        locales=("zh_cn", "en_us"),
        session_detail_url="https://h/s/{session_id}",
        started_at=1_000.0,
        now=now,
        subagents=SUBAGENTS,
    )


def test_the_model_holds_the_state_s_panels_and_text_as_they_are() -> None:
    state = full_state()
    model = build(state)
    assert model.panels is state.panels  # held, never copied field by field
    assert (model.content, model.content_chars) == (state.content, state.content_chars)
    assert (model.session_id, model.title, model.locales) == (42, "任务", ("zh_cn", "en_us"))
    assert model.session_detail_url == "https://h/s/{session_id}"
    assert model.subagents == SUBAGENTS
    assert model.elapsed_ms == 500


def test_the_panels_are_everything_a_card_state_holds_but_its_text() -> None:
    # A field added to CardState beside the panels would escape the live card's panel comparison.
    assert [f.name for f in dataclasses.fields(CardState)] == ["panels", "content", "content_chars"]


@pytest.mark.parametrize("status", [s for s in TaskStatus if s is not TaskStatus.RUNNING])
def test_subagents_only_while_running(status: TaskStatus) -> None:
    assert build(full_state(status)).subagents == ()


def test_elapsed_time_stops_when_the_task_ends_and_is_never_negative() -> None:
    assert build(full_state(TaskStatus.COMPLETED, finished_at=1_003.0), now=9_999.0).elapsed_ms == 3_000
    assert build(full_state(), now=999.0).elapsed_ms == 0
    assert elapsed_ms(10.0, 12.25) == 2_250

"""Saved snapshots restore: the shapes earlier versions wrote keep loading, and a restored state saves
what it loaded.

The files under ``fixtures/snapshots/`` were written by the code of their version (``v1_*`` by the
snapshot writer before the runtime split, ``v2_*`` by the writer of SNAPSHOT_VERSION 2) and are never
regenerated: they stand for rows already in users' databases.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.db.repo import TaskRecord
from feishu_progress.domain import IMAGE_UPLOADING, Notice, TaskStatus
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.snapshots import state_from_record
from feishu_progress.runtime.state import CONTENT_KEEP_CHARS, MAX_TOOLS_KEPT, TaskState

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def record(snapshot: str | None, status: TaskStatus = TaskStatus.RUNNING, **columns: Any) -> TaskRecord:
    row: dict[str, Any] = {
        "session_id": 41,
        "title": "会话标题",
        "receive_id": "oc_1",
        "receive_id_type": "chat_id",
        "reply_to_message_id": None,
        "message_id": "om_1",
        "requester_open_id": "ou_1",
        "locale": None,
        "status": status,
        "round": 3,
        "snapshot": snapshot,
        "disliked": False,
        "stop_reason": None,
        "started_at": T0,
        "last_event_at": T0,
        "finished_at": None,
    }
    return TaskRecord(**(row | columns))


def saved(name: str) -> str:
    return (SNAPSHOTS / name).read_text(encoding="utf-8").strip()


def test_a_v2_snapshot_of_a_waiting_task_restores_everything_it_holds() -> None:
    state = state_from_record(record(saved("v2_waiting.json"), TaskStatus.WAITING, disliked=True))
    shown = state.card_state()
    card = shown.panels
    assert (card.status, card.round, card.disliked, card.notice) == (
        TaskStatus.WAITING,
        3,
        True,
        Notice.APPROVED,
    )
    assert (state.title, shown.content, shown.content_chars) == (
        "部署 staging",
        "正在部署 <b>staging</b>…",
        20,
    )
    assert [(t.call_id, t.name, t.args, t.result, t.finished) for t in card.tools] == [
        ("c1", "bash", {"command": "make deploy"}, {"exit_code": 0, "stdout": "ok\n"}, True),
        ("c2", "read_file", {"path": "/tmp/a.png"}, None, False),
    ]
    first, second = card.pending_asks
    assert (first.ask_id, second.ask_id) == ("a1", "a2")
    assert [
        (q.question, q.multi_select, [(o.label, o.description) for o in q.options]) for q in first.questions
    ] == [
        ("继续吗？", False, [("是", "继续部署"), ("否", "")]),
        ("通知谁？", True, [("运维", ""), ("开发", "")]),
    ]
    assert [(a.approval_id, a.tool_name, a.summary) for a in card.pending_approvals] == [
        ("p1", "shell", "rm -rf build")
    ]
    assert dict(card.image_keys) == {"fpimg:abc": "img_v3_key1", "/tmp/a.png": "img_v3_key2"}
    assert (state.started_at, state.actions_applied, state.events_applied) == (1_700_000_000.5, 5, 9)
    assert card.finished_at is None and not state.retry_requested


def test_a_v2_snapshot_of_a_failed_task_keeps_its_dropped_calls_and_its_end() -> None:
    state = state_from_record(record(saved("v2_failed.json"), TaskStatus.FAILED, round=7, title=None))
    shown = state.card_state()
    card = shown.panels
    assert len(card.tools) == MAX_TOOLS_KEPT and card.earlier_tools == 2 and card.tools[0].call_id == "k2"
    assert (card.error, card.notice, card.finished_at) == ("OOM: 内存不足", Notice.RETRYING, 1_700_000_500.0)
    assert state.retry_requested and state.title == ""


def test_a_v1_snapshot_restores_with_defaults_for_what_it_did_not_hold() -> None:
    state = state_from_record(record(saved("v1_running.json"), round=2))
    shown = state.card_state()
    card = shown.panels
    assert (state.title, shown.content, shown.content_chars, card.earlier_tools) == (
        "旧版快照",
        "v1 的正文",
        6,
        0,
    )
    assert [t.call_id for t in card.tools] == ["t1"] and card.notice is Notice.CANCELLING
    assert [a.approval_id for a in card.pending_approvals] == ["p9"]
    assert dict(card.image_keys) == {"https://e.com/a.png": "img_v2_old"}
    assert (state.actions_applied, state.events_applied, state.started_at) == (0, 0, 1_690_000_000.0)
    # The ids it answered are still refused a second time.
    state.apply_action("approval", {"approval_id": "p8", "approved": True})
    assert state.card_state().panels.notice is Notice.CANCELLING


@pytest.mark.parametrize("name", ["v2_waiting.json", "v2_failed.json"])
def test_a_restored_v2_snapshot_saves_what_it_loaded(name: str) -> None:
    text = saved(name)
    state = state_from_record(record(text, title=None))  # an empty saved title falls back to the row's
    again = json.loads(state.to_snapshot())
    assert again == with_today_s_defaults(json.loads(text))


@pytest.mark.parametrize("damaged", ["", "not json", "[1, 2]", '{"v": 2, "content": 5, "tools": "x"}'])
def test_a_damaged_snapshot_leaves_the_row_s_columns_and_defaults(damaged: str) -> None:
    state = state_from_record(record(damaged, TaskStatus.WAITING, disliked=True))
    shown = state.card_state()
    card = shown.panels
    assert (card.status, card.round, card.disliked, state.title) == (TaskStatus.WAITING, 3, True, "会话标题")
    assert card.tools == () and state.started_at == T0.timestamp()


def test_an_upload_in_flight_is_shown_but_never_saved() -> None:
    state = TaskState(session_id=1, requester_open_id="ou", receive_id="oc", receive_id_type="chat_id")
    state.apply(ev.ToolStartedEvent(type="tool_started", call_id="c1", name="read_file"))
    state.images_on_their_way(["/tmp/x.png"])
    assert dict(state.card_state().panels.image_keys) == {"/tmp/x.png": IMAGE_UPLOADING}
    assert json.loads(state.to_snapshot())["image_keys"] == {}


def test_a_damaged_field_is_dropped_alone_and_named(caplog: pytest.LogCaptureFixture) -> None:
    data = json.loads(saved("v2_waiting.json"))
    data["approvals"] = [{"approval_id": "p1"}]  # no tool_name
    data["notice"] = "a notice this version does not know"
    state = state_from_record(record(json.dumps(data)))
    panels = state.card_state().panels
    assert panels.pending_approvals == () and panels.notice is None
    assert [t.call_id for t in panels.tools] == ["c1", "c2"] and state.events_applied == 9
    assert "approvals, notice" in caplog.text and "41" in caplog.text


def test_an_unbounded_v1_snapshot_is_cut_to_today_s_bounds() -> None:
    calls = [
        {"call_id": f"t{i}", "name": "ls", "args": None, "result": None, "finished": True} for i in range(80)
    ]
    v1 = {"v": 1, "content": "长" * (CONTENT_KEEP_CHARS + 10), "tools": calls}
    shown = state_from_record(record(json.dumps(v1))).card_state()
    assert (len(shown.content), shown.content_chars) == (CONTENT_KEEP_CHARS, CONTENT_KEEP_CHARS + 10)
    assert [t.call_id for t in shown.panels.tools] == [f"t{i}" for i in range(30, 80)]
    assert shown.panels.earlier_tools == 30


def with_today_s_defaults(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A fixture saved before a field was added, as today's code saves it back (the field's default)."""
    approvals = [{"allow_always": False, **approval} for approval in snapshot.get("approvals", [])]
    return {**snapshot, "approvals": approvals} if "approvals" in snapshot else snapshot

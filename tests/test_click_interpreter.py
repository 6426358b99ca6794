"""A click means one thing whether it is applied live or replayed from the action log.

The live path (runtime/card_actions.py) decides the answer from the task's state and, when the click
changes something, records it and applies it through ``TaskState.apply_logged_action``; the replay path
(a restart, a takeover, a click recorded by another instance) applies what the log holds through the same
method. A click recorded while it was valid (a retry of a failed task) and replayed after the task moved
on (the runtime revived it) must change what the live path would change at that moment: nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from feishu_progress.cards.callback_contract import CALLBACK_VERSION
from feishu_progress.domain import Notice, TaskStatus
from feishu_progress.feishu.callback import CardActionEvent
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.card_actions import _DECIDERS, parse_click
from feishu_progress.runtime.state import TaskState, restore

# What each kind of click carries in the log, as the live path writes it on a state where it is valid.
LOGGED: dict[str, tuple[str, dict[str, Any]]] = {
    "cancel": ("cancel", {}),
    "retry": ("retry", {}),
    "dislike": ("dislike", {"disliked": True}),
    "approve": ("approval", {"approval_id": "p1", "tool_name": "shell", "approved": True}),
    "approve_always": (
        "approval",
        {"approval_id": "p1", "tool_name": "shell", "approved": True, "always": True},
    ),
    "deny": ("approval", {"approval_id": "p1", "tool_name": "shell", "approved": False}),
}


def _state(status: TaskStatus, *, allow_always: bool = True) -> TaskState:
    state = TaskState(session_id=7, requester_open_id="ou_1", receive_id="oc_1", receive_id_type="chat_id")
    approval = ev.ApprovalEvent(type="approval", approval_id="p1", tool_name="shell", summary="ls",
                                allow_always=allow_always)  # fmt: skip
    state.apply(approval)
    if status is TaskStatus.RUNNING:  # running again: the approval is closed
        state.apply(ev.StatusEvent(type="status", status="RUNNING", round=1))
    elif status.is_terminal and status is not TaskStatus.LOST:
        state.apply(ev.FinishedEvent(type="finished", status=status.value))
    elif status is TaskStatus.LOST:
        state.mark_lost(now=1.0)
    assert state.status is status
    return state


def _click(action: str) -> CardActionEvent:
    value: dict[str, Any] = {"v": CALLBACK_VERSION, "action": action, "session_id": 7}
    if action in ("approve", "approve_always", "deny"):
        value["approval_id"] = "p1"
    return CardActionEvent(event_id="ev1", token="tok1", open_id="ou_1", message_id="om_1", value=value)


def _live(state: TaskState, action: str) -> None:
    event = _click(action)
    click = parse_click(event.value)
    assert click is not None
    decision = _DECIDERS[action](state, click, event)
    if decision.kind is not None:
        state.apply_logged_action(1, decision.kind, decision.payload or {})


def _replayed(state: TaskState, action: str) -> None:
    kind, payload = LOGGED[action]
    state.apply_logged_action(1, kind, payload)


def _effect(state: TaskState) -> dict[str, Any]:
    seen = dict(vars(state))  # the whole state: a click changes more than its snapshot (disliked)
    seen.pop("actions_applied")
    return seen


@pytest.mark.parametrize("status", list(TaskStatus))
@pytest.mark.parametrize("action", sorted(LOGGED))
def test_a_replayed_click_changes_what_the_live_click_would(status: TaskStatus, action: str) -> None:
    live, replayed = _state(status), _state(status)
    _live(live, action)
    _replayed(replayed, action)
    assert _effect(replayed) == _effect(live)


def test_a_retry_logged_while_failed_does_nothing_once_the_task_runs_again() -> None:
    state = _state(TaskStatus.FAILED)
    state.apply_logged_action(1, "retry", {})
    state.apply(ev.StatusEvent(type="status", status="RUNNING", round=2))  # the runtime revived it
    assert state.status is TaskStatus.RUNNING and state.notice is None
    state.apply_logged_action(2, "retry", {})  # the same click replayed from another instance's record
    assert state.notice is None and not state.retry_requested


def test_an_action_is_applied_once_by_its_log_id() -> None:
    state = _state(TaskStatus.RUNNING)
    state.apply_logged_action(3, "dislike", {"disliked": True})
    state.apply_logged_action(3, "dislike", {"disliked": False})
    assert state.disliked is True and state.actions_applied == 3


def test_allow_always_is_recorded_as_an_approval_that_says_always() -> None:
    state = _state(TaskStatus.WAITING)
    event = _click("approve_always")
    click = parse_click(event.value)
    assert click is not None
    decision = _DECIDERS["approve_always"](state, click, event)
    assert (decision.kind, decision.toast_key) == ("approval", "card.toast.approved_always")
    assert decision.payload == LOGGED["approve_always"][1]
    state.apply_logged_action(1, "approval", decision.payload)
    assert state.notice is Notice.APPROVED_ALWAYS and "p1" not in state.approvals
    assert state.card_state().panels.notice is Notice.APPROVED_ALWAYS


def test_allow_always_on_an_approval_that_did_not_offer_it_changes_nothing() -> None:
    state = _state(TaskStatus.WAITING, allow_always=False)
    event = _click("approve_always")
    click = parse_click(event.value)
    assert click is not None
    decision = _DECIDERS["approve_always"](state, click, event)
    assert (decision.kind, decision.toast_type) == (None, "error")
    assert "p1" in state.approvals


def test_a_pending_approval_keeps_its_offer_across_a_snapshot() -> None:
    state = _state(TaskStatus.WAITING)
    row = {"session_id": 7, "requester_open_id": "ou_1", "receive_id": "oc_1", "receive_id_type": "chat_id"}
    restored = restore(row, state.to_snapshot()).state
    assert restored.approvals["p1"].allow_always is True
    assert _state(TaskStatus.WAITING, allow_always=False).approvals["p1"].allow_always is False

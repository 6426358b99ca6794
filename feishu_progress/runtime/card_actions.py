"""Card clicks → user actions: authorised, recorded durably, then applied and answered.

``CardActions.handle`` runs inside Feishu's 3-second callback window (the pipeline answers with an error
toast at 2.5 s). It decides what the click means from the task's state; a click that changes something
is written to the action log (group-committed, so this costs milliseconds) and only then applied to the
task — so "回答已提交" is never said about an answer the runtime will not see. A click the log could not
take changes nothing and says 操作失败,请稍后重试.

A click for a card another instance writes (cluster mode) never gets here as such: the lookup raises
``OwnedElsewhere`` / ``NotWritableHere`` and ``cluster/clicks.py`` hands the click to the card's writer or
only records it, with the checks and deciders this module exports.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.cards.callback_contract import ACTIONS, CALLBACK_VERSION, decode_form_answers
from feishu_progress.config import Settings
from feishu_progress.db.repo import ActionRecord, NewAction
from feishu_progress.db.times import utc_datetime
from feishu_progress.domain import Notice
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent, ToastType
from feishu_progress.i18n import Msg
from feishu_progress.ports import Clock
from feishu_progress.runtime.action_log import ActionLog
from feishu_progress.runtime.snapshots import SnapshotStore
from feishu_progress.runtime.state import RETRYABLE, TaskState
from feishu_progress.runtime.task import Task

log = logging.getLogger(__name__)

TaskLookup = Callable[[int], Awaitable[Task | None]]
StateLookup = Callable[[int], Awaitable[TaskState | None]]  # the saved state (cluster/clicks.py)


@dataclass(frozen=True, slots=True)
class Click:
    action: str
    session_id: int
    ask_id: str | None
    approval_id: str | None


@dataclass(frozen=True, slots=True)
class Decision:
    """What a click means: the toast, and — when it changes something — the action to log and apply."""

    toast_type: ToastType
    toast_key: str
    kind: str | None = None  # the action log's kind; None: nothing to record or apply
    payload: Mapping[str, Any] | None = None


def parse_click(value: Mapping[str, Any]) -> Click | None:
    """The button's callback value as we wrote it (cards/callback_contract.py), or None for anything else."""
    action = value.get("action")
    session_id = value.get("session_id")
    if value.get("v") != CALLBACK_VERSION or action not in ACTIONS:
        return None
    if not isinstance(session_id, int) or isinstance(session_id, bool):
        return None
    ask_id = value.get("ask_id")
    approval_id = value.get("approval_id")
    return Click(
        action=str(action),
        session_id=session_id,
        ask_id=ask_id if isinstance(ask_id, str) else None,
        approval_id=approval_id if isinstance(approval_id, str) else None,
    )


def on_this_card(state: TaskState, event: CardActionEvent) -> bool:
    """Whether the click came from this task's card: a button's value names a task, the message proves it."""
    return not state.message_id or event.message_id == state.message_id


def toast(kind: ToastType, key: str, card: Mapping[str, Any] | None = None) -> CallbackReply:
    return CallbackReply(toast_type=kind, text=Msg(key), card=card)


class CardActions:
    """The ActionHandler behind the callback pipeline (webhook and long connection alike)."""

    def __init__(
        self,
        *,
        tasks: TaskLookup,
        action_log: ActionLog,
        snapshots: SnapshotStore,
        settings: Settings,
        clock: Clock,
    ) -> None:
        self._tasks = tasks
        self._action_log = action_log
        self._snapshots = snapshots
        self._settings = settings
        self._clock = clock

    async def handle(self, event: CardActionEvent) -> CallbackReply:
        """Answer a click on a card this instance writes (cluster mode: OwnedElsewhere, NotWritableHere)."""
        click = parse_click(event.value)
        if click is None:
            return toast("error", "card.toast.invalid_action")
        task = await self._tasks(click.session_id)
        if task is None or not same_app(task.state, event):
            return toast("error", "card.toast.unknown_task")
        if not on_this_card(task.state, event):
            return toast("error", "card.toast.expired")
        if task.card.stopped_reason is not None:  # past the 14-day window, recalled or deleted
            return toast("info", "card.toast.expired")
        if not self.may_act(task.state, event):
            log.info("click %r on task %s refused: not the requester", click.action, click.session_id)
            return toast("error", "card.toast.not_requester", task.card.callback_card())
        async with task.lock:
            return await self._decide_and_apply(task, click, event)

    async def record(self, session_id: int, decision: Decision, event: CardActionEvent) -> ActionRecord:
        """Write the action ``decision`` names to the log (durable before the click is acknowledged)."""
        return await self._action_log.record(self._action(session_id, decision, event))

    def _action(self, session_id: int, decision: Decision, event: CardActionEvent) -> NewAction:
        assert decision.kind is not None
        return NewAction(
            session_id=session_id,
            kind=decision.kind,
            operator_open_id=event.open_id,
            payload=decision.payload or {},
            dedupe_key=f"{decision.kind}:{event.token or event.event_id}",
            now=utc_datetime(self._clock.wall()),
        )

    def may_act(self, state: TaskState, event: CardActionEvent) -> bool:
        """Whether the clicking user may decide for this task (the requester, or chat members if allowed)."""
        if event.open_id == state.requester_open_id:
            return True
        # Widened by FP_CALLBACK__ALLOW_CHAT_MEMBERS: anyone clicking inside the chat the card was sent to.
        return (
            self._settings.callback.allow_chat_members
            and state.receive_id_type == "chat_id"
            and event.chat_id is not None
            and event.chat_id == state.receive_id
        )

    async def _decide_and_apply(self, task: Task, click: Click, event: CardActionEvent) -> CallbackReply:
        decision = decide(task.state, click, event)
        if decision.kind is None:
            return toast(decision.toast_type, decision.toast_key, task.card.callback_card())
        try:
            recorded = await self.record(task.session_id, decision, event)
        except Exception as exc:
            log.warning("click %r on task %s not recorded: %r", click.action, task.session_id, exc)
            return toast("error", "card.toast.error")
        # The state's one interpreter, by the log's id: a redelivery racing the first is applied once.
        task.state.apply_logged_action(recorded.id, decision.kind, decision.payload or {})
        task.sync_card()  # the reply carries the new card; the scheduler brings every viewer up to date
        self._snapshots.mark_dirty(task)
        return toast(decision.toast_type, decision.toast_key, task.card.callback_card())


def same_app(state: TaskState, event: CardActionEvent) -> bool:
    """A click counts only on the route of the app that sent the card (its keys verified it)."""
    if event.app is None or event.app == state.app:
        return True
    log.warning(
        "click on task %s refused: it came by app %r, the card is app %r's",
        state.session_id,
        event.app,
        state.app,
    )
    return False


def decide(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    """What ``click`` means for a task in ``state`` (a pure read; nothing is changed)."""
    return _DECIDERS[click.action](state, click, event)


# -- what each click means (pure reads of the state; changes go through TaskState methods) --------------


def _cancel(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    if state.status.is_terminal:
        return Decision("info", "card.toast.task_finished")
    if state.notice is Notice.CANCELLING:
        return Decision("success", "card.toast.cancelling")
    return Decision("success", "card.toast.cancelling", "cancel", {})


def _retry(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    if state.status not in RETRYABLE:
        return Decision("info", "card.toast.retry_not_failed")
    if state.retry_requested:
        return Decision("success", "card.toast.retrying")
    return Decision("success", "card.toast.retrying", "retry", {})


def _dislike(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    disliked = not state.disliked
    key = "card.toast.disliked" if disliked else "card.toast.undisliked"
    return Decision("success", key, "dislike", {"disliked": disliked})


def _answers(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    ask_id = click.ask_id or ""
    if ask_id in state.answered_asks:
        return Decision("info", "card.toast.already_answered")
    if state.status.is_terminal:
        return Decision("info", "card.toast.task_finished")
    ask = state.pending_asks.get(ask_id)
    if ask is None:
        return Decision("info", "card.toast.expired")
    try:
        answers = decode_form_answers(ask, event.form_value, ask_index=list(state.pending_asks).index(ask_id))
    except ValueError as exc:
        log.info("answers to ask %r of task %s refused: %r", ask_id, state.session_id, exc)
        return Decision("error", "card.toast.invalid_answer")
    payload = {
        "ask_id": ask_id,
        "answers": [
            {"question": question.question, "selected_labels": labels, "custom_input": text}
            for question, (labels, text) in zip(ask.questions, answers, strict=True)
        ],
    }
    return Decision("success", "card.toast.answers_submitted", "answers", payload)


def _decision_on_approval(state: TaskState, click: Click, approved: bool, always: bool = False) -> Decision:
    approval_id = click.approval_id or ""
    if approval_id in state.resolved_approvals:
        return Decision("info", "card.toast.already_answered")
    if state.status.is_terminal:
        return Decision("info", "card.toast.task_finished")
    approval = state.approvals.get(approval_id)
    if approval is None:
        return Decision("info", "card.toast.expired")
    if always and not approval.allow_always:  # the runtime did not offer it: it could not keep the rule
        return Decision("error", "card.toast.invalid_action")
    payload = {"approval_id": approval_id, "tool_name": approval.tool_name, "approved": approved}
    if always:
        payload["always"] = True
    key = "card.toast.approved" if approved else "card.toast.denied"
    return Decision("success", "card.toast.approved_always" if always else key, "approval", payload)


def _approve(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    return _decision_on_approval(state, click, approved=True)


def _approve_always(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    return _decision_on_approval(state, click, approved=True, always=True)


def _deny(state: TaskState, click: Click, event: CardActionEvent) -> Decision:
    return _decision_on_approval(state, click, approved=False)


_DECIDERS: dict[str, Callable[[TaskState, Click, CardActionEvent], Decision]] = {
    "cancel": _cancel,
    "retry": _retry,
    "dislike": _dislike,
    "answers": _answers,
    "approve": _approve,
    "approve_always": _approve_always,
    "deny": _deny,
}

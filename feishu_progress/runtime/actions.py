"""Card clicks → user actions: authorised, recorded once, answered at once.

``CardActions.handle`` runs inside Feishu's 3-second callback window, so it never awaits the database
or Feishu: it checks, changes the in-memory task, and answers with a toast plus the card from
``render_current()``. Recording the action (the log runtimes long-poll) and saving the task run in
tracked background tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.cards.callback_contract import ACTIONS, CALLBACK_VERSION, decode_form_answers
from feishu_progress.config import Settings
from feishu_progress.domain import Notice, TaskStatus
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent, ToastType
from feishu_progress.i18n import Msg
from feishu_progress.runtime.background import BackgroundTasks
from feishu_progress.runtime.service import Task, TaskService, utc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Click:
    action: str
    session_id: int
    ask_id: str | None
    approval_id: str | None


def _parse_value(value: Mapping[str, Any]) -> _Click | None:
    action = value.get("action")
    session_id = value.get("session_id")
    if value.get("v") != CALLBACK_VERSION or action not in ACTIONS:
        return None
    if not isinstance(session_id, int) or isinstance(session_id, bool):
        return None
    ask_id = value.get("ask_id")
    approval_id = value.get("approval_id")
    return _Click(
        action=str(action),
        session_id=session_id,
        ask_id=ask_id if isinstance(ask_id, str) else None,
        approval_id=approval_id if isinstance(approval_id, str) else None,
    )


def _toast(kind: ToastType, key: str, card: Mapping[str, Any] | None = None) -> CallbackReply:
    return CallbackReply(toast_type=kind, text=Msg(key), card=card)


class CardActions:
    """The ActionHandler behind POST /feishu/callback (and the long connection)."""

    def __init__(self, service: TaskService, settings: Settings, background: BackgroundTasks) -> None:
        self.service = service
        self.settings = settings
        self.background = background

    async def handle(self, event: CardActionEvent) -> CallbackReply:
        click = _parse_value(event.value)
        if click is None:
            return _toast("error", "card.toast.invalid_action")
        task = self.service.tasks.get(click.session_id)
        if task is None:
            return _toast("error", "card.toast.unknown_task")
        if task.state.message_id and event.message_id and event.message_id != task.state.message_id:
            return _toast("error", "card.toast.expired")
        if task.card.stopped_reason is not None:  # past the 14-day window, recalled or deleted
            return _toast("info", "card.toast.expired")
        if not self._may_act(task, event):
            log.info(
                "click %s on task %s refused: operator is not the requester", click.action, click.session_id
            )
            return _toast("error", "card.toast.not_requester", task.card.render_current())
        handler = getattr(self, f"_on_{click.action}")
        reply: CallbackReply = handler(task, click, event)
        return reply

    def _may_act(self, task: Task, event: CardActionEvent) -> bool:
        if event.open_id == task.state.requester_open_id:
            return True
        # Widened by FP_CALLBACK__ALLOW_CHAT_MEMBERS: anyone clicking inside the chat the card was sent to.
        return (
            self.settings.callback.allow_chat_members
            and task.state.receive_id_type == "chat_id"
            and event.chat_id is not None
            and event.chat_id == task.state.receive_id
        )

    # ------------------------------------------------------------------ actions
    def _on_cancel(self, task: Task, click: _Click, event: CardActionEvent) -> CallbackReply:
        state = task.state
        if state.status.is_terminal:
            return _toast("info", "card.toast.task_finished", task.card.render_current())
        if state.notice is not Notice.CANCELLING:
            state.notice = Notice.CANCELLING
            self._record(task, "cancel", event, {})
        return _toast("success", "card.toast.cancelling", self._changed(task))

    def _on_retry(self, task: Task, click: _Click, event: CardActionEvent) -> CallbackReply:
        state = task.state
        if state.status not in (TaskStatus.FAILED, TaskStatus.LOST):
            return _toast("info", "card.toast.retry_not_failed", task.card.render_current())
        if not state.retry_requested:
            state.retry_requested = True
            state.notice = Notice.RETRYING
            self._record(task, "retry", event, {})
        return _toast("success", "card.toast.retrying", self._changed(task))

    def _on_dislike(self, task: Task, click: _Click, event: CardActionEvent) -> CallbackReply:
        state = task.state
        state.disliked = not state.disliked
        self._record(task, "dislike", event, {"disliked": state.disliked})
        key = "card.toast.disliked" if state.disliked else "card.toast.undisliked"
        return _toast("success", key, self._changed(task))

    def _on_answers(self, task: Task, click: _Click, event: CardActionEvent) -> CallbackReply:
        state = task.state
        ask_id = click.ask_id or ""
        if ask_id in state.answered_asks:
            return _toast("info", "card.toast.already_answered", task.card.render_current())
        if state.status.is_terminal:
            return _toast("info", "card.toast.task_finished", task.card.render_current())
        ask = state.pending_asks.get(ask_id)
        if ask is None:
            return _toast("info", "card.toast.expired", task.card.render_current())
        ask_index = list(state.pending_asks).index(ask_id)
        try:
            answers = decode_form_answers(ask, event.form_value, ask_index=ask_index)
        except ValueError as exc:
            log.info("answers to ask %s of task %s refused: %s", ask_id, state.session_id, exc)
            return _toast("error", "card.toast.invalid_answer")
        payload = {
            "ask_id": ask_id,
            "answers": [
                {"question": question.question, "selected_labels": labels, "custom_input": text}
                for question, (labels, text) in zip(ask.questions, answers, strict=True)
            ],
        }
        state.pending_asks.pop(ask_id)
        state.answered_asks.add(ask_id)
        state.notice = Notice.ANSWERS_SUBMITTED
        self._record(task, "answers", event, payload)
        return _toast("success", "card.toast.answers_submitted", self._changed(task))

    def _on_approve(self, task: Task, click: _Click, event: CardActionEvent) -> CallbackReply:
        return self._decide(task, click, event, approved=True)

    def _on_deny(self, task: Task, click: _Click, event: CardActionEvent) -> CallbackReply:
        return self._decide(task, click, event, approved=False)

    def _decide(self, task: Task, click: _Click, event: CardActionEvent, *, approved: bool) -> CallbackReply:
        state = task.state
        approval_id = click.approval_id or ""
        if approval_id in state.resolved_approvals:
            return _toast("info", "card.toast.already_answered", task.card.render_current())
        if state.status.is_terminal:
            return _toast("info", "card.toast.task_finished", task.card.render_current())
        approval = state.approvals.pop(approval_id, None)
        if approval is None:
            return _toast("info", "card.toast.expired", task.card.render_current())
        state.resolved_approvals.add(approval_id)
        state.notice = Notice.APPROVED if approved else Notice.DENIED
        payload = {"approval_id": approval_id, "tool_name": approval.tool_name, "approved": approved}
        self._record(task, "approval", event, payload)
        key = "card.toast.approved" if approved else "card.toast.denied"
        return _toast("success", key, self._changed(task))

    # ------------------------------------------------------------------ plumbing
    def _changed(self, task: Task) -> Mapping[str, Any]:
        # The reply carries the new card, so Feishu shows it at once; the scheduler still delivers the
        # newest state later (without urgency) so every viewer converges on it.
        self.service.sync_card(task)
        return task.card.render_current()

    def _record(self, task: Task, kind: str, event: CardActionEvent, payload: dict[str, Any]) -> None:
        dedupe_key = f"{kind}:{event.token or event.event_id}"[:191]
        self.background.spawn(
            self._persist(task, kind, event.open_id, payload, dedupe_key),
            name=f"action-{task.state.session_id}-{kind}",
        )

    async def _persist(
        self, task: Task, kind: str, operator: str, payload: dict[str, Any], dedupe_key: str
    ) -> None:
        service = self.service
        now = utc(service.clock.wall())
        _, created = await service.repos.actions.append(
            task.state.session_id, kind, operator, payload, dedupe_key, now
        )
        if not created:
            log.info("action %s of task %s was already recorded", kind, task.state.session_id)
        if kind == "dislike":
            await service.repos.tasks.set_disliked(task.state.session_id, task.state.disliked)
        await service.persist(task.state)
        task.actions_changed.set()

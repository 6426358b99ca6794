"""``POST /v1/tasks``: a task row, its first card in Feishu, its live card — or nothing at all.

Idempotent for the runtime: with an ``Idempotency-Key`` a repeated create answers the same task, and the
key also fixes the ``uuid`` of the first send, so a create that failed after Feishu had in fact sent the
card finds the same message when tried again (Feishu dedupes a uuid for an hour). Without a key, a
create whose first card cannot be sent leaves nothing behind (the row is deleted) and answers 503.

Transport ``cardkit`` (the default): the first card is a CardKit card entity (streaming on), saved on the
task before the message that shows it is sent, so a retried create sends the same entity. If the entity
cannot be created the task is PATCHed whole instead; when the app lacks the CardKit scope, no task tries
again for ``FP_CARDKIT__SCOPE_RECHECK_SECONDS``.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from feishu_progress.apps import AppContext, AppRegistry
from feishu_progress.cards.builder import build_card
from feishu_progress.config import Settings
from feishu_progress.db.repo import MAX_REF_LENGTH, NewTask, TaskRecord, TaskRepository
from feishu_progress.db.times import utc_datetime
from feishu_progress.domain import CardState
from feishu_progress.errors import (
    REUSED_KEY,
    FeishuAPIError,
    FeishuProgressError,
    FirstCardFailed,
    RequestRejected,
    TaskConflict,
)
from feishu_progress.feishu.cardkit_writer import entity_card, streaming_config
from feishu_progress.feishu.errors import CARDKIT_SCOPE_MISSING
from feishu_progress.feishu.writers import FirstBuild
from feishu_progress.ports import Clock
from feishu_progress.progress.admission import BudgetBusy
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.registry import TaskRegistry, card_context
from feishu_progress.runtime.snapshots import state_from_record
from feishu_progress.runtime.state import TaskState, request_digest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CreatedTask:
    session_id: int
    message_id: str


class TaskCreator:
    def __init__(
        self,
        *,
        settings: Settings,
        repo: TaskRepository,
        apps: AppRegistry,
        registry: TaskRegistry,
        clock: Clock,
        owner: str | None,
    ) -> None:
        self._settings = settings
        self._apps = apps
        self._repo = repo
        self._registry = registry
        self._clock = clock
        self._owner = owner  # cluster mode: this instance's id; it writes what it creates (single: None)

    async def create(self, request: ev.CreateTaskRequest, idempotency_key: str | None = None) -> CreatedTask:
        """Create the task and send its first card (TaskExists, FirstCardFailed, UnknownRequestedApp),
        within FP_RATE__CREATE_WAIT_SECONDS of its arrival."""
        app = self._apps.resolve(request.app)
        first_api = self._first_api(app, request.reply_to_message_id)
        bound = self._settings.rate.create_wait_seconds
        try:
            async with app.admission.creating(first_api, max_wait=bound) as deadline:
                return await self._create(app, request, idempotency_key, deadline)
        except BudgetBusy as exc:  # refused at the door: nothing was written
            raise FirstCardFailed(f"the first card could not be sent yet: {exc}", exc.retry_after) from exc

    def _first_api(self, app: AppContext, reply_to: str | None) -> str:
        """The API a create calls first: a card entity's create (CardKit), else the send or reply."""
        if self._settings.card.transport == "cardkit" and app.cardkit_scope.allowed():
            return "card_create"
        return "reply" if reply_to else "send"

    async def _create(
        self, app: AppContext, request: ev.CreateTaskRequest, idempotency_key: str | None, deadline: float
    ) -> CreatedTask:
        digest = None if idempotency_key is None else request_digest(request.model_dump_json())
        if idempotency_key is not None:
            earlier = await self._repo.find_by_idempotency_key(idempotency_key)
            if earlier is not None:
                return await self._finish_earlier(earlier, idempotency_key, digest, deadline)
        now = self._clock.wall()
        try:
            session_id = await self._repo.create_task(
                _new_task(
                    request,
                    app=app.name,
                    key=idempotency_key,
                    now=utc_datetime(now),
                    owner=self._owner,
                    digest=digest,
                )
            )
        except TaskConflict:
            if idempotency_key is None:
                raise
            racing = await self._repo.find_by_idempotency_key(idempotency_key)
            if racing is None:
                raise
            return await self._finish_earlier(racing, idempotency_key, digest, deadline)  # concurrent
        state = TaskState(
            session_id=session_id,
            requester_open_id=request.requester_open_id,
            receive_id=request.receive_id,
            receive_id_type=request.receive_id_type,
            title=request.title,
            locale=request.locale,
            app=app.name,
            started_at=now,
            last_event_at=now,
            fence=1 if self._owner is not None else 0,
        )
        return await self._send_first(state, request.reply_to_message_id, idempotency_key, deadline)

    async def _finish_earlier(
        self, record: TaskRecord, key: str, digest: str | None, deadline: float
    ) -> CreatedTask:
        """The key was used before: the same task, its first send completed if it never was.

        Only for the same request: the key reused for another (another chat, another requester) would
        hand someone else's task back, so it is refused.
        """
        if record.request_digest is not None and digest is not None and record.request_digest != digest:
            raise RequestRejected("Idempotency-Key", REUSED_KEY)
        if record.message_id is not None:
            return CreatedTask(record.session_id, record.message_id)
        return await self._send_first(state_from_record(record), record.reply_to_message_id, key, deadline)

    async def _send_first(
        self, state: TaskState, reply_to: str | None, key: str | None, deadline: float
    ) -> CreatedTask:
        built = build_card(card_context(self._settings, state, "").model(CardState(), (), self._clock.wall()))
        first = built.card
        uuid = first_card_uuid(state.session_id, key)
        app = self._apps.resolve(state.app)  # asked for again: its app is part of this request
        created: FirstBuild | None = None
        try:
            card_id = state.card_id
            if card_id is None:
                card_id = await self._card_entity(app, state.session_id, first, deadline)
                created = None if card_id is None else FirstBuild(built.answer)
            content = first if card_id is None else card_reference(card_id)
            async with self._paced(app, "reply" if reply_to else "send", deadline):
                if reply_to:
                    message_id = await app.client.reply_card(reply_to, content, uuid)
                else:
                    message_id = await app.client.send_card(
                        state.receive_id, state.receive_id_type, content, uuid
                    )
        except BudgetBusy as exc:
            await self._abandon(state.session_id, key, exc)
            raise FirstCardFailed(f"the first card could not be sent yet: {exc}", exc.retry_after) from exc
        except FeishuProgressError as exc:
            await self._abandon(state.session_id, key, exc)
            raise FirstCardFailed(f"the first card could not be sent: {type(exc).__name__}") from exc
        await self._repo.set_message_id(state.session_id, message_id)
        state.sent_as(message_id, card_id)  # not shared yet: attached right after
        # Only an entity this request created is known to show ``first`` (with its streaming window
        # opened just now); one an earlier request created is learnt by its first write, as after a restart.
        self._registry.attach(state, created=created)
        return CreatedTask(state.session_id, message_id)

    async def _card_entity(
        self, app: AppContext, session_id: int, first: dict[str, Any], deadline: float
    ) -> str | None:
        """A CardKit card entity showing ``first`` (streaming), saved on the task; None: PATCH this task."""
        if self._settings.card.transport != "cardkit" or not app.cardkit_scope.allowed():
            return None
        cardkit = self._settings.cardkit
        try:
            async with self._paced(app, "card_create", deadline):
                card_id = await app.client.create_card_entity(
                    entity_card(first, streams=True, typewriter=streaming_config(cardkit))
                )
        except BudgetBusy:
            raise  # not a CardKit failure: the create is answered 503, never quietly PATCHed instead
        except FeishuAPIError as exc:
            if exc.code == CARDKIT_SCOPE_MISSING:
                app.cardkit_scope.refused()
                log.warning(
                    "app %s lacks the CardKit scope (cardkit:card:write): new cards are PATCHed whole, "
                    "CardKit is tried again in %.0f s",
                    app.name,
                    cardkit.scope_recheck_seconds,
                )
            else:
                log.warning("task %s: CardKit card not created (%s): PATCHing it whole", session_id, exc.code)
            return None
        except FeishuProgressError as exc:
            log.warning("task %s: CardKit card not created (%r): PATCHing it whole", session_id, exc)
            return None
        if len(card_id) > MAX_REF_LENGTH:  # task_card.card_id holds 64 characters
            log.warning(
                "task %s: CardKit card id over %d characters: PATCHing it whole", session_id, MAX_REF_LENGTH
            )
            return None
        await self._repo.set_card_entity(session_id, card_id)
        return card_id

    def cardkit_problem(self, app: AppContext) -> str | None:
        """Why ``app``'s new tasks are PATCHed although the transport is cardkit (for /readyz), or None."""
        wait = app.cardkit_scope.seconds_left()
        if self._settings.card.transport != "cardkit" or wait <= 0:
            return None
        return (
            "the app lacks the CardKit scope (cardkit:card:write): new cards are PATCHed whole, "
            f"CardKit is tried again in {wait:.0f} s"
        )

    def _paced(self, app: AppContext, api: str, deadline: float) -> AbstractAsyncContextManager[None]:
        """The app's budget for ``api``, waited for until the create's ``deadline`` (then BudgetBusy)."""
        return app.admission.admit(api, max_wait=max(deadline - self._clock.monotonic(), 0.0))

    async def _abandon(self, session_id: int, key: str | None, exc: BaseException) -> None:
        log.warning("first card of task %s could not be sent: %r", session_id, exc)
        if key is not None:
            return  # kept: a retry with the same key resumes it with the same uuid
        try:
            await self._repo.delete_task(session_id)
        except Exception as delete_exc:
            log.warning("task %s could not be removed after its failed send: %s", session_id, delete_exc)


def _new_task(
    request: ev.CreateTaskRequest,
    *,
    app: str,
    key: str | None,
    now: Any,
    owner: str | None,
    digest: str | None,
) -> NewTask:
    return NewTask(
        app=app,
        receive_id=request.receive_id,
        receive_id_type=request.receive_id_type,
        requester_open_id=request.requester_open_id,
        now=now,
        title=request.title,
        reply_to_message_id=request.reply_to_message_id,
        locale=request.locale,
        session_id=request.session_id,
        idempotency_key=key,
        request_digest=digest,
        owner_instance=owner,
    )


def card_reference(card_id: str) -> dict[str, Any]:
    """A message's content that shows a card entity (sent once; the entity is then updated by id)."""
    return {"type": "card", "data": {"card_id": card_id}}


def first_card_uuid(session_id: int, key: str | None) -> str:
    """The send's dedupe uuid (≤ 50 characters): from the Idempotency-Key when there is one."""
    if key is None:
        return f"fp-task-{session_id}"
    return "fp-key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


__all__ = ["CreatedTask", "FirstCardFailed", "TaskConflict", "TaskCreator", "first_card_uuid"]

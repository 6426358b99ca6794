"""The task service: what the runtime API (HTTP or in-process) and card clicks ask of the tasks.

A thin front over the rooms that do the work (docs/architecture.md, "runtime/"):

- ``registry``    the tasks held in memory and their live cards (TaskRegistry)
- ``creator``     a new task and its first card, idempotently (TaskCreator)
- ``applier``     runtime events → state, subagent rows, live card, snapshot (EventApplier)
- ``snapshots``   what survives a restart: dirty tracking, saves, loading (SnapshotStore)
- ``action_log``  the user actions runtimes read, durable before a click is acknowledged (ActionLog)
- ``housekeeping`` silent tasks closed as 失去联系, finished tasks evicted, old dedupe keys purged

Nothing here lets a failing database or Feishu call crash a request: the card degrades, the failure is
logged once, the final state still goes out.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from feishu_progress.errors import UnknownTask
from feishu_progress.images import require_image
from feishu_progress.progress.scheduler import Deliverable
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.action_log import ActionLog
from feishu_progress.runtime.applier import EventApplier
from feishu_progress.runtime.creation import CreatedTask, TaskCreator
from feishu_progress.runtime.housekeeping import Housekeeping
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.runtime.registry import TaskRegistry
from feishu_progress.runtime.responses import ImageUploaded, TaskView, UserAction
from feishu_progress.runtime.snapshots import SnapshotStore
from feishu_progress.runtime.state import UPLOADED_IMAGE_PREFIX
from feishu_progress.runtime.task import Task

log = logging.getLogger(__name__)


@dataclass
class TaskService:
    registry: TaskRegistry
    creator: TaskCreator
    applier: EventApplier
    snapshots: SnapshotStore
    action_log: ActionLog
    housekeeping: Housekeeping
    images: ImageKeys

    async def create_task(
        self, request: ev.CreateTaskRequest, idempotency_key: str | None = None
    ) -> CreatedTask:
        return await self.creator.create(request, idempotency_key)

    async def task(self, session_id: int) -> Task | None:
        """The task, from memory or (evicted, or held by no one since a restart) from the database."""
        held = self.registry.get(session_id)
        if held is not None:
            return held
        state = await self.snapshots.load(session_id)
        if state is None:
            return None
        held = self.registry.get(session_id)  # loaded meanwhile by a concurrent request
        return held if held is not None else self.registry.attach(state)

    async def require(self, session_id: int) -> Task:
        task = await self.task(session_id)
        if task is None:
            raise UnknownTask(session_id)
        return task

    async def apply_events(self, session_id: int, batch: ev.EventBatch) -> int:
        """Apply a validated batch in order (TaskConflict after the task finished); returns how many."""
        return await self.applier.apply(await self.require(session_id), batch)

    async def add_image(self, session_id: int, data: bytes) -> ImageUploaded:
        """``POST /v1/tasks/{id}/images``: upload the bytes, answer the ``fpimg:`` ref a tool result names.

        The bytes must be a PNG, JPEG, GIF or WEBP (ImageRefused otherwise); they pass through the same
        bounded upload gate as every other image. The ref is the content's digest, so the same image
        uploaded twice is one ref and one Feishu upload.
        """
        task = await self.require(session_id)
        mime = require_image(data)
        assert self.images.uploads is not None
        image_key = await self.images.uploads.upload_image(data)
        ref = UPLOADED_IMAGE_PREFIX + hashlib.sha256(data).hexdigest()[:32]
        async with task.lock:
            task.state.add_uploaded_image(ref, image_key)
            task.sync_card()
            self.snapshots.mark_dirty(task)
        # Validated: the sniffed MIME type must be one the contract names.
        return ImageUploaded.model_validate(
            {"image_ref": ref, "image_key": image_key, "mime": mime, "bytes": len(data)}
        )

    async def view(self, session_id: int) -> TaskView:
        """``GET /v1/tasks/{id}``: status, round, message and the current card."""
        task = await self.require(session_id)
        state = task.state
        return TaskView(
            session_id=state.session_id,
            status=state.status,
            round=state.round,
            message_id=state.message_id,
            disliked=state.disliked,
            stop_reason=task.card.stopped_reason,
            card=task.card.render_current(),
        )

    async def wait_actions(self, session_id: int, after: int, wait: float) -> tuple[list[UserAction], int]:
        """``GET /v1/tasks/{id}/actions``: user actions after the cursor, long-polled up to ``wait`` s."""
        await self.require(session_id)
        return await self.action_log.wait(session_id, after, wait)

    async def restore(self) -> int:
        """Re-attach every unfinished task's live card after a restart; returns how many."""
        states = await self.snapshots.load_unfinished()
        for state in states:
            # Elapsed time moved on while we were down: show the card is alive again.
            self.registry.attach(state).card.subagents_changed()
        return len(states)

    # -- DeliveryListener: what the scheduler tells about cards -------------------------------------

    def final_delivered(self, card: Deliverable) -> None:
        task = self.registry.by_message(card.message_id)
        if task is not None:
            self.housekeeping.evict_finished(task)

    def card_stopped(self, card: Deliverable, reason: str) -> None:
        task = self.registry.by_message(card.message_id)
        if task is not None:
            task.state.stop_reason = reason
            self.snapshots.mark_dirty(task)

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

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from feishu_progress.apps import AppRegistry
from feishu_progress.background import BackgroundTasks
from feishu_progress.errors import NotWritableHere, TaskFinished, TooManyImages, TooManyLive, UnknownTask
from feishu_progress.images import require_image
from feishu_progress.images.uploads import Load
from feishu_progress.progress.scheduler import CardEnd, DeliveryScheduler
from feishu_progress.progress.slots import Deliverable
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.action_log import ActionLog
from feishu_progress.runtime.applier import EventApplier
from feishu_progress.runtime.creation import CreatedTask, TaskCreator
from feishu_progress.runtime.housekeeping import Housekeeping
from feishu_progress.runtime.registry import TaskRegistry
from feishu_progress.runtime.responses import ImageUploaded, TaskView, UserAction
from feishu_progress.runtime.snapshots import Saved, SnapshotStore
from feishu_progress.runtime.state import MAX_IMAGE_KEYS, UPLOADED_IMAGE_PREFIX, TaskState, request_digest
from feishu_progress.runtime.task import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Claim:
    """This instance writes the card now: at ``fence`` when it took the card from another writer (cluster
    mode), or at the fence it saved (None: single mode, where it always wrote it); nothing written before
    ``hold_until`` (the clock's monotonic time; 0: no wait), counted from the take so that loading the
    card overlaps the wait instead of adding to it.

    ``fence_moved``: the fence was just moved for this instance (a take), so it is a new epoch already. The
    scheduler holds a PATCHed card only (``CardWriter.refuses_stale_writes``): a CardKit card's sequences
    at the new fence count above every one the old writer could still send, so Feishu refuses a late
    write of its own accord.
    """

    fence: int | None = None
    hold_until: float = 0.0
    fence_moved: bool = False

    @property
    def taken(self) -> bool:
        """Taken from another writer: what Feishu shows may be that writer's, so it is written again first."""
        return self.fence is not None


class Ownership(Protocol):
    """Which instance holds which task (cluster/mode.py; single mode: topology.AlwaysTheWriter)."""

    def may_write(self) -> bool: ...

    async def claim(self, session_id: int) -> Claim | None:
        """This instance writes the task from now on (a Claim), or OwnedElsewhere; None: no such task."""
        ...

    def release_later(self, session_ids: Sequence[int]) -> None: ...


def _uploaded_ref(data: bytes) -> str:
    return UPLOADED_IMAGE_PREFIX + hashlib.sha256(data).hexdigest()[:32]


def _check_image_room(state: TaskState, ref: str) -> None:
    """Whether the task takes the uploaded image ``ref`` (one it already holds needs no new room)."""
    if state.status.is_terminal:
        raise TaskFinished(f"task {state.session_id} has finished")
    if ref not in state.image_keys and len(state.image_keys) >= MAX_IMAGE_KEYS:
        raise TooManyImages("image", f"a task may hold at most {MAX_IMAGE_KEYS} images")


@dataclass
class TaskService:
    registry: TaskRegistry
    creator: TaskCreator
    applier: EventApplier
    snapshots: SnapshotStore
    action_log: ActionLog
    housekeeping: Housekeeping
    apps: AppRegistry
    ownership: Ownership  # the topology's (topology.py): single mode always writes, cluster mode claims
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    max_live: int | None = None  # FP_TASK__MAX_LIVE: creates past it raise TooManyLive
    # A lock (and how many wait for it) per task being loaded (``_loading``).
    _loads: dict[int, tuple[asyncio.Lock, int]] = field(default_factory=dict, init=False, repr=False)

    async def create_task(
        self, request: ev.CreateTaskRequest, idempotency_key: str | None = None
    ) -> CreatedTask:
        """Create a task (one per Idempotency-Key; the key reused for another request: EventRejected;
        TooManyLive when this process already holds ``max_live`` live tasks)."""
        if self.max_live is not None and len(self.registry) >= self.max_live:
            raise TooManyLive(f"this instance holds {len(self.registry)} live tasks (FP_TASK__MAX_LIVE)")
        return await self.creator.create(request, idempotency_key)

    async def task(self, session_id: int) -> Task | None:
        """The task, from memory or (evicted, or held by no one since a restart) from the database.

        Cluster mode: only the instance that writes a card holds its task; asking for one another live
        instance writes raises OwnedElsewhere (the web layer forwards the request there), and a task
        nobody live writes is taken here first.
        """
        held = self.registry.get(session_id)
        if not self.ownership.may_write():
            raise NotWritableHere(f"task {session_id}: this instance's lease lapsed")
        if held is not None:
            return held
        claim = await self.ownership.claim(session_id)  # OwnedElsewhere: not loaded here (no lock)
        if claim is None:
            return None
        async with self._loading(session_id):
            held = self.registry.get(session_id)  # loaded meanwhile (a takeover, another request)
            return held if held is not None else await self._load(session_id, claim)

    async def adopt(self, session_id: int, claim: Claim) -> Task | None:
        """Hold a task this instance just took (from a dead or departed instance, or after a restart)."""
        async with self._loading(session_id):
            held = self.registry.get(session_id)
            if held is not None and (claim.fence is None or held.state.fence >= claim.fence):
                return held  # a request loaded it at this epoch while the take was under way
            self.registry.drop([session_id])  # a stale copy from before a lapse of the lease, if any
            return await self._load(session_id, claim)

    @contextlib.asynccontextmanager
    async def _loading(self, session_id: int) -> AsyncIterator[None]:
        """One load of a task at a time in this process: two would race each other for its fence."""
        lock, users = self._loads.get(session_id, (asyncio.Lock(), 0))
        self._loads[session_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._loads[session_id]
            if users == 1:
                del self._loads[session_id]
            else:
                self._loads[session_id] = (lock, users - 1)

    async def _load(self, session_id: int, claim: Claim) -> Task | None:
        state = await self.snapshots.load(session_id)
        if state is None:
            return None
        if claim.fence is not None:
            state.hold_at(claim.fence)
        if not claim.fence_moved and not await self.snapshots.new_epoch(state):
            log.warning("task %s: its card changed hands while it was loaded", session_id)
            return None
        await self._replay_actions(state)
        held = self.registry.get(session_id)  # loaded meanwhile by a concurrent request
        if held is not None:
            return held
        task = self.registry.attach(state)
        if claim.hold_until > 0:
            self._scheduler_of(task).hold(task.card, claim.hold_until)
        # Batches others logged for it, soon (after the hold: applying them may schedule a write). Not
        # awaited: a takeover loads a dead instance's cards by the dozen, and a batch that
        # arrives first applies them itself before its own.
        self.background.spawn(self._catch_up_events(task), name="catch-up-logged")
        if claim.taken or not state.status.is_terminal:
            # What Feishu shows may predate the saved state, or come from a gone writer: a taken card's
            # first write goes ahead of ordinary updates (as a final would).
            task.card.resend(urgent=claim.taken)
        return task

    async def _replay_actions(self, state: TaskState) -> bool:
        """Clicks logged after this state was saved (recorded elsewhere, or before a crash)."""
        records = await self.action_log.since(state.session_id, state.actions_applied)
        for record in records:
            state.apply_logged_action(record.id, record.kind, record.payload)
        return bool(records)

    async def replay_actions(self, session_id: int) -> None:
        """Another instance recorded a click or a batch for a task held here: apply it (cluster nudge)."""
        task = self.registry.get(session_id)
        if task is None or not self.ownership.may_write():
            return  # not held, or maybe no longer ours (a lapsed lease): its writer replays it
        async with task.lock:
            if await self._replay_actions(task.state):
                task.sync_card()
                self.snapshots.mark_dirty(task)
        await self._catch_up_events(task)

    async def _catch_up_events(self, task: Task) -> None:
        """Apply the batches other instances logged for this task; a failure leaves them for later.

        The next batch this instance applies, or the cluster's scan for logged batches, tries again.
        """
        try:
            await self.applier.catch_up(task)
        except Exception as exc:
            log.warning("task %s: logged batches not applied yet: %s", task.session_id, type(exc).__name__)

    def drop_local(self, session_ids: Sequence[int]) -> None:
        """Forget tasks another instance writes now (this one was paused or cut off)."""
        self.registry.drop(session_ids)
        for session_id in session_ids:
            self.snapshots.forget(session_id)

    async def require(self, session_id: int) -> Task:
        task = await self.task(session_id)
        if task is None:
            raise UnknownTask(session_id)
        return task

    async def apply_events(
        self,
        session_id: int,
        batch: ev.EventBatch,
        idempotency_key: str | None = None,
        body_digest: str | None = None,
    ) -> int:
        """Apply a validated batch in order (TaskFinished after the task finished); returns how many.

        With an Idempotency-Key the batch's digest is kept: the key sent again with other events is an
        EventRejected on ``Idempotency-Key``, not a repeat answered without applying them. The web
        layer passes ``body_digest`` (of the raw body: cheaper than serialising the batch again).
        """
        body = body_digest
        if body is None and idempotency_key is not None:
            body = request_digest(batch.model_dump_json())
        return await self.applier.apply(await self.require(session_id), batch, idempotency_key, body)

    async def add_image(self, session_id: int, data: bytes) -> ImageUploaded:
        """``add_image_from`` for bytes already in memory."""

        async def given() -> bytes:
            return data

        return await self.add_image_from(session_id, given)

    async def add_image_from(
        self, session_id: int, load: Load, *, max_wait: float | None = None
    ) -> ImageUploaded:
        """``POST /v1/tasks/{id}/images``: upload the bytes, answer the ``fpimg:`` ref a tool result names.

        The bytes must be a PNG, JPEG, GIF or WEBP (ImageRefused otherwise). They are read (``load``)
        only once one of the upload gate's slots is held (UploadsBusy when none frees within
        ``max_wait``), and uploaded only if the task still takes them: not finished (TaskFinished,
        also before the read), not at its image cap (TooManyImages) — refused images cost no upload. The ref
        is the content's digest, so the same image uploaded twice is one ref and one Feishu upload.
        """
        task = await self.require(session_id)
        if task.state.status.is_terminal:  # nothing to read; the cap needs the bytes (a held ref is fine)
            raise TaskFinished(f"task {session_id} has finished")
        uploads = self.apps.get(task.state.app).images.uploads  # an image key belongs to an app
        assert uploads is not None
        read: list[bytes] = []

        def still_room(data: bytes) -> None:
            read.append(data)
            _check_image_room(task.state, _uploaded_ref(data))

        image_key = await uploads.upload_from(load, max_wait=max_wait, check=still_room)
        data = read[0]
        ref = _uploaded_ref(data)
        async with task.lock:
            task.state.add_uploaded_image(ref, image_key)
            task.sync_card()
            self.snapshots.mark_dirty(task)
        # Validated: the sniffed MIME type must be one the contract names.
        return ImageUploaded.model_validate(
            {"image_ref": ref, "image_key": image_key, "mime": require_image(data), "bytes": len(data)}
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
            app=state.app,
            card=task.card.render_current(),
        )

    async def wait_actions(self, session_id: int, after: int, wait: float) -> tuple[list[UserAction], int]:
        """``GET /v1/tasks/{id}/actions``: user actions after the cursor, long-polled up to ``wait`` s.

        Served from the action log by any instance (it does not take the task).
        """
        if self.registry.get(session_id) is None and await self.snapshots.load(session_id) is None:
            raise UnknownTask(session_id)
        return await self.action_log.wait(session_id, after, wait)

    async def restore(self) -> int:
        """Single mode: re-attach every unfinished task's live card after a restart; returns how many."""
        states = [state for state in await self.snapshots.load_unfinished() if self._app_known(state)]
        await self.snapshots.new_epochs(states)
        for state in states:
            await self._replay_actions(state)
            # What Feishu shows may predate the last save: the newest state goes out again.
            self.registry.attach(state).card.resend()
        return len(states)

    def _app_known(self, state: TaskState) -> bool:
        if state.app in self.apps.names():
            return True
        log.error(
            "task %s belongs to app %r, which is not configured (known: %s): its card is left as it is",
            state.session_id,
            state.app,
            ", ".join(self.apps.names()),
        )
        return False

    def _scheduler_of(self, task: Task) -> DeliveryScheduler:
        return self.apps.get(task.state.app).scheduler

    # -- what the schedulers tell about cards -------------------------------------------------------

    async def follow_card_ends(self, ends: asyncio.Queue[CardEnd | None]) -> None:
        """Act on each card a scheduler is done with, until it stops (the finals it flushes included)."""
        while (end := await ends.get()) is not None:
            try:
                if end.reason is None:
                    self.final_delivered(end.card)
                else:
                    self.card_stopped(end.card, end.reason)
            except Exception:  # one card's end must not stop hearing about the others
                log.exception("handling the end of the card of message %s failed", end.card.message_id)

    def final_delivered(self, card: Deliverable) -> None:
        task = self.registry.by_message(card.message_id)
        if task is None:
            return
        if self.snapshots.is_dirty(task.session_id):
            # The final can reach Feishu before the save of the state that made it ends: evict after it.
            self.background.spawn(self._evict_once_saved(task), name="evict-finished")
        else:
            self._evict(task)

    async def _evict_once_saved(self, task: Task) -> None:
        if await self.snapshots.save_now(task) is Saved.NOW:
            self._evict(task)  # otherwise the housekeeping sweep evicts it once saved

    def _evict(self, task: Task) -> None:
        if self.housekeeping.evict_finished(task):
            self.ownership.release_later([task.session_id])  # done: nobody need take it over

    def card_stopped(self, card: Deliverable, reason: str) -> None:
        task = self.registry.by_message(card.message_id)
        if task is not None:
            self.background.spawn(self._stopped(task, reason), name="card-stopped")

    async def _stopped(self, task: Task, reason: str) -> None:
        async with task.lock:  # like every change of the state: a batch may be mid-apply
            task.state.card_stopped(reason)
        self.snapshots.mark_dirty(task)

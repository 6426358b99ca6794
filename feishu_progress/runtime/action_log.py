"""The log of user actions runtimes read: written durably before a click is acknowledged, long-polled.

A click is answered "done" only after its action is in the database (issue: a long answers payload used
to be dropped after the user was told it was submitted). Writes go through a group commit, so 200
simultaneous clicks cost a few transactions, not 200 queued behind one lock. Each action carries its
click's dedupe key (unique in the table): a click recorded twice — Feishu's redelivery racing the first —
is in the log once, and the runtime sees it once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence

from sqlalchemy.exc import IntegrityError

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.repo import ActionRecord, ActionRepository, NewAction
from feishu_progress.group_commit import GroupCommit
from feishu_progress.ports import Clock
from feishu_progress.runtime.responses import USER_ACTION, UserAction
from feishu_progress.waiting import event_or_timeout

log = logging.getLogger(__name__)

MAX_ACTIONS_PER_ANSWER = 100
_INTEGRITY_RETRIES = 3


class ActionLog:
    """Appends actions (group-committed) and answers the runtime's long-polls."""

    def __init__(
        self,
        repo: ActionRepository,
        clock: Clock,
        background: BackgroundTasks,
        *,
        nudge: Callable[[int], None],
        poll_interval: float,
    ) -> None:
        """``nudge(session_id)`` tells the other instances (their long-polls, the card's writer) of a new
        action (single mode: nobody to tell); long-polls look at the table at least every
        ``poll_interval`` seconds (cluster mode: a peer's nudge may be lost; single mode: ``inf``)."""
        self._repo = repo
        self._clock = clock
        self._writes: GroupCommit[NewAction, tuple[ActionRecord, bool]] = GroupCommit(
            self._append, background, name="actions"
        )
        self._waiters: dict[int, asyncio.Event] = {}  # one per session with a long-poll waiting
        self._stopping = False
        self._polls: dict[int, int] = {}
        self._nudge = nudge
        self._poll_interval = poll_interval

    async def record(self, action: NewAction) -> ActionRecord:
        """Append ``action`` durably; a repeat of a logged dedupe key gives back the first record."""
        record, _ = await self._writes.submit(action)
        self.notify(action.session_id)
        self._nudge(action.session_id)
        return record

    async def since(self, session_id: int, after: int) -> list[ActionRecord]:
        """Every action of the session after the cursor (to re-apply what a saved state has not seen)."""
        found: list[ActionRecord] = []
        while batch := await self._repo.list_after(session_id, after, MAX_ACTIONS_PER_ANSWER):
            found.extend(batch)
            after = batch[-1].id
            if len(batch) < MAX_ACTIONS_PER_ANSWER:
                break
        return found

    async def _append(self, actions: Sequence[NewAction]) -> list[tuple[ActionRecord, bool]]:
        for attempt in range(_INTEGRITY_RETRIES):
            try:
                return await self._repo.append_many(actions)
            except IntegrityError:
                # Another writer (an instance, a racing batch) logged one of these keys first: look again.
                if attempt == _INTEGRITY_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def notify(self, session_id: int) -> None:
        """Wake the long-polls of ``session_id`` (an action was recorded, here or by another instance)."""
        waiter = self._waiters.get(session_id)
        if waiter is not None:
            waiter.set()

    def stop_waiting(self) -> None:
        """Shutdown: every long-poll answers now with what it has (the runtime polls again elsewhere or
        after the restart); a server waiting for them would hold its stop for up to a whole poll."""
        self._stopping = True
        for waiter in self._waiters.values():
            waiter.set()

    async def wait(self, session_id: int, after: int, wait: float) -> tuple[list[UserAction], int]:
        """Actions after the cursor ``after``; waits up to ``wait`` seconds for the first one."""
        deadline = self._clock.monotonic() + wait
        waiter = self._waiters.setdefault(session_id, asyncio.Event())
        self._polls[session_id] = self._polls.get(session_id, 0) + 1
        try:
            while True:
                waiter.clear()
                records = await self._repo.list_after(session_id, after, MAX_ACTIONS_PER_ANSWER)
                remaining = deadline - self._clock.monotonic()
                if records or remaining <= 0 or self._stopping:
                    break
                await event_or_timeout(waiter, self._clock, min(remaining, self._poll_interval))
        finally:
            self._polls[session_id] -= 1
            if not self._polls[session_id]:
                del self._polls[session_id], self._waiters[session_id]
        return [_user_action(record) for record in records], (records[-1].id if records else after)


def _user_action(record: ActionRecord) -> UserAction:
    # Validated into the response model: a row the contract cannot describe fails here, not in a runtime.
    return USER_ACTION.validate_python(
        {
            "cursor": record.id,
            "kind": record.kind,
            "operator_open_id": record.operator_open_id,
            "payload": json.loads(record.payload) if isinstance(record.payload, str) else record.payload,
            "created_at": record.created_at.isoformat().replace("+00:00", "Z"),
        }
    )

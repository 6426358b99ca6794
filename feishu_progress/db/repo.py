"""Small repositories over the Database: each method is its own short transaction.

They return frozen records, never ORM objects, so nothing lazy-loads outside a session. Datetimes
are aware UTC both ways (``models.UtcDateTime`` converts at the column).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.engine import Database
from feishu_progress.db.models import (
    CallbackSeen,
    SessionRow,
    SubagentExecution,
    TaskAction,
    TaskCard,
    TaskEventLog,
)
from feishu_progress.domain import InvocationType, SubagentStatus, TaskStatus
from feishu_progress.errors import TaskExists, UnknownTask
from feishu_progress.group_commit import GroupCommit

# VARCHAR(191) keys: longer ones are replaced by a digest, which keeps them unique and indexable.
MAX_KEY_LENGTH = 191
MAX_TITLE_LENGTH = 255
MAX_REF_LENGTH = 64
CARDKIT_TRANSPORT = "cardkit"  # task_card.transport of a card entity
UNFINISHED_STATUSES = (TaskStatus.RUNNING.value, TaskStatus.WAITING.value)


def storable_key(key: str) -> str:
    """``key`` itself when it fits the 191-character columns, else ``sha256:<hex>`` of it."""
    if len(key) <= MAX_KEY_LENGTH:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def stored_idempotency_key(key: str) -> str:
    """``storable_key`` for a runtime's Idempotency-Key: a key that itself reads ``sha256:…`` is hashed
    too, so it cannot collide with the long key whose hash it spells."""
    if key.startswith("sha256:"):
        return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()
    return storable_key(key)


def _fit(value: str | None, limit: int) -> str | None:
    return None if value is None else value[:limit]


def _check_ref(name: str, value: str | None) -> None:
    if value is not None and len(value) > MAX_REF_LENGTH:
        raise ValueError(f"{name} is longer than {MAX_REF_LENGTH} characters")


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task's card row plus its session title."""

    session_id: int
    title: str | None
    receive_id: str
    receive_id_type: str
    reply_to_message_id: str | None
    message_id: str | None
    requester_open_id: str
    locale: str | None
    status: TaskStatus
    round: int
    snapshot: str | None  # JSON owned by progress/; None until the first save_state
    disliked: bool
    stop_reason: str | None
    started_at: datetime
    last_event_at: datetime
    finished_at: datetime | None
    idempotency_key: str | None = None
    request_digest: str | None = None  # of the create request that came with the key
    fence: int = 0
    owner_instance: str | None = None
    card_id: str | None = None  # the CardKit card entity (None: the message is PATCHed whole)
    app: str = "default"  # the Feishu/Lark app the card belongs to


@dataclass(frozen=True, slots=True)
class NewTask:
    """What ``TaskRepository.create_task`` stores for a new task."""

    receive_id: str
    receive_id_type: str
    requester_open_id: str
    now: datetime
    title: str | None = None
    reply_to_message_id: str | None = None
    locale: str | None = None
    session_id: int | None = None  # the runtime's own id; generated when None
    idempotency_key: str | None = None
    request_digest: str | None = None  # ``state.request_digest`` of the request, kept with the key
    owner_instance: str | None = None  # cluster mode: the instance that creates it writes it (fence 1)
    app: str = "default"  # the Feishu/Lark app that sends and writes the card


@dataclass(frozen=True, slots=True)
class NewAction:
    """One user action to append to the log; ``dedupe_key`` makes a repeat a no-op."""

    session_id: int
    kind: str
    operator_open_id: str
    payload: Mapping[str, Any]
    dedupe_key: str
    now: datetime


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One user action in the log; ``id`` is the runtime's cursor."""

    id: int
    session_id: int
    kind: str
    operator_open_id: str
    payload: dict[str, Any]
    dedupe_key: str | None
    created_at: datetime


def _task_record(card: TaskCard, title: str | None) -> TaskRecord:
    return TaskRecord(
        session_id=card.session_id,
        title=title,
        receive_id=card.receive_id,
        receive_id_type=card.receive_id_type,
        reply_to_message_id=card.reply_to_message_id,
        message_id=card.message_id,
        requester_open_id=card.requester_open_id,
        locale=card.locale,
        status=TaskStatus(card.status),
        round=card.round,
        snapshot=card.snapshot,
        disliked=bool(card.disliked),
        stop_reason=card.stop_reason,
        started_at=card.started_at,
        last_event_at=card.last_event_at,
        finished_at=card.finished_at,
        idempotency_key=card.idempotency_key,
        request_digest=card.request_digest,
        fence=int(card.fence or 0),
        owner_instance=card.owner_instance,
        card_id=card.card_id if card.transport == CARDKIT_TRANSPORT else None,
        app=card.app,
    )


def _task_card(session_id: int, task: NewTask) -> TaskCard:
    return TaskCard(
        session_id=session_id,
        receive_id=task.receive_id,
        receive_id_type=task.receive_id_type,
        reply_to_message_id=task.reply_to_message_id,
        requester_open_id=task.requester_open_id,
        locale=task.locale,
        status=TaskStatus.RUNNING.value,
        round=0,
        started_at=task.now,
        last_event_at=task.now,
        idempotency_key=None
        if task.idempotency_key is None
        else stored_idempotency_key(task.idempotency_key),
        request_digest=task.request_digest,
        owner_instance=task.owner_instance,
        fence=1 if task.owner_instance else 0,
        app=task.app,
    )


def _state_params(row: StateRow) -> dict[str, Any]:
    params = {name: getattr(row, name) for name in _STATE_FIELDS}
    return params | {"session_id": row.session_id, "status": TaskStatus(row.status).value}


def _action_record(row: TaskAction) -> ActionRecord:
    return ActionRecord(
        id=row.id,
        session_id=row.session_id,
        kind=row.kind,
        operator_open_id=row.operator_open_id,
        payload=json.loads(row.payload),
        dedupe_key=row.dedupe_key,
        created_at=row.created_at,
    )


def _inserted_id(result: Any) -> int:
    """The primary key a Core INSERT created (both SQLite and MySQL report it)."""
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise RuntimeError("the database did not report the inserted id")
    return int(key[0])


@dataclass(frozen=True, slots=True)
class StateRow:
    """One card's state for ``TaskRepository.save_states``."""

    session_id: int
    status: str
    round: int
    snapshot: str
    last_event_at: datetime
    finished_at: datetime | None = None
    disliked: bool = False
    stop_reason: str | None = None
    fence: int = 0  # cluster mode: saved only while this fence is the card's (see ``save_states``)


# The task_card columns a save writes: StateRow's fields but the key and the fence it is conditioned on.
_STATE_FIELDS = tuple(field.name for field in fields(StateRow) if field.name not in ("session_id", "fence"))


class TaskRepository:
    """Tasks: a session row plus the live card row that survives restarts."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_task(self, task: NewTask) -> int:
        """Create the session and its RUNNING card row; returns the session id.

        Raises ``TaskExists`` when the runtime's session id or idempotency key is already taken.
        """
        try:
            async with self._db.session() as session:
                row = SessionRow(id=task.session_id, title=_fit(task.title, MAX_TITLE_LENGTH))
                session.add(row)
                await session.flush()
                session.add(_task_card(row.id, task))
                return row.id
        except IntegrityError:
            raise TaskExists("that session id or idempotency key is already taken") from None

    async def find_by_idempotency_key(self, key: str) -> TaskRecord | None:
        """The task a runtime created with this Idempotency-Key, if any."""
        return await self._one(TaskCard.idempotency_key == stored_idempotency_key(key))

    async def delete_task(self, session_id: int) -> None:
        """Remove a task whose first card could not be sent (nothing half-made stays behind)."""
        async with self._db.session() as session:
            await session.execute(delete(TaskCard).where(TaskCard.session_id == session_id))
            await session.execute(delete(SessionRow).where(SessionRow.id == session_id))

    async def _update_card(self, session_id: int, values: Mapping[str, Any]) -> None:
        async with self._db.session() as session:
            result = await session.execute(
                update(TaskCard).where(TaskCard.session_id == session_id).values(**values)
            )
            # The MySQL dialect counts matched rows (CLIENT.FOUND_ROWS), so 0 really means absent.
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise UnknownTask(session_id)

    async def set_message_id(self, session_id: int, message_id: str) -> None:
        """Remember the Feishu message the card lives in."""
        await self._update_card(session_id, {"message_id": message_id})

    async def set_card_entity(self, session_id: int, card_id: str) -> None:
        """Remember the CardKit card entity the task's message shows (saved before it is sent)."""
        await self._update_card(session_id, {"transport": CARDKIT_TRANSPORT, "card_id": card_id})

    async def next_fence(self, session_id: int, fence: int) -> int | None:
        """Begin a new writing epoch of a card held at ``fence`` (a CardKit card's sequences then count
        above every earlier writer's): the new fence, or None when the card's fence moved meanwhile."""
        statement = (
            update(TaskCard)
            .where(TaskCard.session_id == session_id, TaskCard.fence == fence)
            .values(fence=TaskCard.fence + 1)
        )
        async with self._db.session() as session:
            result = await session.execute(statement)
        return fence + 1 if result.rowcount == 1 else None  # type: ignore[attr-defined]

    async def next_fences(self, session_ids: Sequence[int]) -> None:
        """Single mode, at start: a new writing epoch for every card in ``session_ids`` at once."""
        if not session_ids:
            return
        statement = (
            update(TaskCard)
            .where(TaskCard.session_id.in_(list(session_ids)))
            .values(fence=TaskCard.fence + 1)
        )
        async with self._db.session() as session:
            await session.execute(statement)

    async def save_states(self, rows: Sequence[StateRow], owner: str | None = None) -> list[int]:
        """Persist cards' latest states in one statement; the session ids that were NOT saved.

        Single mode (``owner`` None): by primary key, every row is saved. Cluster mode: a row is saved only
        while ``owner`` still writes that card at the row's fence — an instance that lost a card (paused,
        cut off, taken over) cannot overwrite what the new owner saves; those ids come back.
        """
        if not rows:
            return []
        params = [_state_params(row) for row in rows]
        if owner is None:
            async with self._db.session() as session:
                await session.execute(update(TaskCard), params)  # ORM bulk UPDATE by primary key
            return []
        return await self._save_fenced(rows, params, owner)

    async def _save_fenced(
        self, rows: Sequence[StateRow], params: list[dict[str, Any]], owner: str
    ) -> list[int]:
        statement = (
            update(TaskCard)
            .where(
                TaskCard.session_id == bindparam("b_session_id"),
                TaskCard.fence == bindparam("b_fence"),
                TaskCard.owner_instance == owner,
            )
            .values({name: bindparam(f"b_{name}") for name in _STATE_FIELDS})
        )
        bound = [
            {f"b_{key}": value for key, value in (param | {"fence": row.fence}).items()}
            for param, row in zip(params, rows, strict=True)
        ]
        async with self._db.engine.begin() as connection:
            result = await connection.execute(statement, bound)
            if result.rowcount == len(rows):
                return []
            fences = {row.session_id: row.fence for row in rows}
            held = await connection.execute(
                select(TaskCard.session_id, TaskCard.fence, TaskCard.owner_instance).where(
                    TaskCard.session_id.in_(list(fences))
                )
            )
        kept = {sid for sid, fence, who in held if who == owner and fence == fences[sid]}
        return [sid for sid in fences if sid not in kept]

    async def get(self, session_id: int) -> TaskRecord | None:
        """The task, or None when there is no such session."""
        return await self._one(TaskCard.session_id == session_id)

    async def _one(self, condition: Any) -> TaskRecord | None:
        async with self._db.session() as session:
            row = (
                await session.execute(
                    select(TaskCard, SessionRow.title)
                    .join(SessionRow, SessionRow.id == TaskCard.session_id)
                    .where(condition)
                )
            ).one_or_none()
        return None if row is None else _task_record(row[0], row[1])

    async def list_unfinished(self) -> list[TaskRecord]:
        """Tasks still RUNNING or WAITING (re-attached after a restart), oldest first."""
        async with self._db.session() as session:
            rows = (
                await session.execute(
                    select(TaskCard, SessionRow.title)
                    .join(SessionRow, SessionRow.id == TaskCard.session_id)
                    .where(TaskCard.status.in_(UNFINISHED_STATUSES))
                    .order_by(TaskCard.session_id)
                )
            ).all()
        return [_task_record(card, title) for card, title in rows]


@dataclass(frozen=True, slots=True)
class SubagentStart:
    """Create a child session and a RUNNING execution (idempotent on parent + task_ref)."""

    parent_session_id: int
    task_ref: str
    child_external_id: str | None
    agent_type: str | None
    title: str | None
    task_description: str | None
    invocation: str
    now: datetime


@dataclass(frozen=True, slots=True)
class SubagentUpdate:
    """Change one execution's columns (LookupError when it does not exist)."""

    execution_id: int
    values: Mapping[str, Any]


SubagentWrite = SubagentStart | SubagentUpdate
# Per write: the execution id (a start), None (an update), or the error that write alone met.
SubagentWritten = int | None | LookupError


class SubagentRepository:
    """Subagent executions and their child sessions.

    Writes go through a group commit when the repository has a ``background`` task holder (the running
    service): every start, status change and finish submitted while a transaction runs shares the next
    one, so a burst of subagent events across many tasks costs a few transactions, not one each
    (the hot spot on the event path at 1,000 live cards). Each caller still gets its answer only once
    its write is durable.
    """

    def __init__(self, db: Database, background: BackgroundTasks | None = None) -> None:
        self._db = db
        self._commit: GroupCommit[SubagentWrite, SubagentWritten] | None = (
            None if background is None else GroupCommit(self.write_many, background, name="subagent-rows")
        )

    async def start(  # noqa: PLR0917 - positional order is the documented contract
        self,
        parent_session_id: int,
        task_ref: str,
        child_external_id: str | None,
        agent_type: str | None,
        title: str | None,
        task_description: str | None,
        invocation_type: InvocationType | str,
        now: datetime,
    ) -> int:
        """Create the child session and a RUNNING execution; idempotent on (parent, task_ref)."""
        _check_ref("task_ref", task_ref)  # checked here: a bad write never shares a transaction
        _check_ref("child_external_id", child_external_id)
        _check_ref("agent_type", agent_type)
        start = SubagentStart(
            parent_session_id,
            task_ref,
            child_external_id,
            agent_type,
            title,
            task_description,
            InvocationType(invocation_type).value,
            now,
        )
        execution_id = await self._submit(start)
        assert isinstance(execution_id, int)
        return execution_id

    async def set_status(self, execution_id: int, status: SubagentStatus | str) -> None:
        """Change the status (RUNNING <-> RECOVERING, or a terminal one without rounds)."""
        await self._submit(SubagentUpdate(execution_id, {"status": SubagentStatus(status).value}))

    async def finish(
        self, execution_id: int, status: SubagentStatus | str, total_rounds: int, now: datetime
    ) -> None:
        """Record the terminal status, the rounds it took and when it ended."""
        values = {
            "status": SubagentStatus(status).value,
            "total_rounds": total_rounds,
            "finished_at": now,
        }
        await self._submit(SubagentUpdate(execution_id, values))

    async def _submit(self, write: SubagentWrite) -> int | None:
        if self._commit is None:
            (written,) = await self.write_many([write])
        else:
            written = await self._commit.submit(write)
        if isinstance(written, LookupError):
            raise written
        return written

    async def write_many(self, writes: Sequence[SubagentWrite]) -> list[SubagentWritten]:
        """Every write in ONE transaction, in order; per write its result (see ``SubagentWritten``).

        Starts whose (parent, task_ref) exists are answered with the existing id (one query for all). If
        a concurrent writer elsewhere inserts one meanwhile, the transaction is rolled back and every
        write is done on its own, as without a group commit.
        """
        try:
            async with self._db.engine.begin() as connection:
                return await self._write_all(connection, writes)
        except IntegrityError:
            if len(writes) == 1 and isinstance(writes[0], SubagentStart):
                winner = await self.find(writes[0].parent_session_id, writes[0].task_ref)
                if winner is None:
                    raise
                return [winner]  # lost a race with a concurrent start: the winner's row is the answer
            return [(await self.write_many([write]))[0] for write in writes]

    async def _write_all(
        self, connection: AsyncConnection, writes: Sequence[SubagentWrite]
    ) -> list[SubagentWritten]:
        # Core statements over whole batches, not the ORM unit of work nor one statement per write: this is
        # on the event path, and on SQLite every statement costs several hops to aiosqlite's thread
        # (~250 us of CPU for a SELECT 1, against 12 us of SQLite work for a whole start and finish).
        starts = [write for write in writes if isinstance(write, SubagentStart)]
        started = await _existing_starts(connection, starts)
        fresh: dict[tuple[int, str], SubagentStart] = {}  # the first start of each new (parent, task_ref)
        for start in starts:
            if (start.parent_session_id, start.task_ref) not in started:
                fresh.setdefault((start.parent_session_id, start.task_ref), start)
        if fresh:
            started.update(zip(fresh, await _insert_starts(connection, list(fresh.values())), strict=True))
        updated = iter(
            await _update_executions(connection, [w for w in writes if isinstance(w, SubagentUpdate)])
        )
        return [
            started[(write.parent_session_id, write.task_ref)]
            if isinstance(write, SubagentStart)
            else next(updated)
            for write in writes
        ]

    async def find(self, parent_session_id: int, task_ref: str) -> int | None:
        """The execution id of ``task_ref`` under the parent, or None."""
        async with self._db.session() as session:
            found: int | None = await session.scalar(
                select(SubagentExecution.id).where(
                    SubagentExecution.parent_session_id == parent_session_id,
                    SubagentExecution.task_ref == task_ref,
                )
            )
        return found


async def _existing_starts(
    connection: AsyncConnection, starts: Sequence[SubagentStart]
) -> dict[tuple[int, str], int]:
    if not starts:
        return {}
    parents = {start.parent_session_id for start in starts}
    refs = {start.task_ref for start in starts}
    rows = await connection.execute(
        select(SubagentExecution.parent_session_id, SubagentExecution.task_ref, SubagentExecution.id).where(
            SubagentExecution.parent_session_id.in_(parents), SubagentExecution.task_ref.in_(refs)
        )
    )
    return {(int(parent), str(ref)): int(execution_id) for parent, ref, execution_id in rows}


_SESSIONS = cast(Table, SessionRow.__table__)
_EXECUTIONS = cast(Table, SubagentExecution.__table__)


async def _insert_starts(connection: AsyncConnection, starts: Sequence[SubagentStart]) -> list[int]:
    """Child sessions, then RUNNING executions, for ``starts``: their execution ids, in order."""
    children = await _inserted_ids(
        connection,
        _SESSIONS,
        [
            {
                "title": _fit(start.title, MAX_TITLE_LENGTH),
                "parent_session_id": start.parent_session_id,
                "external_id": start.child_external_id,
            }
            for start in starts
        ],
    )
    return await _inserted_ids(
        connection,
        _EXECUTIONS,
        [
            {
                "parent_session_id": start.parent_session_id,
                "task_ref": start.task_ref,
                "child_session_id": child,
                "agent_type": start.agent_type,
                "task_description": start.task_description,
                "status": SubagentStatus.RUNNING.value,
                "invocation_type": start.invocation,
                "total_rounds": 0,
                "started_at": start.now,
            }
            for start, child in zip(starts, children, strict=True)
        ],
    )


async def _inserted_ids(connection: AsyncConnection, table: Table, rows: list[dict[str, Any]]) -> list[int]:
    """Insert ``rows`` — in one statement where the database allows — and return their ids, in order."""
    dialect = connection.dialect
    if len(rows) > 1 and dialect.name == "sqlite":
        # One multi-row INSERT ... RETURNING. SQLite gives the rows ascending ids in VALUES order but does
        # not promise RETURNING's order (why SQLAlchemy's own ordered form sends one INSERT per row): sort.
        result = await connection.execute(insert(table).returning(table.c.id), rows)
        return sorted(int(row_id) for row_id in result.scalars())
    if len(rows) > 1 and dialect.insert_executemany_returning_sort_by_parameter_order:  # MariaDB ≥ 10.5
        statement = insert(table).returning(table.c.id, sort_by_parameter_order=True)
        return [int(row_id) for row_id in (await connection.execute(statement, rows)).scalars()]
    return [_inserted_id(await connection.execute(insert(table).values(row))) for row in rows]


async def _update_executions(
    connection: AsyncConnection, updates: Sequence[SubagentUpdate]
) -> list[SubagentWritten]:
    """Apply ``updates`` in order, consecutive ones that set the same columns as one executemany."""
    if not updates:
        return []
    ids = {update.execution_id for update in updates}
    found = set(
        (await connection.execute(select(_EXECUTIONS.c.id).where(_EXECUTIONS.c.id.in_(ids)))).scalars()
    )
    present = [update for update in updates if update.execution_id in found]
    for _, run in itertools.groupby(present, key=lambda update: sorted(update.values)):
        rows = [{"execution_id": update.execution_id, **update.values} for update in run]
        await connection.execute(_UPDATE_EXECUTION, rows)
    return [
        None if update.execution_id in found else LookupError(f"no subagent execution {update.execution_id}")
        for update in updates
    ]


_UPDATE_EXECUTION = update(_EXECUTIONS).where(_EXECUTIONS.c.id == bindparam("execution_id"))


class ActionRepository:
    """The append-only log of user actions that runtimes read by cursor."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def append_many(self, actions: Sequence[NewAction]) -> list[tuple[ActionRecord, bool]]:
        """Append actions in ONE transaction (group commit); per action: its record and whether it is new.

        An action whose dedupe key is already in the log is not added again: its existing record comes
        back with False. Callers retry the whole batch on an IntegrityError (a racing writer elsewhere).
        """
        keys = [storable_key(action.dedupe_key) for action in actions]
        async with self._db.session() as session:
            existing = await self._by_keys(session, keys)
            fresh = {key: action for key, action in zip(keys, actions, strict=True) if key not in existing}
            # One executemany, not an ORM flush of one INSERT per action (each a thread hop on SQLite).
            if fresh:
                await session.execute(
                    insert(_ACTIONS), [_action_row(action, key) for key, action in fresh.items()]
                )
            stored = await self._by_keys(session, list(fresh)) if fresh else {}
        return [(stored[key], True) if key in fresh else (existing[key], False) for key in keys]

    async def _by_keys(self, session: AsyncSession, keys: list[str]) -> dict[str, ActionRecord]:
        if not keys:
            return {}
        rows = await session.scalars(select(TaskAction).where(TaskAction.dedupe_key.in_(set(keys))))
        return {row.dedupe_key: _action_record(row) for row in rows if row.dedupe_key is not None}

    async def list_after(self, session_id: int, after_id: int, limit: int = 100) -> list[ActionRecord]:
        """Actions of the session with ``id > after_id``, oldest first, at most ``limit``."""
        async with self._db.session() as session:
            rows = await session.scalars(
                select(TaskAction)
                .where(TaskAction.session_id == session_id, TaskAction.id > after_id)
                .order_by(TaskAction.id)
                .limit(limit)
            )
            return [_action_record(row) for row in rows]


_ACTIONS = cast(Table, TaskAction.__table__)


def _action_row(action: NewAction, key: str) -> dict[str, Any]:
    return {
        "session_id": action.session_id,
        "kind": action.kind,
        "operator_open_id": action.operator_open_id,
        "payload": json.dumps(dict(action.payload), ensure_ascii=False, separators=(",", ":")),
        "dedupe_key": key,
        "created_at": action.now,
    }


@dataclass(frozen=True, slots=True)
class LoggedBatch:
    """One batch of the event log: its place in the task's sequence, its Idempotency-Key, its JSON."""

    seq: int
    idempotency_key: str | None
    body: str


class EventLogRepository:
    """Event batches stored for a card whose writer did not answer (cluster mode), in order per task."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def append(self, session_id: int, idempotency_key: str | None, body: str) -> int:
        """Store a batch after the task's others; its ``seq`` (UnknownTask when there is no such task).

        The task's counter is bumped in the same transaction: its row lock orders two instances
        appending to one task, and a number is never given twice (applied rows are deleted).
        """
        async with self._db.engine.begin() as connection:
            bumped = await connection.execute(
                update(TaskCard)
                .where(TaskCard.session_id == session_id)
                .values(events_logged=TaskCard.events_logged + 1)
            )
            if bumped.rowcount != 1:
                raise UnknownTask(session_id)
            seq = int(
                await connection.scalar(
                    select(TaskCard.events_logged).where(TaskCard.session_id == session_id)
                )
                or 0
            )
            await connection.execute(
                insert(TaskEventLog).values(
                    session_id=session_id, seq=seq, idempotency_key=idempotency_key, body=body
                )
            )
        return seq

    async def after(self, session_id: int, after_seq: int, limit: int = 100) -> list[LoggedBatch]:
        """The task's batches with ``seq > after_seq``, oldest first, at most ``limit``."""
        async with self._db.engine.connect() as connection:
            rows = await connection.execute(
                select(TaskEventLog.seq, TaskEventLog.idempotency_key, TaskEventLog.body)
                .where(TaskEventLog.session_id == session_id, TaskEventLog.seq > after_seq)
                .order_by(TaskEventLog.seq)
                .limit(limit)
            )
            return [LoggedBatch(int(seq), key, body) for seq, key, body in rows]

    async def newest_of(self, session_ids: Sequence[int]) -> dict[int, int]:
        """Of these tasks, those with batches in the log: their newest ``seq``."""
        statement = (
            select(TaskEventLog.session_id, func.max(TaskEventLog.seq))
            .where(TaskEventLog.session_id.in_(list(session_ids)))
            .group_by(TaskEventLog.session_id)
        )
        async with self._db.engine.connect() as connection:
            rows = await connection.execute(statement)
            return {int(session_id): int(seq) for session_id, seq in rows}

    async def forget_through(self, session_id: int, seq: int) -> None:
        """Delete the task's batches up to ``seq`` (applied, and saved in its state)."""
        async with self._db.engine.begin() as connection:
            await connection.execute(
                delete(TaskEventLog).where(TaskEventLog.session_id == session_id, TaskEventLog.seq <= seq)
            )

    async def pending_for(self, owner: str) -> dict[int, int]:
        """Per task ``owner`` writes with batches in the log: the newest ``seq`` (a backstop to nudges)."""
        statement = (
            select(TaskEventLog.session_id, func.max(TaskEventLog.seq))
            .join(TaskCard, TaskCard.session_id == TaskEventLog.session_id)
            .where(TaskCard.owner_instance == owner)
            .group_by(TaskEventLog.session_id)
        )
        async with self._db.engine.connect() as connection:
            rows = await connection.execute(statement)
            return {int(session_id): int(seq) for session_id, seq in rows}


class CallbackDedupeRepository:
    """Callback keys seen within a TTL, shared by every process on the database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def first_seen(self, key: str, ttl_seconds: int, now: datetime) -> bool:
        """True only the first time ``key`` is seen within ``ttl_seconds``; an expired key counts as new."""
        stored = storable_key(key)
        expires_at = now + timedelta(seconds=ttl_seconds)
        if await self._reclaim_expired(stored, now, expires_at):
            return True
        try:
            async with self._db.session() as session:
                session.add(CallbackSeen(key=stored, expires_at=expires_at))
        except IntegrityError:
            return False
        return True

    async def first_seen_many(self, keys: Sequence[str], ttl_seconds: int, now: datetime) -> list[bool]:
        """``first_seen`` of each key, in order, in ONE transaction (a repeat within ``keys`` is not new).

        The dedupe's background writes come in bursts (200 clicks at once): one transaction each queued
        400 sessions on SQLite's write lock ahead of the clicks' own action-log writes. A race with another
        writer inserting one of the keys falls back to one ``first_seen`` per key.
        """
        stored = [storable_key(key) for key in keys]
        try:
            return await self._first_seen_batch(stored, now + timedelta(seconds=ttl_seconds), now)
        except IntegrityError:
            return [await self.first_seen(key, ttl_seconds, now) for key in stored]

    async def _first_seen_batch(self, keys: list[str], expires_at: datetime, now: datetime) -> list[bool]:
        async with self._db.session() as session:
            rows = await session.execute(
                select(CallbackSeen.key, CallbackSeen.expires_at <= now).where(
                    CallbackSeen.key.in_(set(keys))
                )
            )
            expired = {key: bool(is_expired) for key, is_expired in rows}
            fresh = [key for key in dict.fromkeys(keys) if key not in expired]
            reclaimed = [key for key, is_expired in expired.items() if is_expired]
            if reclaimed:
                await session.execute(
                    update(CallbackSeen)
                    .where(CallbackSeen.key.in_(reclaimed), CallbackSeen.expires_at <= now)
                    .values(expires_at=expires_at)
                )
            if fresh:
                await session.execute(
                    insert(CallbackSeen), [{"key": k, "expires_at": expires_at} for k in fresh]
                )
        new = {*fresh, *reclaimed}
        answers = []
        for key in keys:
            answers.append(key in new)
            new.discard(key)  # a repeat later in the batch is a duplicate
        return answers

    async def _reclaim_expired(self, key: str, now: datetime, expires_at: datetime) -> bool:
        async with self._db.session() as session:
            # Conditional update: of two racing callers only one can move an expired deadline.
            result = await session.execute(
                update(CallbackSeen)
                .where(CallbackSeen.key == key, CallbackSeen.expires_at <= now)
                .values(expires_at=expires_at)
            )
            return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    async def live_keys(self, now: datetime) -> list[tuple[str, datetime]]:
        """Every stored key whose TTL has not passed, with its expiry, soonest first (to warm a cache)."""
        async with self._db.session() as session:
            rows = await session.execute(
                select(CallbackSeen.key, CallbackSeen.expires_at)
                .where(CallbackSeen.expires_at > now)
                .order_by(CallbackSeen.expires_at)
            )
            return [(key, expires_at) for key, expires_at in rows]

    async def purge_expired(self, now: datetime) -> int:
        """Delete keys whose TTL has passed; returns how many went."""
        async with self._db.session() as session:
            statement = delete(CallbackSeen).where(CallbackSeen.expires_at <= now)
            result = await session.execute(statement)
            return int(result.rowcount)  # type: ignore[attr-defined]

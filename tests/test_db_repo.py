"""Repositories on both backends (the ``db`` fixture runs each test on SQLite and MySQL)."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy import func, select, update

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.engine import Database
from feishu_progress.db.models import CallbackSeen, SessionRow, SubagentExecution, TaskCard
from feishu_progress.db.repo import (
    ActionRepository,
    CallbackDedupeRepository,
    EventLogRepository,
    NewAction,
    NewTask,
    StateRow,
    SubagentRepository,
    SubagentStart,
    SubagentUpdate,
    TaskRepository,
    storable_key,
)
from feishu_progress.db.times import utc_datetime
from feishu_progress.domain import InvocationType, SubagentStatus, TaskStatus
from feishu_progress.errors import TaskConflict, UnknownTask

# Microseconds on purpose (MySQL columns are DATETIME(6)).
T0 = datetime(2026, 10, 19, 8, 0, 0, 123456, tzinfo=UTC)


def task_fields(**overrides: object) -> NewTask:
    values: dict[str, object] = {
        "receive_id": "oc_chat",
        "receive_id_type": "chat_id",
        "requester_open_id": "ou_requester",
        "now": T0,
        "title": "调研飞书卡片",
        "reply_to_message_id": "om_question",
        "locale": "zh_cn",
    }
    values.update(overrides)
    return NewTask(**values)  # type: ignore[arg-type]


async def new_task(tasks: TaskRepository, title: str | None = "调研飞书卡片") -> int:
    return await tasks.create_task(task_fields(title=title))


def state(
    session_id: int, status: TaskStatus | str, round: int, snapshot: str, at: datetime, **kw: object
) -> StateRow:
    return StateRow(session_id, str(status), round, snapshot, at, **kw)  # type: ignore[arg-type]


# --- TaskRepository ---------------------------------------------------------------------------


async def test_create_task_stores_session_and_running_card(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    record = await tasks.get(session_id)
    assert record is not None
    assert record.session_id == session_id
    assert record.title == "调研飞书卡片"
    assert (record.receive_id, record.receive_id_type) == ("oc_chat", "chat_id")
    assert record.requester_open_id == "ou_requester"
    assert record.reply_to_message_id == "om_question"
    assert record.locale == "zh_cn"
    assert record.status is TaskStatus.RUNNING
    assert (record.round, record.snapshot, record.disliked, record.message_id) == (0, None, False, None)
    assert record.started_at == T0 == record.last_event_at  # microseconds survive on both backends
    assert record.finished_at is None and record.stop_reason is None


async def test_created_tasks_get_distinct_increasing_ids(db: Database) -> None:
    tasks = TaskRepository(db)
    first, second = await new_task(tasks), await new_task(tasks, None)
    assert second > first
    second_record = await tasks.get(second)
    assert second_record is not None and second_record.title is None


async def test_get_unknown_task_is_none(db: Database) -> None:
    assert await TaskRepository(db).get(424242) is None


async def test_set_message_id(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    await tasks.set_message_id(session_id, "om_card")
    record = await tasks.get(session_id)
    assert record is not None and record.message_id == "om_card"


async def test_save_state_and_finish(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    later = T0 + timedelta(seconds=90)
    await tasks.save_states([state(session_id, TaskStatus.WAITING, 3, '{"content":"半路"}', later)])
    record = await tasks.get(session_id)
    assert record is not None
    assert (record.status, record.round, record.snapshot) == (TaskStatus.WAITING, 3, '{"content":"半路"}')
    assert record.last_event_at == later and record.finished_at is None

    end = later + timedelta(minutes=2)
    await tasks.save_states([state(session_id, "COMPLETED", 4, "{}", end, finished_at=end, disliked=True)])
    record = await tasks.get(session_id)
    assert record is not None
    assert (record.status, record.round, record.finished_at) == (TaskStatus.COMPLETED, 4, end)
    assert record.disliked is True


async def test_stop_reason_is_saved_with_the_state(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    await tasks.save_states([state(session_id, "RUNNING", 1, "{}", T0, stop_reason="recalled")])
    record = await tasks.get(session_id)
    assert record is not None and record.stop_reason == "recalled"


async def test_updates_of_unknown_tasks_raise(db: Database) -> None:
    tasks = TaskRepository(db)
    with pytest.raises(UnknownTask):
        await tasks.set_message_id(999, "om_x")


async def test_a_runtime_session_id_is_used_and_taken_only_once(db: Database) -> None:
    tasks = TaskRepository(db)
    assert await tasks.create_task(task_fields(session_id=9_000_000_001)) == 9_000_000_001
    with pytest.raises(TaskConflict):
        await tasks.create_task(task_fields(session_id=9_000_000_001))


async def test_an_idempotency_key_finds_its_task_and_is_taken_only_once(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await tasks.create_task(task_fields(idempotency_key="run-42"))
    found = await tasks.find_by_idempotency_key("run-42")
    assert found is not None and found.session_id == session_id
    assert await tasks.find_by_idempotency_key("run-43") is None
    with pytest.raises(TaskConflict):
        await tasks.create_task(task_fields(idempotency_key="run-42"))
    long_key = "k" * 255  # stored as its digest, found by the same key
    long_id = await tasks.create_task(task_fields(idempotency_key=long_key))
    again = await tasks.find_by_idempotency_key(long_key)
    assert again is not None and again.session_id == long_id


async def test_a_key_spelling_a_hash_does_not_collide_with_the_long_key_it_hashes(db: Database) -> None:
    tasks = TaskRepository(db)
    long_key = "k" * 255
    long_id = await tasks.create_task(task_fields(idempotency_key=long_key))
    spelled = "sha256:" + hashlib.sha256(long_key.encode()).hexdigest()  # what the long key is stored as
    assert await tasks.find_by_idempotency_key(spelled) is None
    spelled_id = await tasks.create_task(task_fields(idempotency_key=spelled))
    assert spelled_id != long_id
    found = await tasks.find_by_idempotency_key(spelled)
    assert found is not None and found.session_id == spelled_id


async def test_delete_task_leaves_nothing_behind(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    await tasks.delete_task(session_id)
    assert await tasks.get(session_id) is None
    async with db.session() as session:
        assert await session.get(SessionRow, session_id) is None


async def test_a_200_kb_snapshot_and_a_long_answer_survive(db: Database) -> None:
    # Issue 15 #4: TEXT holds 64 KiB on MySQL; these were refused ("Data too long") or cut.
    tasks, actions = TaskRepository(db), ActionRepository(db)
    session_id = await new_task(tasks)
    snapshot = '{"content":"' + "长" * 70_000 + '"}'  # 70 000 CJK characters: 210 KB of UTF-8
    await tasks.save_states([state(session_id, "RUNNING", 1, snapshot, T0)])
    record = await tasks.get(session_id)
    assert record is not None and record.snapshot == snapshot
    answer = {"answers": [{"question": "为什么?", "custom_input": "答" * 5000}] * 6}
    [(_, created)] = await actions.append_many([NewAction(session_id, "answers", "ou", answer, "k", T0)])
    assert created and (await actions.list_after(session_id, 0))[0].payload == answer


async def test_list_unfinished_returns_running_and_waiting_only(db: Database) -> None:
    tasks = TaskRepository(db)
    running, waiting, done, failed = [await new_task(tasks) for _ in range(4)]
    await tasks.save_states(
        [
            state(waiting, TaskStatus.WAITING, 1, "{}", T0),
            state(done, TaskStatus.COMPLETED, 1, "{}", T0, finished_at=T0),
            state(failed, TaskStatus.FAILED, 1, "{}", T0, finished_at=T0),
        ]
    )
    unfinished = await tasks.list_unfinished()
    assert [record.session_id for record in unfinished] == [running, waiting]
    assert unfinished[1].status is TaskStatus.WAITING


# --- SubagentRepository ------------------------------------------------------------------------


async def start_explorer(subagents: SubagentRepository, parent: int, ref: str = "task-1") -> int:
    return await subagents.start(
        parent, ref, "child-ext-1", "explorer", "后台子代理(explorer): 调研", "调研链路", "BACKGROUND", T0
    )


async def test_start_creates_child_session_and_running_execution(db: Database) -> None:
    subagents = SubagentRepository(db)
    execution_id = await start_explorer(subagents, parent=7)
    async with db.session() as session:
        execution = await session.get(SubagentExecution, execution_id)
        assert execution is not None
        child = await session.get(SessionRow, execution.child_session_id)
    assert child is not None
    assert (child.title, child.parent_session_id, child.external_id) == (
        "后台子代理(explorer): 调研",
        7,
        "child-ext-1",
    )
    assert execution.parent_session_id == 7 and execution.task_ref == "task-1"
    assert (execution.agent_type, execution.task_description) == ("explorer", "调研链路")
    assert (execution.status, execution.invocation_type) == ("RUNNING", "BACKGROUND")
    assert (execution.total_rounds, execution.started_at, execution.finished_at) == (0, T0, None)


async def test_start_is_idempotent_per_parent_and_task_ref(db: Database) -> None:
    subagents = SubagentRepository(db)
    first = await start_explorer(subagents, parent=7)
    assert await start_explorer(subagents, parent=7) == first
    assert await start_explorer(subagents, parent=8) != first  # same ref, other parent
    assert await start_explorer(subagents, parent=7, ref="TASK-1") != first  # refs compare exactly
    async with db.session() as session:
        assert await session.scalar(select(func.count()).select_from(SubagentExecution)) == 3
        assert await session.scalar(select(func.count()).select_from(SessionRow)) == 3  # no orphan child


async def test_subagent_writes_of_many_tasks_share_transactions(db: Database) -> None:
    """The running service's repository group-commits: a burst of starts and finishes across tasks costs a
    few transactions, each caller still gets its own answer (and its own error)."""
    background = BackgroundTasks()
    subagents = SubagentRepository(db, background)
    commits = 0

    def counted(*_: object) -> None:
        nonlocal commits
        commits += 1

    sqlalchemy_event.listen(db.engine.sync_engine, "commit", counted)
    try:
        ids = await asyncio.gather(
            *(start_explorer(subagents, parent=100 + n % 20, ref=f"t{n}") for n in range(60))
        )
        again = await asyncio.gather(
            *(start_explorer(subagents, parent=100 + n % 20, ref=f"t{n}") for n in range(3))
        )
        assert again == ids[:3] and len(set(ids)) == 60
        finishes = [subagents.finish(execution_id, "COMPLETED", 4, T0) for execution_id in ids[:30]]
        missing = subagents.finish(10**12, "COMPLETED", 1, T0)
        results = await asyncio.gather(*finishes, missing, return_exceptions=True)
        assert results[:30] == [None] * 30 and isinstance(results[30], LookupError)
    finally:
        sqlalchemy_event.remove(db.engine.sync_engine, "commit", counted)
    assert commits < 20, f"{commits} transactions for 94 writes"
    async with db.session() as session:
        done = await session.scalar(
            select(func.count()).select_from(SubagentExecution).where(SubagentExecution.status == "COMPLETED")
        )
    assert done == 30


async def test_a_batch_of_starts_is_a_few_statements_and_each_execution_has_its_own_child(
    db: Database,
) -> None:
    """Starts share multi-row INSERTs (ids read back in order); updates of one batch apply in order."""
    subagents = SubagentRepository(db)
    starts = [
        SubagentStart(
            200 + n % 7, f"ref-{n}", f"child-{n}", "explorer", f"标题 {n}", f"描述 {n}", "BACKGROUND", T0
        )
        for n in range(40)
    ]
    statements: list[str] = []

    def counted(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    sqlalchemy_event.listen(db.engine.sync_engine, "before_cursor_execute", counted)
    try:
        ids = await subagents.write_many([*starts, starts[3]])  # a repeat in the batch: the same row
    finally:
        sqlalchemy_event.remove(db.engine.sync_engine, "before_cursor_execute", counted)
    assert len(set(ids)) == 40 and ids[40] == ids[3]
    assert len(statements) <= 3, statements  # the existing-starts SELECT, sessions, executions
    async with db.session() as session:
        rows = (
            await session.execute(
                select(
                    SubagentExecution.id, SubagentExecution.task_ref, SessionRow.title, SessionRow.external_id
                )
                .join(SessionRow, SessionRow.id == SubagentExecution.child_session_id)
                .where(SubagentExecution.id.in_(ids))
            )
        ).all()
    by_id = {row[0]: row[1:] for row in rows}
    for n, execution_id in enumerate(ids[:40]):
        assert by_id[execution_id] == (f"ref-{n}", f"标题 {n}", f"child-{n}")
    recovering, running = {"status": "RECOVERING"}, {"status": "RUNNING"}
    finished = {"status": "FAILED", "total_rounds": 3, "finished_at": T0}
    updates = [
        SubagentUpdate(ids[0], recovering),
        SubagentUpdate(ids[0], finished),  # after the status change: the finish is what stays
        SubagentUpdate(ids[1], finished),
        SubagentUpdate(ids[1], running),  # a later status change wins over the finish
        SubagentUpdate(10**12, running),
    ]
    results = await subagents.write_many(updates)
    assert results[:4] == [None] * 4 and isinstance(results[4], LookupError)
    async with db.session() as session:
        status = dict(
            (
                await session.execute(
                    select(SubagentExecution.id, SubagentExecution.status).where(
                        SubagentExecution.id.in_(ids[:2])
                    )
                )
            ).all()
        )
    assert status == {ids[0]: "FAILED", ids[1]: "RUNNING"}


async def test_concurrent_starts_of_one_task_agree(db: Database) -> None:
    subagents = SubagentRepository(db)
    ids = await asyncio.gather(*(start_explorer(subagents, parent=5, ref="race") for _ in range(4)))
    assert len(set(ids)) == 1
    assert await subagents.find(5, "race") == ids[0]
    async with db.session() as session:
        count = await session.scalar(select(func.count()).select_from(SessionRow))
    assert count == 1  # the losers' child sessions were rolled back with their execution


async def test_find(db: Database) -> None:
    subagents = SubagentRepository(db)
    execution_id = await start_explorer(subagents, parent=7)
    assert await subagents.find(7, "task-1") == execution_id
    assert await subagents.find(7, "task-2") is None
    assert await subagents.find(8, "task-1") is None


async def test_set_status_and_finish(db: Database) -> None:
    subagents = SubagentRepository(db)
    execution_id = await start_explorer(subagents, parent=7)
    await subagents.set_status(execution_id, SubagentStatus.RECOVERING)
    async with db.session() as session:
        assert await session.scalar(
            select(SubagentExecution.status).where(SubagentExecution.id == execution_id)
        ) == ("RECOVERING")
    end = T0 + timedelta(minutes=5)
    await subagents.finish(execution_id, "COMPLETED", 6, end)
    async with db.session() as session:
        execution = await session.get(SubagentExecution, execution_id)
    assert execution is not None
    assert (execution.status, execution.total_rounds, execution.finished_at) == ("COMPLETED", 6, end)


async def test_subagent_arguments_are_validated(db: Database) -> None:
    subagents = SubagentRepository(db)
    with pytest.raises(ValueError, match="task_ref"):
        await subagents.start(1, "x" * 65, None, None, None, None, InvocationType.BACKGROUND, T0)
    with pytest.raises(ValueError):
        await subagents.start(1, "ok", None, None, None, None, "SIDEWAYS", T0)
    with pytest.raises(ValueError):
        await subagents.set_status(1, "SLEEPING")
    with pytest.raises(LookupError):
        await subagents.set_status(999, SubagentStatus.RUNNING)


# --- ActionRepository --------------------------------------------------------------------------


def action(  # noqa: PLR0917 - reads like the row it makes
    session_id: int, kind: str, operator: str, payload: dict[str, object], key: str, at: datetime = T0
) -> NewAction:
    return NewAction(session_id, kind, operator, payload, key, at)


async def test_append_and_list_after_by_cursor(db: Database) -> None:
    actions = ActionRepository(db)
    [(first, created)] = await actions.append_many([action(1, "cancel", "ou_a", {}, "k1")])
    assert created
    (second, _), (_, _) = await actions.append_many(
        [
            action(1, "answers", "ou_a", {"answers": {"q1": ["是"]}}, "k2"),
            action(2, "dislike", "ou_b", {}, "k3"),
        ]
    )
    [(third, _)] = await actions.append_many(
        [action(1, "retry", "ou_c", {"n": 1}, "k4", T0 + timedelta(seconds=1))]
    )

    assert [a.id for a in await actions.list_after(1, 0)] == [first.id, second.id, third.id]
    assert [a.id for a in await actions.list_after(1, first.id)] == [second.id, third.id]
    assert [a.id for a in await actions.list_after(1, 0, limit=2)] == [first.id, second.id]
    assert await actions.list_after(1, third.id) == []

    stored = (await actions.list_after(1, first.id, limit=1))[0]
    assert stored == second
    assert (stored.kind, stored.operator_open_id, stored.payload) == (
        "answers",
        "ou_a",
        {"answers": {"q1": ["是"]}},
    )
    assert stored.created_at == T0 and stored.session_id == 1


async def test_append_is_idempotent_on_dedupe_key_within_and_across_batches(db: Database) -> None:
    actions = ActionRepository(db)
    [(record, created)] = await actions.append_many([action(1, "cancel", "ou_a", {"why": 1}, "evt-1")])
    results = await actions.append_many(
        [action(1, "cancel", "ou_a", {"why": 2}, "evt-1"), action(1, "retry", "ou_a", {}, "evt-2")]
    )
    assert created and results[0] == (record, False)  # the first payload wins
    assert results[1][1] is True
    assert len(await actions.list_after(1, 0)) == 2


async def test_concurrent_appends_with_one_key_store_one_action(db: Database) -> None:
    actions = ActionRepository(db)
    outcomes = await asyncio.gather(
        *(actions.append_many([action(1, "retry", "ou_a", {}, "evt-race")]) for _ in range(4)),
        return_exceptions=True,
    )
    # A racing batch either sees the winner's row or fails with IntegrityError (ActionLog retries it).
    created = [result for outcome in outcomes if isinstance(outcome, list) for result in outcome if result[1]]
    assert len(created) == 1
    assert len(await actions.list_after(1, 0)) == 1


async def test_long_dedupe_keys_are_digested(db: Database) -> None:
    actions = ActionRepository(db)
    long_key = "token-" + "x" * 300
    [(record, created)] = await actions.append_many([action(1, "dislike", "ou_a", {}, long_key)])
    [(_, created_again)] = await actions.append_many([action(1, "dislike", "ou_a", {}, long_key)])
    assert created and not created_again
    assert record.dedupe_key == storable_key(long_key) and len(record.dedupe_key) <= 191
    assert storable_key("short") == "short"


# --- CallbackDedupeRepository ------------------------------------------------------------------


async def test_first_seen_only_once_within_ttl(db: Database) -> None:
    seen = CallbackDedupeRepository(db)
    assert await seen.first_seen("evt-1", 60, T0)
    assert not await seen.first_seen("evt-1", 60, T0 + timedelta(seconds=59))
    assert await seen.first_seen("evt-2", 60, T0)


async def test_expired_keys_may_be_reused(db: Database) -> None:
    seen = CallbackDedupeRepository(db)
    assert await seen.first_seen("evt-1", 60, T0)
    assert await seen.first_seen("evt-1", 60, T0 + timedelta(seconds=60))
    assert not await seen.first_seen("evt-1", 60, T0 + timedelta(seconds=61))  # the new TTL holds


async def test_concurrent_first_seen_admits_one(db: Database) -> None:
    seen = CallbackDedupeRepository(db)
    results = await asyncio.gather(*(seen.first_seen("evt-race", 60, T0) for _ in range(4)))
    assert results.count(True) == 1


async def test_first_seen_many_is_first_seen_of_each_key_in_one_transaction(db: Database) -> None:
    seen = CallbackDedupeRepository(db)
    assert await seen.first_seen("old", 10, T0)
    assert await seen.first_seen("live", 100, T0)
    later = T0 + timedelta(seconds=50)
    answers = await seen.first_seen_many(["new", "old", "live", "new", "x" * 300], 60, later)
    assert answers == [True, True, False, False, True]  # expired "old" reclaimed; a repeat is a duplicate
    assert not await seen.first_seen("old", 60, later + timedelta(seconds=59))  # its new TTL holds
    assert await seen.first_seen_many(["x" * 300], 60, later) == [False]  # stored in its storable form


async def test_purge_expired(db: Database) -> None:
    seen = CallbackDedupeRepository(db)
    await seen.first_seen("short", 10, T0)
    await seen.first_seen("long", 100, T0)
    assert await seen.purge_expired(T0 + timedelta(seconds=50)) == 1
    async with db.session() as session:
        assert list(await session.scalars(select(CallbackSeen.key))) == ["long"]
    assert await seen.purge_expired(T0 + timedelta(seconds=50)) == 0


# --- UTC at the column ----------------------------------------------------------------------------


def test_utc_datetime_from_a_timestamp() -> None:
    assert utc_datetime(T0.timestamp()) == T0


async def test_datetimes_in_any_zone_come_back_as_the_same_instant_in_utc(db: Database) -> None:
    tasks = TaskRepository(db)
    shanghai = timezone(timedelta(hours=8))
    session_id = await tasks.create_task(task_fields(now=T0.astimezone(shanghai)))
    await tasks.save_states(
        [state(session_id, TaskStatus.RUNNING, 1, "{}", (T0 + timedelta(hours=1)).astimezone(shanghai))]
    )
    record = await tasks.get(session_id)
    assert record is not None
    assert (record.started_at, record.last_event_at) == (T0, T0 + timedelta(hours=1))
    assert record.started_at.tzinfo is UTC


async def test_a_naive_datetime_is_refused_before_it_reaches_the_database(db: Database) -> None:
    tasks = TaskRepository(db)
    with pytest.raises(Exception, match="naive datetime"):
        await tasks.create_task(task_fields(now=T0.replace(tzinfo=None)))


async def test_save_states_writes_many_cards_in_one_call(db: Database) -> None:
    tasks = TaskRepository(db)
    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    ids = [await tasks.create_task(task_fields(title=f"t{n}", now=now)) for n in range(3)]
    await tasks.save_states(
        [
            StateRow(sid, "RUNNING", n + 1, f'{{"n": {n}}}', now + timedelta(seconds=n))
            for n, sid in enumerate(ids)
        ]
    )
    records = [await tasks.get(sid) for sid in ids]
    assert [(r.round, r.snapshot) for r in records if r is not None] == [
        (1, '{"n": 0}'),
        (2, '{"n": 1}'),
        (3, '{"n": 2}'),
    ]
    await tasks.save_states([])  # nothing to do is not an error


# --- EventLogRepository --------------------------------------------------------------------------


async def test_the_event_log_numbers_each_tasks_batches_in_order_and_never_reuses_a_number(
    db: Database,
) -> None:
    tasks, log = TaskRepository(db), EventLogRepository(db)
    first, second = await new_task(tasks), await new_task(tasks)
    assert [await log.append(first, "k1", '{"events":[1]}'), await log.append(second, None, "{}")] == [1, 1]
    assert await log.append(first, "k2", '{"events":[2]}') == 2
    assert [(b.seq, b.idempotency_key, b.body) for b in await log.after(first, 0)] == [
        (1, "k1", '{"events":[1]}'),
        (2, "k2", '{"events":[2]}'),
    ]
    assert [b.seq for b in await log.after(first, 1)] == [2]
    await log.forget_through(first, 2)
    assert await log.after(first, 0) == []
    # Applied rows are gone, yet the next batch still comes after them (a cursor at 2 must see it).
    assert await log.append(first, "k3", "{}") == 3
    assert [b.seq for b in await log.after(first, 2)] == [3]
    assert [b.seq for b in await log.after(second, 0)] == [1]
    with pytest.raises(UnknownTask):
        await log.append(10**12, "k", "{}")


async def test_the_event_log_names_the_tasks_an_owner_has_batches_waiting_for(db: Database) -> None:
    tasks, log = TaskRepository(db), EventLogRepository(db)
    mine, theirs = await new_task(tasks), await new_task(tasks)
    async with db.engine.begin() as connection:
        for session_id, owner in ((mine, "fp-0"), (theirs, "fp-1")):
            await connection.execute(
                update(TaskCard).where(TaskCard.session_id == session_id).values(owner_instance=owner)
            )
    for session_id in (mine, mine, theirs):
        await log.append(session_id, None, "{}")
    assert await log.pending_for("fp-0") == {mine: 2}
    assert await log.pending_for("fp-1") == {theirs: 1}
    assert await log.newest_of([mine, theirs, 10**12]) == {mine: 2, theirs: 1}
    await log.forget_through(mine, 2)
    assert await log.pending_for("fp-0") == {}

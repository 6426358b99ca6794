"""Repositories on both backends (the ``db`` fixture runs each test on SQLite and MySQL)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from feishu_progress.db.engine import Database
from feishu_progress.db.models import CallbackSeen, SessionRow, SubagentExecution
from feishu_progress.db.repo import (
    ActionRepository,
    CallbackDedupeRepository,
    SubagentRepository,
    TaskRepository,
    storable_key,
)
from feishu_progress.db.times import naive_utc_from_timestamp, to_naive_utc
from feishu_progress.domain import InvocationType, SubagentStatus, TaskStatus
from feishu_progress.errors import UnknownTask

# Naive UTC like everything stored; microseconds on purpose (MySQL columns are DATETIME(6)).
T0 = datetime(2026, 10, 19, 8, 0, 0, 123456, tzinfo=UTC).replace(tzinfo=None)


async def new_task(tasks: TaskRepository, title: str | None = "调研飞书卡片") -> int:
    return await tasks.create_task(title, "oc_chat", "chat_id", "ou_requester", "om_question", "zh_cn", T0)


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
    await tasks.save_state(session_id, TaskStatus.WAITING, 3, '{"content":"半路"}', later)
    record = await tasks.get(session_id)
    assert record is not None
    assert (record.status, record.round, record.snapshot) == (TaskStatus.WAITING, 3, '{"content":"半路"}')
    assert record.last_event_at == later and record.finished_at is None

    end = later + timedelta(minutes=2)
    await tasks.save_state(session_id, "COMPLETED", 4, "{}", end, finished_at=end)
    record = await tasks.get(session_id)
    assert record is not None
    assert (record.status, record.round, record.finished_at) == (TaskStatus.COMPLETED, 4, end)


async def test_saving_the_same_state_twice_is_not_unknown(db: Database) -> None:
    # MySQL reports 0 *changed* rows for an identical update; the repository must count matches.
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    await tasks.save_state(session_id, TaskStatus.RUNNING, 1, "{}", T0)
    await tasks.save_state(session_id, TaskStatus.RUNNING, 1, "{}", T0)


async def test_set_disliked_and_stop_reason(db: Database) -> None:
    tasks = TaskRepository(db)
    session_id = await new_task(tasks)
    await tasks.set_disliked(session_id, True)
    await tasks.set_stop_reason(session_id, "recalled")
    record = await tasks.get(session_id)
    assert record is not None and record.disliked is True and record.stop_reason == "recalled"
    await tasks.set_disliked(session_id, False)
    await tasks.set_stop_reason(session_id, None)
    record = await tasks.get(session_id)
    assert record is not None and record.disliked is False and record.stop_reason is None


async def test_updates_of_unknown_tasks_raise(db: Database) -> None:
    tasks = TaskRepository(db)
    with pytest.raises(UnknownTask):
        await tasks.set_message_id(999, "om_x")
    with pytest.raises(UnknownTask):
        await tasks.save_state(999, TaskStatus.RUNNING, 1, "{}", T0)


async def test_list_unfinished_returns_running_and_waiting_only(db: Database) -> None:
    tasks = TaskRepository(db)
    running, waiting, done, failed = [await new_task(tasks) for _ in range(4)]
    await tasks.save_state(waiting, TaskStatus.WAITING, 1, "{}", T0)
    await tasks.save_state(done, TaskStatus.COMPLETED, 1, "{}", T0, finished_at=T0)
    await tasks.save_state(failed, TaskStatus.FAILED, 1, "{}", T0, finished_at=T0)
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


async def test_append_and_list_after_by_cursor(db: Database) -> None:
    actions = ActionRepository(db)
    first, created = await actions.append(1, "cancel", "ou_a", {}, None, T0)
    assert created
    second, _ = await actions.append(1, "answers", "ou_a", {"answers": {"q1": ["是"]}}, None, T0)
    await actions.append(2, "dislike", "ou_b", {}, None, T0)  # another session
    third, _ = await actions.append(1, "retry", "ou_c", {"n": 1}, None, T0 + timedelta(seconds=1))

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


async def test_append_is_idempotent_on_dedupe_key(db: Database) -> None:
    actions = ActionRepository(db)
    record, created = await actions.append(1, "cancel", "ou_a", {"why": 1}, "evt-1", T0)
    again, created_again = await actions.append(1, "cancel", "ou_a", {"why": 2}, "evt-1", T0)
    assert created and not created_again
    assert again == record  # the first payload wins
    assert len(await actions.list_after(1, 0)) == 1


async def test_concurrent_appends_with_one_key_store_one_action(db: Database) -> None:
    actions = ActionRepository(db)
    results = await asyncio.gather(
        *(actions.append(1, "retry", "ou_a", {}, "evt-race", T0) for _ in range(4))
    )
    assert sum(created for _, created in results) == 1
    assert len({record.id for record, _ in results}) == 1
    assert len(await actions.list_after(1, 0)) == 1


async def test_long_dedupe_keys_are_digested(db: Database) -> None:
    actions = ActionRepository(db)
    long_key = "token-" + "x" * 300
    record, created = await actions.append(1, "dislike", "ou_a", {}, long_key, T0)
    _, created_again = await actions.append(1, "dislike", "ou_a", {}, long_key, T0)
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


async def test_purge_expired(db: Database) -> None:
    seen = CallbackDedupeRepository(db)
    await seen.first_seen("short", 10, T0)
    await seen.first_seen("long", 100, T0)
    assert await seen.purge_expired(T0 + timedelta(seconds=50)) == 1
    async with db.session() as session:
        assert list(await session.scalars(select(CallbackSeen.key))) == ["long"]
    assert await seen.purge_expired(T0 + timedelta(seconds=50)) == 0


# --- naive UTC -----------------------------------------------------------------------------------


def test_naive_utc_helpers() -> None:
    shanghai = timezone(timedelta(hours=8))
    assert to_naive_utc(datetime(2026, 10, 19, 16, 0, tzinfo=shanghai)) == datetime(
        2026, 10, 19, 8, 0, tzinfo=UTC
    ).replace(tzinfo=None)
    assert to_naive_utc(T0) is T0
    assert naive_utc_from_timestamp(T0.replace(tzinfo=UTC).timestamp()) == T0


async def test_aware_datetimes_are_stored_as_naive_utc(db: Database) -> None:
    tasks = TaskRepository(db)
    shanghai = timezone(timedelta(hours=8))
    session_id = await tasks.create_task("t", "oc", "chat_id", "ou", None, None, T0.replace(tzinfo=UTC))
    await tasks.save_state(
        session_id,
        TaskStatus.RUNNING,
        1,
        "{}",
        (T0 + timedelta(hours=1)).replace(tzinfo=UTC).astimezone(shanghai),
    )
    record = await tasks.get(session_id)
    assert record is not None
    assert (record.started_at, record.last_event_at) == (T0, T0 + timedelta(hours=1))
    assert record.started_at.tzinfo is None


async def test_save_states_writes_many_cards_in_one_call(db: Database) -> None:
    from feishu_progress.db.repo import StateRow, TaskRepository

    tasks = TaskRepository(db)
    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    ids = [await tasks.create_task(f"t{n}", "oc_1", "chat_id", "ou_1", None, None, now) for n in range(3)]
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

"""The read-only running-subagents query (seed 002 §4.1.1) on both backends."""

from __future__ import annotations

from datetime import UTC, datetime

from feishu_progress.db.engine import Database
from feishu_progress.db.models import SessionRow, SubagentExecution
from feishu_progress.subagents.query import (
    RunningSubagentRow,
    list_running_by_parent,
    list_running_by_parents,
)

T0 = datetime(2026, 10, 19, 8, 0, 0, tzinfo=UTC)


async def add_execution(
    db: Database,
    parent: int,
    ref: str,
    *,
    status: str = "RUNNING",
    invocation: str = "BACKGROUND",
    title: str | None = "子任务",
    with_child: bool = True,
    total_rounds: int = 0,
) -> int:
    """Insert one execution (and, unless told otherwise, its child session)."""
    async with db.session() as session:
        child_id = None
        if with_child:
            child = SessionRow(title=title, parent_session_id=parent)
            session.add(child)
            await session.flush()
            child_id = child.id
        execution = SubagentExecution(
            parent_session_id=parent,
            task_ref=ref,
            child_session_id=child_id,
            agent_type="explorer",
            task_description=f"描述 {ref}",
            status=status,
            invocation_type=invocation,
            total_rounds=total_rounds,
            started_at=T0,
        )
        session.add(execution)
        await session.flush()
        return execution.id


async def test_only_running_and_recovering_rows(db: Database) -> None:
    running = await add_execution(db, 1, "a")
    recovering = await add_execution(db, 1, "b", status="RECOVERING")
    for index, status in enumerate(["COMPLETED", "FAILED", "CANCELLED"]):
        await add_execution(db, 1, f"done-{index}", status=status)
    rows = await list_running_by_parent(db, 1)
    assert [(row.id, row.status) for row in rows] == [(running, "RUNNING"), (recovering, "RECOVERING")]


async def test_only_background_and_followup_delegate_excluded(db: Database) -> None:
    background = await add_execution(db, 1, "a", invocation="BACKGROUND")
    followup = await add_execution(db, 1, "b", invocation="FOLLOWUP")
    await add_execution(db, 1, "c", invocation="DELEGATE")  # historical RUNNING leftover
    assert [row.id for row in await list_running_by_parent(db, 1)] == [background, followup]


async def test_rows_carry_the_child_title_and_fields(db: Database) -> None:
    execution_id = await add_execution(db, 1, "a", title="后台子代理(explorer): 排查", total_rounds=4)
    (row,) = await list_running_by_parent(db, 1)
    assert row == RunningSubagentRow(
        id=execution_id,
        parent_session_id=1,
        child_session_id=row.child_session_id,
        agent_type="explorer",
        task_description="描述 a",
        status="RUNNING",
        total_rounds=4,
        child_title="后台子代理(explorer): 排查",
    )
    assert row.child_session_id is not None


async def test_left_join_keeps_executions_without_child_session(db: Database) -> None:
    execution_id = await add_execution(db, 1, "orphan", with_child=False)
    (row,) = await list_running_by_parent(db, 1)
    assert (row.id, row.child_session_id, row.child_title) == (execution_id, None, None)


async def test_ordered_by_id_and_scoped_to_the_parent(db: Database) -> None:
    ids = [await add_execution(db, parent, f"t{index}") for index, parent in enumerate([1, 2, 1, 1, 2])]
    assert [row.id for row in await list_running_by_parent(db, 1)] == [ids[0], ids[2], ids[3]]
    assert [row.id for row in await list_running_by_parent(db, 2)] == [ids[1], ids[4]]
    assert await list_running_by_parent(db, 3) == []


async def test_batched_form_equals_per_parent_results(db: Database) -> None:
    for index, parent in enumerate([1, 2, 1, 3, 2, 1]):
        await add_execution(db, parent, f"t{index}", status="RECOVERING" if index == 4 else "RUNNING")
    await add_execution(db, 1, "delegate", invocation="DELEGATE")
    await add_execution(db, 2, "finished", status="COMPLETED")
    parents = [1, 2, 3, 4, 2]  # 4 has nothing, 2 is asked twice
    batched = await list_running_by_parents(db, parents)
    assert set(batched) == {1, 2, 3, 4}
    for parent in batched:
        assert batched[parent] == await list_running_by_parent(db, parent)
    assert batched[4] == []
    assert len(batched[1]) == 3


async def test_batched_form_with_no_parents_is_empty(db: Database) -> None:
    assert await list_running_by_parents(db, []) == {}

"""The read-only running-subagents query (seed 002 §4.1.1), single-parent and batched.

The query is Core ``select``s over two table objects, so the same SQL runs against our own copy of the
seed's tables (``OWN_TABLES``, created by our migrations) or against the agent's own database in attach
mode (``subagents/attach.py`` declares the seed's columns there and reflects nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Table, select

from feishu_progress.db.engine import Database
from feishu_progress.db.models import Base, SessionRow, SubagentExecution
from feishu_progress.domain import InvocationType, SubagentStatus

RUNNING_STATUSES = (SubagentStatus.RUNNING.value, SubagentStatus.RECOVERING.value)
# DELEGATE is historical (seed 002 §1.3): a stale RUNNING row of it must never reach a card.
SHOWN_INVOCATIONS = (InvocationType.BACKGROUND.value, InvocationType.FOLLOWUP.value)
# Keeps one IN (...) list well under every driver's parameter limit.
MAX_PARENTS_PER_QUERY = 500


@dataclass(frozen=True, slots=True)
class SubagentTables:
    """The ``subagent_execution`` and ``session`` tables the query reads (the seed's column names)."""

    execution: Table
    session: Table


OWN_TABLES = SubagentTables(
    execution=Base.metadata.tables[SubagentExecution.__tablename__],
    session=Base.metadata.tables[SessionRow.__tablename__],
)


@dataclass(frozen=True, slots=True)
class RunningSubagentRow:
    """One running execution with its child session's title (None when there is no child row)."""

    id: int
    parent_session_id: int
    child_session_id: int | None
    agent_type: str | None
    task_description: str | None
    status: str
    total_rounds: int
    child_title: str | None


async def _fetch(db: Database, tables: SubagentTables, parent_ids: Sequence[int]) -> list[RunningSubagentRow]:
    execution, child = tables.execution.c, tables.session.c
    statement = (
        select(
            execution.id,
            execution.parent_session_id,
            execution.child_session_id,
            execution.agent_type,
            execution.task_description,
            execution.status,
            execution.total_rounds,
            child.title,
        )
        .select_from(tables.execution)
        .outerjoin(tables.session, child.id == execution.child_session_id)
        .where(
            execution.parent_session_id.in_(parent_ids),
            execution.status.in_(RUNNING_STATUSES),
            execution.invocation_type.in_(SHOWN_INVOCATIONS),
        )
        .order_by(execution.id)
    )
    async with db.engine.connect() as connection:
        result = await connection.execute(statement)
        # The agent's column may be NULL (seed §4.1.1 types it ``number | null``): no rounds known yet.
        return [RunningSubagentRow(*row[:6], row[6] or 0, row[7]) for row in result]


async def list_running_by_parent(
    db: Database, parent_session_id: int, tables: SubagentTables = OWN_TABLES
) -> list[RunningSubagentRow]:
    """Running BACKGROUND/FOLLOWUP executions of one parent, ordered by id."""
    return await _fetch(db, tables, [parent_session_id])


async def list_running_by_parents(
    db: Database, parent_session_ids: Iterable[int], tables: SubagentTables = OWN_TABLES
) -> dict[int, list[RunningSubagentRow]]:
    """The same rows for many parents in one ``IN (...)`` query; every requested parent has a key."""
    parents = sorted(set(parent_session_ids))
    grouped: dict[int, list[RunningSubagentRow]] = {parent: [] for parent in parents}
    for start in range(0, len(parents), MAX_PARENTS_PER_QUERY):
        for row in await _fetch(db, tables, parents[start : start + MAX_PARENTS_PER_QUERY]):
            grouped[row.parent_session_id].append(row)
    return grouped

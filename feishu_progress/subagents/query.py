"""The read-only running-subagents query (seed 002 §4.1.1), single-parent and batched."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select

from feishu_progress.db.engine import Database
from feishu_progress.db.models import SessionRow, SubagentExecution
from feishu_progress.domain import InvocationType, SubagentStatus

RUNNING_STATUSES = (SubagentStatus.RUNNING.value, SubagentStatus.RECOVERING.value)
# DELEGATE is historical (seed 002 §1.3): a stale RUNNING row of it must never reach a card.
SHOWN_INVOCATIONS = (InvocationType.BACKGROUND.value, InvocationType.FOLLOWUP.value)
# Keeps one IN (...) list well under every driver's parameter limit.
MAX_PARENTS_PER_QUERY = 500


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


async def _fetch(db: Database, parent_ids: Sequence[int]) -> list[RunningSubagentRow]:
    execution, child = SubagentExecution, SessionRow
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
        .outerjoin(child, child.id == execution.child_session_id)
        .where(
            execution.parent_session_id.in_(parent_ids),
            execution.status.in_(RUNNING_STATUSES),
            execution.invocation_type.in_(SHOWN_INVOCATIONS),
        )
        .order_by(execution.id)
    )
    async with db.session() as session:
        result = await session.execute(statement)
        return [RunningSubagentRow(*row) for row in result]


async def list_running_by_parent(db: Database, parent_session_id: int) -> list[RunningSubagentRow]:
    """Running BACKGROUND/FOLLOWUP executions of one parent, ordered by id."""
    return await _fetch(db, [parent_session_id])


async def list_running_by_parents(
    db: Database, parent_session_ids: Iterable[int]
) -> dict[int, list[RunningSubagentRow]]:
    """The same rows for many parents in one ``IN (...)`` query; every requested parent has a key."""
    parents = sorted(set(parent_session_ids))
    grouped: dict[int, list[RunningSubagentRow]] = {parent: [] for parent in parents}
    for start in range(0, len(parents), MAX_PARENTS_PER_QUERY):
        for row in await _fetch(db, parents[start : start + MAX_PARENTS_PER_QUERY]):
            grouped[row.parent_session_id].append(row)
    return grouped

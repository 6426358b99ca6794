"""SubagentManager: the ``ports.SubagentSource`` adapter over the running query plus in-memory rounds."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from feishu_progress.db.engine import Database
from feishu_progress.domain import SubagentSummary
from feishu_progress.subagents.query import (
    OWN_TABLES,
    RunningSubagentRow,
    SubagentTables,
    list_running_by_parents,
)
from feishu_progress.subagents.titles import running_subagent_title

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _RunningRef:
    parent_session_id: int
    current_round: int = 0


class SubagentManager:
    """Lists running subagents for the card; rounds of tracked executions come from memory.

    The database's ``total_rounds`` is only written at the end of a run, so while this process tracks
    an execution its in-memory round wins; after a restart the row's value is all there is
    (seed 002 §5.4). A failing query lists nothing (§4.1.2, §5.1): the card omits its subagent section
    until a query works again, rather than keep an older list that would read as current. The seed's
    warning is logged once when the query starts failing, and once when it recovers.

    Attach mode (``subagents/attach.py``) passes the agent's database and tables, and
    ``forget_unlisted=True``: there no finish event is owed to us, so a tracked execution the query no
    longer lists under its parent has ended and its round is dropped (a later round event tracks it again).
    """

    def __init__(
        self, db: Database, tables: SubagentTables = OWN_TABLES, *, forget_unlisted: bool = False
    ) -> None:
        self._db = db
        self._tables = tables
        self._forget_unlisted = forget_unlisted
        self._running: dict[int, _RunningRef] = {}
        self._failing = False

    def track(self, execution_id: int, parent_session_id: int) -> None:
        """Start tracking a running execution (its round starts at 0)."""
        self._running.setdefault(execution_id, _RunningRef(parent_session_id))

    def set_round(self, execution_id: int, round: int) -> None:
        """Record the live round of a tracked execution; unknown ids are ignored."""
        ref = self._running.get(execution_id)
        if ref is not None:
            ref.current_round = round

    def untrack(self, execution_id: int) -> None:
        """Forget an execution (it finished); unknown ids are ignored."""
        self._running.pop(execution_id, None)

    def tracked(self, parent_session_id: int) -> list[int]:
        """Execution ids tracked under a parent, oldest first."""
        return sorted(eid for eid, ref in self._running.items() if ref.parent_session_id == parent_session_id)

    def _summary(self, row: RunningSubagentRow) -> SubagentSummary:
        ref = self._running.get(row.id)
        live_round = ref.current_round if ref is not None else row.total_rounds
        return SubagentSummary(
            task_id=row.id,
            agent_type=row.agent_type,
            title=running_subagent_title(row.child_title, row.task_description, row.child_session_id, row.id),
            status=row.status,
            round=max(0, live_round),
        )

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]:
        """Running BACKGROUND/FOLLOWUP subagents of the parent; none when the query fails."""
        return (await self.list_running_many([parent_session_id]))[parent_session_id]

    async def list_running_many(self, parent_session_ids: Iterable[int]) -> dict[int, list[SubagentSummary]]:
        """The same for many parents in one query; none for any of them when the query fails."""
        parents = list(dict.fromkeys(parent_session_ids))
        try:
            grouped = await list_running_by_parents(self._db, parents, self._tables)
        except Exception as exc:
            # Seed 002 §5.1 says list nothing and warn; we chose that over keeping the last list marked
            # "may be stale": the seed's intent is that a card never shows a list that may be wrong as
            # the current one, and an empty section claims nothing. The next working query restores it.
            if not self._failing:
                logger.warning("Failed to list running subagents: %s", type(exc).__name__)
            self._failing = True
            return {parent: [] for parent in parents}
        if self._failing:
            logger.info("listing running subagents works again")
            self._failing = False
        if self._forget_unlisted:
            self._forget_ended(grouped)
        return {parent: [self._summary(row) for row in rows] for parent, rows in grouped.items()}

    def _forget_ended(self, grouped: dict[int, list[RunningSubagentRow]]) -> None:
        listed = {row.id for rows in grouped.values() for row in rows}
        for execution_id, ref in list(self._running.items()):
            if ref.parent_session_id in grouped and execution_id not in listed:
                del self._running[execution_id]

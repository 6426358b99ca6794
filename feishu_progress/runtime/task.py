"""A task as the service holds it: its state, its live card, and the lock that orders changes to it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from feishu_progress.progress.live_card import LiveCard
from feishu_progress.runtime.state import TaskState


@dataclass
class Task:
    state: TaskState
    card: LiveCard
    # Events, clicks and housekeeping change a task only while holding this lock.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    subagent_ids: dict[str, int] = field(default_factory=dict)  # runtime task_ref -> execution id

    @property
    def session_id(self) -> int:
        return self.state.session_id

    def sync_card(self, *, urgent: bool = False) -> None:
        """Hand the newest state to the live card (which wakes the scheduler)."""
        self.card.record(self.state.card_state(), urgent=urgent)

"""Where this instance stands: alone on its database, or one of several (cluster mode).

The topology is the one thing that differs between the two modes. It is built before the task service,
and every room takes what it needs from it at construction; nothing is plugged in afterwards:

=================  ======================================  ==========================================
                   single mode (``SingleInstance``)        cluster mode (``cluster/topology.py``)
=================  ======================================  ==========================================
``ownership``      always the writer (``AlwaysTheWriter``)  the lease, card ownership, takeover
``owner_id``       None: saves by key, no fence            this instance: fenced saves, owner column
``gate_for``       None: the app's local budget only       the lease and the app's Redis budget
``nudge``          nobody to tell                          a Redis publish to the others
``poll_interval``  inf: a long-poll waits on its event     1 s: a peer's nudge may be lost
``durable``        no: a status change is saved at once    yes: every batch is saved before its 202
``event_log``      ``NO_EVENT_LOG``: never anything in it  batches peers stored for this one's cards
``deduper``        memory + ``callback_seen`` (warmed)     Redis SET NX, else the database
``clicks``         the card actions themselves             at the card's writer, or only recorded
``write_timeout``  None                                    a taker waits out a write this long
=================  ======================================  ==========================================

Its lifecycle is the mode's too: ``start`` re-attaches (single) or takes (cluster) this instance's cards,
``hand_over`` is a graceful stop's alternative to flushing (cluster, with live peers), and
``readiness`` / ``degradations`` / ``collect`` are what ``/readyz`` and ``/metrics`` add for the mode.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from feishu_progress.apps import AppRegistry
from feishu_progress.background import BackgroundTasks
from feishu_progress.config import RateSettings, Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import CallbackDedupeRepository
from feishu_progress.feishu.callback import ActionHandler
from feishu_progress.holder import DatabaseHolder
from feishu_progress.ports import Clock, Deduper
from feishu_progress.progress.writer import DeliveryGate
from feishu_progress.runtime.card_actions import CardActions, StateLookup
from feishu_progress.runtime.dedupe import PersistentDeduper
from feishu_progress.runtime.event_log import NO_EVENT_LOG, LoggedBatches
from feishu_progress.runtime.service import Claim, Ownership, TaskService
from feishu_progress.waiting import Stopper
from feishu_progress.web.admin import Degradation, ReadinessCheck

log = logging.getLogger(__name__)


class Topology(Protocol):
    """What the rooms take from the mode at construction, and the mode's own lifecycle."""

    @property
    def ownership(self) -> Ownership: ...

    @property
    def owner_id(self) -> str | None: ...

    @property
    def poll_interval(self) -> float: ...

    @property
    def durable(self) -> bool: ...

    @property
    def event_log(self) -> LoggedBatches: ...

    @property
    def deduper(self) -> Deduper: ...

    @property
    def write_timeout(self) -> float | None: ...

    def gate_for(self, app_id: str | None, rate: RateSettings) -> DeliveryGate | None:
        """The gate of one app's scheduler (None: the scheduler's own budget is all there is)."""
        ...

    def nudge(self, session_id: int) -> None:
        """An action was recorded here for ``session_id``: tell whoever else should know."""
        ...

    def clicks(self, here: CardActions, saved_state: StateLookup) -> ActionHandler:
        """The handler behind the callback pipeline, around the card actions of this instance."""
        ...

    async def start(self, service: TaskService) -> int:
        """Hold this instance's cards (after a restart, or taken over); returns how many."""
        ...

    def start_loops(self, stopper: Stopper, service: TaskService) -> None: ...

    async def hand_over(self, apps: AppRegistry, service: TaskService) -> bool:
        """Graceful stop: hand the cards to live peers instead of flushing them (False: not done)."""
        ...

    def readiness(self) -> dict[str, ReadinessCheck]: ...

    def degradations(self) -> dict[str, Degradation]: ...

    def collect(self) -> Iterator[Metric]:
        """The mode's gauges, read when Prometheus scrapes (no I/O)."""
        ...


class AlwaysTheWriter:
    """Single mode's ``Ownership``: this process writes every card of its database (``holder.py``)."""

    def may_write(self) -> bool:
        return True

    async def claim(self, session_id: int) -> Claim | None:
        return Claim()  # nobody else wrote it: the saved fence stands

    def release_later(self, session_ids: Sequence[int]) -> None:
        return None  # nobody would take it over


class SingleInstance:
    """Single mode: one process owns the database; everything the cluster shares stays in-process."""

    ownership = AlwaysTheWriter()
    owner_id = None
    poll_interval = math.inf
    durable = False
    event_log = NO_EVENT_LOG
    write_timeout = None

    def __init__(
        self, holder: DatabaseHolder, deduper: PersistentDeduper, background: BackgroundTasks
    ) -> None:
        self.holder = holder
        self.deduper = deduper
        self._background = background

    def gate_for(self, app_id: str | None, rate: RateSettings) -> DeliveryGate | None:
        return None

    def nudge(self, session_id: int) -> None:
        return None  # the action log already woke this process's long-polls

    def clicks(self, here: CardActions, saved_state: StateLookup) -> ActionHandler:
        return here  # every card is written here

    async def start(self, service: TaskService) -> int:
        try:
            await self.deduper.warm()
        except Exception as exc:  # still deduped in memory; redeliveries across the restart may pass
            log.warning("callback dedupe keys could not be loaded: %s", type(exc).__name__)
        return await service.restore()

    def start_loops(self, stopper: Stopper, service: TaskService) -> None:
        self._background.spawn(self.holder.run(stopper), name="database-holder")

    async def hand_over(self, apps: AppRegistry, service: TaskService) -> bool:
        return False  # nobody to hand to: the cards are flushed

    def readiness(self) -> dict[str, ReadinessCheck]:
        async def holder() -> str | None:  # a process whose database was taken over must not look ready
            return self.holder.lost

        return {"database_holder": holder}

    def degradations(self) -> dict[str, Degradation]:
        return {}

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "fp_database_holder_lost",
            "Single mode: 1 once another process took this database over (this one should stop).",
            value=1 if self.holder.lost else 0,
        )


async def open_single_instance(
    settings: Settings, db: Database, *, clock: Clock, background: BackgroundTasks, stack: AsyncExitStack
) -> SingleInstance:
    """Claim the database for this process (or refuse naming who holds it) before anything is attached."""
    holder = DatabaseHolder(db, settings.instance_id)
    await holder.claim()
    stack.push_async_callback(holder.release)  # before the database closes
    deduper = PersistentDeduper(
        CallbackDedupeRepository(db), settings.callback.dedupe_ttl_seconds, clock, background
    )
    return SingleInstance(holder, deduper, background)


__all__ = ["AlwaysTheWriter", "SingleInstance", "Topology", "open_single_instance"]

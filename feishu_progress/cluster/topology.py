"""Cluster mode as the rooms see it: ``topology.Topology`` built from ``ClusterMode``.

The same rooms as single mode, each given the cluster's part at construction: the task service claims
cards through the lease and ownership, snapshots are saved fenced as this instance, every batch is saved
before its 202 and batches peers logged go first, each app's scheduler passes the lease and that app's
shared budget, a recorded click nudges the others, clicks go to their card's writer (``cluster/clicks.py``),
and callback dedupe is shared. The HTTP pieces (forwarding, ``/internal/v1/clicks``) are ``cluster/http.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from feishu_progress.apps import AppRegistry
from feishu_progress.background import BackgroundTasks
from feishu_progress.cluster.clicks import ClusterClicks
from feishu_progress.cluster.mode import ClusterMode
from feishu_progress.config import RateSettings, Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import CallbackDedupeRepository, storable_key
from feishu_progress.db.times import utc_datetime
from feishu_progress.feishu.callback import ActionHandler
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock
from feishu_progress.progress.writer import DeliveryGate
from feishu_progress.runtime.card_actions import CardActions, StateLookup
from feishu_progress.runtime.event_log import EventLog
from feishu_progress.runtime.service import TaskService
from feishu_progress.waiting import Stopper
from feishu_progress.web.admin import Degradation, ReadinessCheck

log = logging.getLogger(__name__)

ACTIONS_LONG_POLL_SECONDS = 1.0  # long-polls look at the table this often (a nudge may be lost)


class ClusterDeduper:
    """Callback dedupe every instance shares: Redis SET NX, or the database's unique key without Redis."""

    def __init__(
        self, cluster: ClusterMode, repo: CallbackDedupeRepository, ttl_seconds: int, clock: Clock
    ) -> None:
        self._cluster = cluster
        self._repo = repo
        self._ttl = ttl_seconds
        self._clock = clock

    async def warm(self) -> int:
        return 0  # nothing kept in memory: every answer comes from Redis or the database

    async def first_seen(self, key: str) -> bool:
        stored = storable_key(key)
        seen = await self._cluster.first_seen(stored, self._ttl)
        if seen is not None:
            return seen
        return await self._repo.first_seen(stored, self._ttl, utc_datetime(self._clock.wall()))


class ClusterTopology:
    """``Topology`` of cluster mode; ``cluster`` is the ClusterMode behind it (lease, owners, Redis)."""

    poll_interval = ACTIONS_LONG_POLL_SECONDS
    # A dead instance's cards are taken over from what it saved: every accepted batch is saved first.
    durable = True

    def __init__(
        self,
        cluster: ClusterMode,
        settings: Settings,
        db: Database,
        clock: Clock,
        background: BackgroundTasks,
    ) -> None:
        self.cluster = cluster
        self._settings = settings
        self.ownership = cluster
        self.owner_id: str | None = settings.instance_id
        self.write_timeout: float | None = settings.cluster.write_timeout_seconds
        self.event_log = EventLog(cluster.event_log, background)
        self.deduper = ClusterDeduper(
            cluster, CallbackDedupeRepository(db), settings.callback.dedupe_ttl_seconds, clock
        )

    def gate_for(self, app_id: str | None, rate: RateSettings) -> DeliveryGate | None:
        return self.cluster.gate_for(app_id, rate)  # each app's own shared budget (Redis keys per app_id)

    def nudge(self, session_id: int) -> None:
        self.cluster.nudge(session_id)

    def clicks(self, here: CardActions, saved_state: StateLookup) -> ActionHandler:
        return ClusterClicks(here, self.cluster, saved_state)

    async def start(self, service: TaskService) -> int:
        return await self.cluster.start(service)

    def start_loops(self, stopper: Stopper, service: TaskService) -> None:
        self.cluster.start_loops(stopper, service)

    async def hand_over(self, apps: AppRegistry, service: TaskService) -> bool:
        """With live peers: stop writing, then release every card with no write in flight to them."""
        if self.cluster.lease.live_instances() < 2:
            return False
        wait = self._settings.cluster.write_timeout_seconds
        in_flight: set[str] = set()
        for flights in await asyncio.gather(*(app.scheduler.stop_and_report(wait) for app in apps)):
            in_flight |= flights
        await service.snapshots.flush()
        released = await self.cluster.hand_over(in_flight, service)
        log.info(
            "handed %d card(s) over (%d with a write in flight wait out its timeout)",
            released,
            len(in_flight),
        )
        return True

    def readiness(self) -> dict[str, ReadinessCheck]:
        async def lease() -> str | None:  # without a live lease no card is written (peers take them)
            if self.cluster.lease.can_write():
                return None
            return "instance lease lapsed: not writing cards until renewed"

        return {"lease": lease}

    def degradations(self) -> dict[str, Degradation]:
        def redis() -> str | None:
            # "unreachable" and no more: /readyz is open to whoever reaches the admin port, and the
            # driver's error names Redis's host and port (the log keeps the details for the operator).
            return None if self.cluster.redis_problem() is None else "unreachable"

        return {"redis": redis}

    def collect(self) -> Iterator[Metric]:
        lease = self.cluster.lease
        yield GaugeMetricFamily(
            "fp_cluster_live_instances",
            "Instances with a live lease at this instance's last heartbeat (itself included).",
            value=lease.live_instances(),
        )
        yield GaugeMetricFamily(
            "fp_cluster_lease_seconds_left",
            "Seconds before this instance stops starting writes unless its lease is renewed (0: lapsed).",
            value=max(0.0, lease.seconds_left),
        )
        yield CounterMetricFamily(
            "fp_cluster_lease_lost",
            "Times this instance found its lease had lapsed (paused or cut off) and dropped its cards.",
            value=lease.lost,
        )


def open_cluster(
    settings: Settings,
    db: Database,
    *,
    clock: Clock,
    metrics: Metrics,
    background: BackgroundTasks,
    stack: AsyncExitStack,
) -> ClusterTopology:
    """Cluster mode's topology; the lease is taken at ``start``, and given back when ``stack`` closes."""
    cluster = ClusterMode(settings, db, clock, metrics, background)
    stack.push_async_callback(cluster.close)
    return ClusterTopology(cluster, settings, db, clock, background)

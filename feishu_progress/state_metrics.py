"""Metrics read off the running app's state when Prometheus scrapes (nothing to keep in step).

What the dashboard (deploy/grafana) and the alert rules (deploy/prometheus) need beyond the counters the
rooms update as they work: how long the oldest final card state has waited, how much of each Open API's
per-minute budget is held, and in cluster mode the lease (seconds left, times lost) and the live
instances; in single mode whether another process took this database over. Collecting only reads
attributes (no I/O, no await): a scrape never waits on the database or Feishu. Registered while the app
runs (``app.py``); the mode's own gauges come from its topology.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from feishu_progress.config import ApiLimits
from feishu_progress.services import Services


class StateCollector(Collector):
    def __init__(self, services: Services) -> None:
        self._services = services

    def describe(self) -> list[Metric]:
        return []  # the families depend on the mode and on what has started: nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        yield from self._delivery()
        yield from self._services.topology.collect()  # cluster: the lease; single: the database holder

    def _delivery(self) -> Iterator[Metric]:
        services = self._services
        scheduler, service = services.scheduler, services.service
        now = services.clock.monotonic()
        pending = set(scheduler.pending_message_ids())
        waiting = [
            now - task.card.changed_at
            for task in service.registry
            if task.card.is_terminal and task.state.message_id in pending
        ]
        yield GaugeMetricFamily(
            "fp_oldest_pending_final_seconds",
            "Age of the oldest final card state not yet delivered to Feishu (0: none waiting).",
            value=max(waiting, default=0.0),
        )
        use = GaugeMetricFamily(
            "fp_budget_minute_use_ratio",
            "Share of this instance's per-minute budget held now, per app and Open API (1 = exhausted).",
            labels=["app", "api"],
        )
        for app in services.apps:
            for api in ApiLimits.model_fields:
                use.add_metric([app.name, api], app.scheduler.budget_of(api).minute_use(now))
        yield use

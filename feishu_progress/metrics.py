"""Prometheus collectors of the service, kept in their own registry (never the global default).

Each app (and each test) builds one ``Metrics`` over its own ``CollectorRegistry`` so that several apps in
one process never collide. Rooms that need more collectors add attributes here, created the same way.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DEFAULT_APP = "default"  # config.DEFAULT_APP (not imported: metrics has no dependencies)


class Labelled(Protocol):
    """A collector with labels (a Counter, or one app's view of a counter labelled by app)."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any: ...


class AppLabelled:
    """One app's side of a collector labelled ``app``: ``labels(outcome=...)`` fills ``app`` in."""

    def __init__(self, collector: Counter, app: str) -> None:
        self._collector = collector
        self._app = app

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any:
        return self._collector.labels(*labelvalues, app=self._app, **labelkwargs)


# Staleness is "newest update -> its delivery": mostly the 250 ms pacing, seconds under budget pressure.
_STALENESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Event-loop lag: under 1 ms when idle; the soak's target is p99 < 50 ms; a second is a stalled service.
# Finer around 50 ms: a p99 read from the buckets interpolates within one, and the soak's target is 50 ms.
_LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.04, 0.05, 0.06, 0.075, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    """The service's collectors, registered on ``registry`` (a fresh one when omitted)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._delivery()
        self._runtime()
        self._cluster()

    def _delivery(self) -> None:
        """The delivery scheduler's: card writes, rate limits, staleness, the outage breaker."""
        # Labelled by app (FP_APPS_FILE; "default" otherwise): each app has its own budgets. The scheduler
        # of an app sees ``for_app(name)``, whose ``patches`` fills the app label in.
        self.app_patches = Counter(
            "fp_patches_total",
            "Card write attempts (PATCH or CardKit) by app and outcome (delivered, partial: CardKit text "
            "only, retry_message, pause_app, backoff, stop, degrade).",
            ["app", "outcome"],
            registry=self.registry,
        )
        self.app_rate_limit_hits = Counter(
            "fp_rate_limit_hits_total",
            "Rate limits Feishu answered, by app: per message (230020) or app-wide gateway (99991400 / 429).",
            ["app", "kind"],
            registry=self.registry,
        )
        self.app_open_api_writes = Counter(
            "fp_open_api_writes_total",
            "Open API writes (each request a card write, send, reply, image upload or CardKit call made), "
            "by app, API (the budgets' names: send, reply, patch, image, card_create, card_update, "
            "card_settings, card_content) and result (ok; error: Feishu answered an error; no_answer: "
            "timeout or connection failure).",
            ["app", "api", "result"],
            registry=self.registry,
        )
        self.patches: Labelled = AppLabelled(self.app_patches, DEFAULT_APP)
        self.rate_limit_hits: Labelled = AppLabelled(self.app_rate_limit_hits, DEFAULT_APP)
        self.open_api_writes: Labelled = AppLabelled(self.app_open_api_writes, DEFAULT_APP)
        self.delivery_give_ups = Counter(
            "fp_delivery_give_ups_total",
            "Card states the scheduler gave up on (attempts exhausted, card stopped).",
            ["reason"],
            registry=self.registry,
        )
        self.app_pending_cards = Gauge(
            "fp_pending_cards",
            "Cards with a state not yet delivered (in flight or waiting for their turn), by app.",
            ["app"],
            registry=self.registry,
        )
        self.pending_cards = self.app_pending_cards.labels(app=DEFAULT_APP)
        self.delivery_staleness = Histogram(
            "fp_delivery_staleness_seconds",
            "Time from a card's newest recorded change to the PATCH that delivered it.",
            buckets=_STALENESS_BUCKETS,
            registry=self.registry,
        )
        self.app_breaker_open = Gauge(
            "fp_breaker_open",
            "1 while the app's outage breaker is open (Feishu failing for every card: probing only).",
            ["app"],
            registry=self.registry,
        )
        self.breaker_open = self.app_breaker_open.labels(app=DEFAULT_APP)
        self.breaker_transitions = Counter(
            "fp_breaker_transitions_total",
            "Outage breaker openings and closings.",
            ["to"],
            registry=self.registry,
        )

    def _runtime(self) -> None:
        """The runtime rooms': live cards, events, callbacks, subagent queries, the event loop's lag."""
        self.live_cards = Gauge(
            "fp_live_cards",
            "Live cards currently registered.",
            registry=self.registry,
        )
        self.events = Counter(
            "fp_events_total",
            "Runtime events applied to tasks.",
            registry=self.registry,
        )
        self.batch_turn_waits = Counter(
            "fp_batch_turn_waits_total",
            "Event batches that waited for a later turn of the event loop: their turn already held "
            "FP_HTTP__BATCH_SLICE_SECONDS of batches (a saturated loop; each wait is one turn or a few).",
            registry=self.registry,
        )
        self.events_logged = Counter(
            "fp_events_logged_total",
            "Event batches stored in the event log because the card's writer did not take them (cluster).",
            registry=self.registry,
        )
        self.callback_latency = Histogram(
            "fp_callback_latency_seconds",
            "Time to answer one Feishu card callback (Feishu's deadline is 3 s).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.subagent_query_seconds = Histogram(
            "fp_subagent_query_seconds",
            "Latency of the read-only running-subagents query.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.readiness_ok = Gauge(
            "fp_readiness_ok",
            "1 when the /readyz check passed at its last run (run every 15 s and at each /readyz), else 0.",
            ["check"],
            registry=self.registry,
        )
        self.event_loop_lag = Histogram(
            "fp_event_loop_lag_seconds",
            "How late the event loop ran a timer (sampled every 0.1 s, loop_lag.py): how long any ready "
            "callback (a request, a click, a card write) may wait for the loop.",
            buckets=_LOOP_LAG_BUCKETS,
            registry=self.registry,
        )
        self.subagent_cache = Counter(
            "fp_subagent_cache_total",
            "Subagent list lookups at delivery time, served from the 1 s cache (hit) or the database (miss).",
            ["result"],
            registry=self.registry,
        )

    def _cluster(self) -> None:
        """Cluster mode's: the app budget shared through Redis (cluster/budget.py)."""
        self.budget_acquire_seconds = Histogram(
            "fp_budget_acquire_seconds",
            "Time of one shared-budget decision (one Redis script call, or the local share), by mode.",
            ["mode"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
        self.budget_grants = Counter(
            "fp_budget_grants_total",
            "Open API calls the app budget granted, by API and mode (shared / local-fallback).",
            ["api", "mode"],
            registry=self.registry,
        )
        self.budget_waits = Counter(
            "fp_budget_waits_total",
            "Budget decisions that answered 'wait', by API and mode.",
            ["api", "mode"],
            registry=self.registry,
        )
        self.budget_mode = Gauge(
            "fp_budget_mode",
            "1 for the budget mode in force (shared: Redis; local-fallback: budget ÷ live instances).",
            ["mode"],
            registry=self.registry,
        )
        self.budget_fallbacks = Counter(
            "fp_budget_fallbacks_total",
            "Switches from the shared Redis budget to the local fallback (Redis failed or timed out).",
            registry=self.registry,
        )

    def for_app(self, app: str) -> Metrics:
        """The same collectors, with the ``app`` label of the per-app ones set to ``app``."""
        view = copy.copy(self)
        view.patches = AppLabelled(self.app_patches, app)
        view.rate_limit_hits = AppLabelled(self.app_rate_limit_hits, app)
        view.open_api_writes = AppLabelled(self.app_open_api_writes, app)
        # Gauges each app's scheduler sets on its own: one series per app, never overwritten by another.
        view.pending_cards = self.app_pending_cards.labels(app=app)
        view.breaker_open = self.app_breaker_open.labels(app=app)
        return view

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of the samples ``name`` whose labels include ``labels`` (0.0 when none): every app's
        unless ``labels`` names one; handy for tests and admin pages."""
        wanted = (labels or {}).items()
        return sum(
            sample.value
            for metric in self.registry.collect()
            for sample in metric.samples
            if sample.name == name and wanted <= sample.labels.items()
        )

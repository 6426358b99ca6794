"""The app-wide outage breaker: when Feishu is down for everyone, stop hammering it and come back at once.

Every card backing off on its own timer made recovery as slow as the slowest card's timer (8-9 of 10
finals arrived within 15 s of Feishu returning). Instead: ``threshold`` transient failures in a row —
across all cards, any answer from Feishu in between resets the count — open the breaker. While open,
the scheduler sends one probe at a time, at most one per ``probe_interval``, and nothing else; the
first probe Feishu answers closes it, and the scheduler sends every waiting card's newest state at once
(within the budget).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from feishu_progress.metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 5
DEFAULT_PROBE_INTERVAL = 2.0


@dataclass
class OutageBreaker:
    threshold: int = DEFAULT_THRESHOLD
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    opened_at: float | None = None  # monotonic time it opened; None: closed
    probing: bool = False
    next_probe: float = -math.inf
    _failures_in_a_row: int = 0

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def failure(self, now: float) -> bool:
        """A transient failure (5xx, timeout, connection): True when this one opened the breaker."""
        self._failures_in_a_row += 1
        if self.is_open or self._failures_in_a_row < self.threshold:
            return False
        self.opened_at = now
        self.next_probe = now + self.probe_interval
        return True

    def answered(self) -> bool:
        """Feishu answered (success or a refusal of its own): True when this closed the breaker."""
        self._failures_in_a_row = 0
        if not self.is_open:
            return False
        self.opened_at = None
        self.next_probe = -math.inf
        return True

    def may_probe(self, now: float) -> bool:
        return self.is_open and not self.probing and now >= self.next_probe

    def probe_started(self, now: float) -> None:
        self.probing = True
        self.next_probe = now + self.probe_interval

    def probe_ended(self) -> None:
        self.probing = False

    def saw(self, *, transient: bool, now: float, metrics: Metrics) -> bool:
        """One write's answer (``transient``: a 5xx, a timeout, no connection), logged and counted when it
        opens or closes the breaker; True when it just closed (every waiting card may go at once)."""
        if not transient:
            if not self.answered():
                return False
            log.warning("Feishu answers again: outage breaker closed, sending every waiting card")
            metrics.breaker_open.set(0)
            metrics.breaker_transitions.labels(to="closed").inc()
            return True
        if self.failure(now):
            log.error(
                "Feishu is failing for every card: outage breaker open, probing every %.0f s",
                self.probe_interval,
            )
            metrics.breaker_open.set(1)
            metrics.breaker_transitions.labels(to="open").inc()
        return False

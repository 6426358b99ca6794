"""What one write's outcome does to its card's slot: delivered, retried, paused, degraded, given up on.

The scheduler launches writes; ``Outcomes.settle`` decides, per outcome (``ports.OutcomeKind``,
classified once by the card's writer), what the card waits for next, and says when the card is done
with — its final state delivered, or never to be written again — so the scheduler lets it go. Every
retry is bounded (``BackoffPolicy``; a final state's patience lasts as long as the process), every
give-up is logged, and a gateway limit pauses every card of the app (its budgets here, and in cluster
mode the shared ones through the gate).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from feishu_progress.backoff import BackoffPolicy
from feishu_progress.metrics import Metrics
from feishu_progress.ports import OutcomeKind, WriteOutcome
from feishu_progress.progress.breaker import OutageBreaker
from feishu_progress.progress.rate_budget import BudgetTable
from feishu_progress.progress.slots import CardSlot
from feishu_progress.progress.writer import Delivery, DeliveryGate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Done:
    """The card is done with: its final state delivered (``reason`` None), or stopped for ``reason``."""

    reason: str | None = None


FINAL_DELIVERED = Done()


class Outcomes:
    """Acts on the write outcomes of one app's cards."""

    def __init__(
        self,
        budgets: BudgetTable,
        *,
        metrics: Metrics,
        backoff: BackoffPolicy,
        rng: random.Random,
        breaker: OutageBreaker,
        gate: DeliveryGate | None,
        default_pause: float,
    ) -> None:
        self._budgets = budgets
        self._metrics = metrics
        self._backoff = backoff
        self._rng = rng
        self._breaker = breaker
        self._gate = gate
        self._default_pause = default_pause

    def settle(
        self, slot: CardSlot, delivery: Delivery | None, outcome: WriteOutcome, now: float
    ) -> Done | None:
        """Bring ``slot`` up to date with how its flight went; a ``Done`` when the card is done with."""
        self._metrics.patches.labels(outcome=outcome.kind.value).inc()
        kind = outcome.kind
        if kind in (OutcomeKind.DELIVERED, OutcomeKind.PARTIAL):
            if delivery is None:  # never: these only follow a successful build
                return None
            follow_up = now + outcome.retry_after if kind is OutcomeKind.PARTIAL else None
            return self._delivered(slot, delivery, now, follow_up)
        if kind is OutcomeKind.RETRY_MESSAGE:
            self._metrics.rate_limit_hits.labels(kind="message").inc()
            self._retry(slot, outcome, max(outcome.retry_after, slot.card.writer.interval), now)
        elif kind is OutcomeKind.PAUSE_APP:
            self._pause(slot, outcome, now)
        elif kind is OutcomeKind.BACKOFF and self._breaker.is_open:
            slot.restore_flight()  # it waits for the breaker; an outage costs no attempt
        elif kind is OutcomeKind.BACKOFF:
            self._retry(slot, outcome, self._backoff.delay(slot.failures + 1, self._rng), now)
        elif kind is OutcomeKind.STOP:
            return self.stopped(
                slot, outcome.reason or f"message can no longer be updated (code {outcome.code})"
            )
        elif kind is OutcomeKind.DEGRADE:
            return self._degrade(slot, outcome)
        return None

    def _delivered(
        self, slot: CardSlot, delivery: Delivery, now: float, follow_up: float | None
    ) -> Done | None:
        slot.settled_version = delivery.version
        slot.follow_up_at = follow_up
        if follow_up is not None and slot.waiting_since is None:
            # What the flight left owed (a CardKit card's panels) waits from now: behind the cards whose
            # changes waited before this write (its text just went), not behind every card for ever.
            slot.waiting_since = now
        slot.failures = 0
        self._metrics.delivery_staleness.observe(max(0.0, now - delivery.changed_at))
        if slot.has_news:
            return None
        slot.waiting_since = None
        return FINAL_DELIVERED if slot.card.is_terminal else None

    def _pause(self, slot: CardSlot, outcome: WriteOutcome, now: float) -> None:
        self._metrics.rate_limit_hits.labels(kind="app").inc()
        pause = outcome.retry_after if outcome.retry_after > 0 else self._default_pause
        for api in slot.flight_apis:  # which of its calls was refused is not told: all of them
            self._budgets.get(api, now).pause_until(now + pause)
            if self._gate is not None:
                self._gate.paused(api, pause)
        log.warning("app rate limit hit (code %s): pausing every card for %.2fs", outcome.code, pause)
        self._retry(slot, outcome, pause, now)

    def _retry(self, slot: CardSlot, outcome: WriteOutcome, delay: float, now: float) -> None:
        slot.failures += 1
        limit = self._backoff.attempts_for(slot.card.is_terminal)
        if slot.failures >= limit:
            self._give_up(slot, outcome, limit)
            return
        slot.restore_flight()
        slot.next_start = max(slot.next_start, now + delay)

    def _give_up(self, slot: CardSlot, outcome: WriteOutcome, attempts: float) -> None:
        message_id = slot.card.message_id
        level = logging.ERROR if slot.card.is_terminal else logging.WARNING
        log.log(
            level,
            "giving up on version %d of message %s after %.0f attempts: %s %s",
            slot.flight_version,
            message_id,
            attempts,
            outcome.kind.value,
            outcome.reason,
            extra={"message_id": message_id, "code": outcome.code},
        )
        self._metrics.delivery_give_ups.labels(reason="attempts_exhausted").inc()
        slot.settled_version = slot.flight_version
        slot.failures = 0
        if slot.has_news:  # a newer state arrived meanwhile: it gets its own fresh attempts
            slot.restore_flight()
        else:
            slot.waiting_since = None

    def _degrade(self, slot: CardSlot, outcome: WriteOutcome) -> Done | None:
        if slot.degraded:
            return self.stopped(slot, f"degraded card rejected too: {outcome.reason or outcome.code}")
        log.warning(
            "card of message %s rejected (%s %s): resending a degraded card",
            slot.card.message_id,
            outcome.code,
            outcome.reason,
            extra={"message_id": slot.card.message_id},
        )
        # Sticky: the full card would be rejected again, and a card must not pay two writes per state.
        slot.degraded = True
        slot.restore_flight()
        return None

    def stopped(self, slot: CardSlot, reason: str) -> Done:
        message_id = slot.card.message_id
        log.warning("stopped updating message %s: %s", message_id, reason, extra={"message_id": message_id})
        self._metrics.delivery_give_ups.labels(reason="stopped").inc()
        slot.card.mark_stopped(reason)
        return Done(reason)

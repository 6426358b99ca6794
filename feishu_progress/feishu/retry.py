"""Bounded retries with jitter for the calls that create something (send, reply, image upload).

The caller makes the request idempotent (send and reply carry the same ``uuid`` on every attempt, so
Feishu returns the first message instead of a second one); this module only decides when to try again
(``errors.retry_delay``) and for how long, on the injected clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from feishu_progress.backoff import backoff_delay
from feishu_progress.feishu.errors import retry_delay
from feishu_progress.ports import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FeishuRetryPolicy:
    """At most ``attempts`` tries; waits double from ``base_seconds`` (jittered), at most ``max_seconds``."""

    attempts: int = 4
    base_seconds: float = 0.3
    max_seconds: float = 2.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        return backoff_delay(attempt, self.base_seconds, self.max_seconds, rng)


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    clock: Clock,
    policy: FeishuRetryPolicy,
    rng: random.Random,
) -> T:
    """``await call()``, trying again on transient failures; the last failure is raised."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return await call()
        except Exception as exc:
            hint = retry_delay(exc)
            if hint is None or attempt == policy.attempts:
                raise
            delay = min(policy.max_seconds, hint) if hint > 0 else policy.backoff(attempt, rng)
            log.info(
                "%s failed (%s), attempt %d of %d: retrying in %.2fs",
                what,
                type(exc).__name__,
                attempt,
                policy.attempts,
                delay,
            )
            await clock.sleep(delay)
    raise AssertionError("unreachable")

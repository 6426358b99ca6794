"""Fault injection for the sandbox: injected 5xx, hangs, 429 storms, slow answers and lost answers.

Two ways a call fails, as a client sees them: the request never reached Feishu (``fail``, ``fail_next``:
nothing happened, try again), or Feishu did the work and the answer was lost on the way back
(``lose_answers``: the message exists, the client only sees a 5xx) — the case a send's ``uuid`` is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

MESSAGE_ENDPOINTS: frozenset[str] = frozenset({"send", "reply", "patch", "image"})
CARDKIT_ENDPOINTS: frozenset[str] = frozenset({"card_create", "card_update", "card_settings", "card_content"})
API_ENDPOINTS: frozenset[str] = MESSAGE_ENDPOINTS | CARDKIT_ENDPOINTS
ALL_ENDPOINTS: frozenset[str] = API_ENDPOINTS | {"token"}


class FaultKind(StrEnum):
    ERROR = "error"
    HANG = "hang"
    STORM = "storm"
    LOST_ANSWER = "lost_answer"  # the request is carried out, then answered with ``status``


@dataclass(frozen=True, slots=True)
class Fault:
    """What to do to one request instead of answering it normally."""

    kind: FaultKind
    status: int = 500
    retry_after: float = 0.0


class Faults:
    """Test-controlled misbehaviour, decided per request and per endpoint.

    ``now`` is the sandbox's (possibly scaled or fake) clock, so storms last sandbox seconds.
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._released = asyncio.Event()
        self.clear()

    def clear(self) -> None:
        """Back to a well-behaved server."""
        self._error_ratio = 0.0
        self._error_status = 500
        self._error_endpoints: frozenset[str] = frozenset()
        self._rng = random.Random(0)
        self._hangs_left = 0
        self._hang_endpoints: frozenset[str] = frozenset()
        self._storm_until = 0.0
        self._storm_endpoints: frozenset[str] = frozenset()
        self._delay_seconds = 0.0
        self._delay_endpoints: frozenset[str] = frozenset()
        self._failures_left = 0
        self._failure_status = 500
        self._failure_endpoints: frozenset[str] = frozenset()
        self._losses_left = 0
        self._loss_status = 500
        self._loss_endpoints: frozenset[str] = frozenset()
        self.drops_expired_streams = False

    def fail(
        self, ratio: float, *, status: int = 500, endpoints: Iterable[str] = ("patch",), seed: int = 0
    ) -> None:
        """Answer ``ratio`` (0..1) of requests with HTTP ``status``, drawn from a seeded RNG."""
        self._error_ratio = ratio
        self._error_status = status
        self._error_endpoints = frozenset(endpoints)
        self._rng = random.Random(seed)

    def fail_next(self, count: int, *, status: int = 500, endpoints: Iterable[str] = ("send",)) -> None:
        """Answer the next ``count`` requests on ``endpoints`` with HTTP ``status`` before doing anything."""
        self._failures_left = count
        self._failure_status = status
        self._failure_endpoints = frozenset(endpoints)

    def lose_answers(
        self, count: int, *, status: int = 500, endpoints: Iterable[str] = ("send", "reply")
    ) -> None:
        """Carry out the next ``count`` requests on ``endpoints``, then answer HTTP ``status`` instead.

        A send's message exists although its sender was told it failed: only a retry with the same
        ``uuid`` finds it again instead of sending a second card.
        """
        self._losses_left = count
        self._loss_status = status
        self._loss_endpoints = frozenset(endpoints)

    def outage(self, *, status: int = 503, endpoints: Iterable[str] = ALL_ENDPOINTS) -> None:
        """Feishu is down: every request on ``endpoints`` is answered ``status`` until ``clear``."""
        self.fail(1.0, status=status, endpoints=endpoints)

    def hang(self, count: int, *, endpoints: Iterable[str] = ("patch",)) -> None:
        """Never answer the next ``count`` requests (until ``release_hangs`` or the sandbox stops)."""
        self._hangs_left = count
        self._hang_endpoints = frozenset(endpoints)
        self._released.clear()

    def storm_429(self, seconds: float, *, endpoints: Iterable[str] = API_ENDPOINTS) -> None:
        """Answer everything with HTTP 429 / 99991400 for ``seconds`` of sandbox time."""
        self._storm_until = self._now() + seconds
        self._storm_endpoints = frozenset(endpoints)

    def slow(self, milliseconds: float, *, endpoints: Iterable[str] = ALL_ENDPOINTS) -> None:
        """Delay every answer by ``milliseconds`` of real time."""
        self._delay_seconds = milliseconds / 1000
        self._delay_endpoints = frozenset(endpoints)

    def drop_expired_streams(self, enabled: bool = True) -> None:
        """Answer streamed text after the streaming window closed with success, and drop it.

        A peer saw updates after 10 minutes vanish with no error (lark-coding-agent-bridge #289):
        a client must re-open the window in time rather than wait for 200850.
        """
        self.drops_expired_streams = enabled

    def release_hangs(self) -> None:
        """Let every hanging request finish (with a 504)."""
        self._released.set()

    async def wait_released(self, cap_seconds: float) -> None:
        """Park a hanging request until released, at most ``cap_seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), cap_seconds)

    def delay_for(self, endpoint: str) -> float:
        """Seconds to wait before answering on ``endpoint``."""
        return self._delay_seconds if endpoint in self._delay_endpoints else 0.0

    def decide(self, endpoint: str) -> Fault | None:
        """The fault for this request, if any (consumes hang counts and RNG draws)."""
        if endpoint in self._hang_endpoints and self._hangs_left > 0:
            self._hangs_left -= 1
            return Fault(FaultKind.HANG, status=504)
        remaining = self._storm_until - self._now()
        if endpoint in self._storm_endpoints and remaining > 0:
            return Fault(FaultKind.STORM, status=429, retry_after=remaining)
        if endpoint in self._failure_endpoints and self._failures_left > 0:
            self._failures_left -= 1
            return Fault(FaultKind.ERROR, status=self._failure_status)
        if endpoint in self._loss_endpoints and self._losses_left > 0:
            self._losses_left -= 1
            return Fault(FaultKind.LOST_ANSWER, status=self._loss_status)
        if endpoint in self._error_endpoints and self._rng.random() < self._error_ratio:
            return Fault(FaultKind.ERROR, status=self._error_status)
        return None

"""The sandbox's record of every card update, for tests that run several service instances (test-only).

Feishu holds the truth about what reached it; so does the sandbox. For each message (and each CardKit
card entity) it keeps the ordered log of every update request — im/v1 PATCH and the three CardKit
updates — with the times it arrived and was answered on the sandbox's clock, the code it was answered
with, which instance sent it (the ``X-FP-Instance`` header the service's client sends) and how many
other updates of the same target were still in flight when it arrived. ``GET /_sandbox/messages``
serves it (server.py); nothing here does I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

UPDATE_ENDPOINTS = frozenset({"patch", "card_update", "card_settings", "card_content"})


@dataclass(slots=True)
class UpdateRecord:
    """One update request of one target (a message id, or a card id for CardKit calls)."""

    target: str
    endpoint: str
    instance: str | None
    arrived: float  # the sandbox's clock when the request arrived, before faults, delays or checks
    concurrent: int  # updates of the same target already in flight when this one arrived
    answered: float | None = None  # None: never answered (the sandbox stopped, or the client went away)
    code: int | None = None  # the Feishu code answered (0: accepted), or the HTTP status of a non-JSON answer
    status: int | None = None  # the HTTP status answered
    version: int | None = None  # accepted: the index in the message's history of the card it put on screen
    # Left unanswered and unapplied (its client went away before its body was read, or the handler failed):
    # when. Such an update changed nothing, so it is in flight only until then.
    abandoned: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "instance": self.instance,
            "arrived": self.arrived,
            "answered": self.answered,
            "abandoned": self.abandoned,
            "code": self.code,
            "status": self.status,
            "version": self.version,
            "concurrent": self.concurrent,
        }


class UpdateLog:
    """Every update request per target, in arrival order, and what was in flight when each arrived."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.by_target: dict[str, list[UpdateRecord]] = {}
        self.by_instance: Counter[str] = Counter()  # every Open API request, by X-FP-Instance
        self._in_flight: Counter[str] = Counter()

    def now(self) -> float:
        """The clock the records use: the host's ``time.monotonic()`` unless a test injected another."""
        return self._clock()

    def note_request(self, instance: str | None) -> None:
        """Count one Open API request of ``instance`` (any endpoint)."""
        self.by_instance[instance or ""] += 1

    def begin(self, target: str, endpoint: str, instance: str | None) -> UpdateRecord:
        """An update of ``target`` arrived; ``finish`` it when it is answered (or abandoned)."""
        record = UpdateRecord(target, endpoint, instance, self._clock(), self._in_flight[target])
        self._in_flight[target] += 1
        self.by_target.setdefault(target, []).append(record)
        return record

    def finish(
        self, record: UpdateRecord, code: int | None, status: int | None, version: int | None = None
    ) -> None:
        """The update left the sandbox: answered with ``code`` (None when it never was)."""
        self._in_flight[record.target] -= 1
        if self._in_flight[record.target] <= 0:
            del self._in_flight[record.target]
        if code is not None:
            record.answered = self._clock()
        else:
            record.abandoned = self._clock()
        record.code, record.status, record.version = code, status, version

    def records(self, targets: Iterable[str]) -> list[UpdateRecord]:
        """The records of every target in ``targets`` (a message and its card), by arrival."""
        merged = [record for target in targets for record in self.by_target.get(target, ())]
        return sorted(merged, key=lambda record: record.arrived)


def overlaps(records: Iterable[UpdateRecord]) -> int:
    """How many of ``records`` arrived while another update of the same target was in flight."""
    return sum(1 for record in records if record.concurrent > 0)

"""A CardKit card entity as one writer sees it, and which calls the next write makes. Pure.

A CardKit card (reference/feishu-platform.md §4) is written three ways: its answer text streams into one
element (typed out by the client, cheap), the whole card is replaced (status, tools, subagents, buttons),
and its streaming mode is switched on (which also restarts Feishu's 10-minute window) or off. The
scheduler launches one write per card at a time, at most every ``text_interval``; ``plan`` decides what
that write sends:

- streaming is on only while the task runs: a card that waits for the user (Feishu cannot update a
  streaming card from a callback answer) or has ended gets streaming off, then the full card;
- while streaming, text moves at every write, the rest of the card at most every ``panel_interval`` (an
  urgent change, e.g. after a click, at once); streaming is re-opened before the window closes;
- a write never makes two calls to one API, so charging a write once to one CardKit budget keeps each
  API within it.

``sequence`` is ``fence << 20 | n``: one counter per card across all calls, and a writer from a newer
epoch (a restart or a takeover bumps the fence) always counts above every older one, so Feishu itself
refuses a stale writer (300317).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

SEQUENCE_BITS = 20
MAX_FENCE = (2**31 - 1) >> SEQUENCE_BITS  # a sequence is an int32


class SequenceExhausted(Exception):
    """This epoch has used all its 2**20 sequence numbers (days of streaming): a new fence is needed."""


class Op(StrEnum):
    """One CardKit call; each goes to its own API (and its own app budget at Feishu)."""

    STREAM_ON = "stream_on"  # settings: streaming_mode true (opens, or re-opens, the window)
    STREAM_OFF = "stream_off"  # settings: streaming_mode false
    FULL = "full"  # the whole card
    TEXT = "text"  # the answer element's full text


@dataclass(frozen=True, slots=True)
class Pacing:
    """FP_CARDKIT__* in seconds."""

    panel_interval: float = 1.5
    streaming_window: float = 540.0


@dataclass(frozen=True, slots=True)
class Plan:
    """The calls of one write, in order, and when the rest of the card is due if this write leaves it
    behind (None: after this write the card shows everything it was built with)."""

    ops: tuple[Op, ...]
    owed_at: float | None = None


@dataclass(slots=True)
class CardStream:
    """What this writer has made of one card entity. Unknown (after a restart or takeover) until written."""

    card_id: str
    fence: int
    used: int = 0  # sequence numbers used in this fence's epoch
    panel_version: int | None = None  # the version of the card's panels last written whole
    text: str | None = None  # the answer text Feishu has (None: no answer element yet, or unknown)
    cut: str | None = None  # the cut marker after the answer as last written whole (None: none)
    streaming: bool | None = None  # None: unknown, switch it explicitly before relying on it
    opened_at: float = -math.inf  # when streaming was last switched on
    written_at: float = -math.inf  # when the whole card was last written

    def next_sequence(self) -> int:
        """The next sequence of this card (strictly rising across every call and every epoch)."""
        if self.used + 1 >= 1 << SEQUENCE_BITS or self.fence > MAX_FENCE:
            raise SequenceExhausted(f"card {self.card_id}: fence {self.fence} used {self.used}")
        self.used += 1
        return self.fence << SEQUENCE_BITS | self.used

    def done(
        self,
        op: Op,
        *,
        now: float,
        panel_version: int,
        text: str | None,
        streams: bool,
        cut: str | None = None,
    ) -> None:
        """Record a call Feishu accepted."""
        if op is Op.STREAM_ON:
            self.streaming, self.opened_at = True, now
        elif op is Op.STREAM_OFF:
            self.streaming = False
        elif op is Op.FULL:
            self.panel_version, self.text, self.written_at, self.streaming = panel_version, text, now, streams
            self.cut = cut
            if streams and self.opened_at == -math.inf:
                self.opened_at = now
        else:
            self.text = text


def plan(
    stream: CardStream,
    *,
    panel_version: int,
    text: str | None,
    streams: bool,
    urgent: bool,
    now: float,
    pacing: Pacing,
    cut: str | None = None,
) -> Plan:
    """The calls that bring the card entity to the built card (``text`` None: it has no answer element;
    ``cut``: the marker after a cut answer, which only a whole write changes)."""
    # The answer element appearing (or going) changes the card's layout: only a full write can do that.
    element_changed = (text is None) != (stream.text is None)
    panels_owed = stream.panel_version != panel_version or element_changed or cut != stream.cut
    if not streams:
        # Waiting for the user, or ended: streaming off first (it would block the callback's update).
        switch = (Op.STREAM_OFF,) if stream.streaming is not False else ()
        changed = panels_owed or text != stream.text or bool(switch)
        return Plan((*switch, Op.FULL) if changed else ())
    resumed = stream.streaming is not True  # after a wait for the user (or unknown): show the new state now
    reopen = resumed or now - stream.opened_at >= pacing.streaming_window
    switch = (Op.STREAM_ON,) if reopen else ()
    due = stream.written_at + pacing.panel_interval
    if panels_owed and (urgent or now >= due or element_changed or resumed):
        return Plan((*switch, Op.FULL))
    owed_at = due if panels_owed else None
    if text != stream.text:
        return Plan((*switch, Op.TEXT), owed_at)
    return Plan(switch, owed_at)


__all__ = ["CardStream", "Op", "Pacing", "Plan", "SequenceExhausted", "plan"]

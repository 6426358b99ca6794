"""A CardKit card entity as one writer sees it, and which calls the next write makes. Pure.

A CardKit card (docs/feishu-platform.md §4) is written three ways: its answer text streams into one
element (typed out by the client, cheap), the whole card is replaced (status, tools, subagents, buttons),
and its streaming mode is switched on (which also restarts Feishu's 10-minute window) or off. The
scheduler launches one write per card at a time, at most every ``text_interval``; ``plan`` decides what
that write sends:

- streaming is on only while the task runs: a card that waits for the user (Feishu cannot update a
  streaming card from a callback answer) or has ended gets streaming off, then the full card;
- while streaming, text moves at every write, the rest of the card at most every ``panel_interval`` (an
  urgent change, e.g. after a click, at once); streaming is re-opened before the window closes;
- each call goes to its own Open API and budget (``OP_API``): text by the element-content API's, panels
  by the card-update API's, so neither waits for the other's. ``plan_ahead`` names a write's calls from
  the card's versions before the write takes their budgets; ``plan`` decides from the built card and
  makes only calls that were budgeted (what it could not foresee goes with the next write). A write never
  calls one API twice. Under load a card's writes take turns: right after a whole write, the text goes
  alone first, so the cards waiting for each API's budget are as many as for the other's.

``sequence`` is ``fence << 20 | n``: one counter per card across all calls, and a writer from a newer
epoch (a restart or a takeover bumps the fence) always counts above every older one, so Feishu itself
refuses a stale writer (300317).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from enum import StrEnum

from feishu_progress.progress.writer import WriteChoices

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
    text_version: int | None = None  # the live card's text version of ``text`` (None: unknown)
    cut: int | None = None  # characters the answer's cut left out, as last written whole (None: uncut)
    panels_due: float | None = None  # a write left the panels behind: rewrite them whole from then
    streaming: bool | None = None  # None: unknown, switch it explicitly before relying on it
    opened_at: float = -math.inf  # when streaming was last switched on
    written_at: float = -math.inf  # when the whole card was last written
    # Whether this writer's last write was whole: its next write, the panels due again, sends the text
    # alone first (``plan_ahead``), so a card's writes take turns between the two APIs.
    whole_last: bool = False

    @classmethod
    def created(cls, card_id: str, fence: int, *, text: str | None, now: float) -> CardStream:
        """An entity this process just created from the card's first build (its panel and text versions
        are 0), streaming on: its first write streams the text or rewrites what changed, instead of
        rewriting the whole card (and switching streaming on again) only to learn what it shows.

        Half of the new cards (by their id) count the create as their whole write: cards created
        together then start on different APIs, so neither API's budget gets all of their first turns."""
        return cls(
            card_id,
            fence,
            panel_version=0,
            text=text,
            text_version=0,
            streaming=True,
            opened_at=now,
            written_at=now,
            whole_last=zlib.crc32(card_id.encode()) & 1 == 1,
        )

    def next_sequence(self) -> int:
        """The next sequence of this card (strictly rising across every call and every epoch)."""
        if self.used + 1 >= 1 << SEQUENCE_BITS or self.fence > MAX_FENCE:
            raise SequenceExhausted(f"card {self.card_id}: fence {self.fence} used {self.used}")
        self.used += 1
        return self.fence << SEQUENCE_BITS | self.used

    def done(self, op: Op, *, now: float, shown: Shown) -> None:
        """Record a call Feishu accepted, of a write that brought the card to ``shown``."""
        if op is Op.STREAM_ON:
            self.streaming, self.opened_at = True, now
        elif op is Op.STREAM_OFF:
            self.streaming = False
        elif op is Op.FULL:
            self.panel_version, self.written_at, self.streaming = shown.panel_version, now, shown.streams
            self.text, self.text_version, self.cut, self.panels_due = (
                shown.text,
                shown.text_version,
                shown.cut,
                None,
            )
            if shown.streams and self.opened_at == -math.inf:
                self.opened_at = now
            self.whole_last = True
        else:
            self.text, self.text_version, self.whole_last = shown.text, shown.text_version, False

    def panels_due_at(self, pacing: Pacing) -> float:
        """When the panels may be rewritten whole next (``panels_due``: a write that left them owed them)."""
        due = self.written_at + pacing.panel_interval
        return due if self.panels_due is None else min(due, self.panels_due)


@dataclass(frozen=True, slots=True)
class Shown:
    """What a built card shows, as a writer compares it with the entity (``text`` None: no answer element;
    ``cut``: how many characters a cut answer leaves out — its marker, which only a whole write changes)."""

    panel_version: int
    text: str | None
    streams: bool
    text_version: int | None = None
    cut: int | None = None


def plan(
    stream: CardStream,
    *,
    panel_version: int,
    text: str | None,
    streams: bool,
    urgent: bool,
    now: float,
    pacing: Pacing,
    cut: int | None = None,
    whole: bool = True,
    text_alone: bool = True,
) -> Plan:
    """The calls that bring the card entity to the built card (``whole`` False: this write may not
    rewrite the card whole — its budget is spent — so the text goes alone and the panels are owed;
    ``text_alone`` False: the text's own budget is spent, so the text goes in a whole write)."""
    # The answer element appearing (or going) changes the card's layout: only a full write can do that.
    element_changed = (text is None) != (stream.text is None)
    panels_owed = (
        stream.panel_version != panel_version
        or element_changed
        or cut != stream.cut
        or stream.panels_due is not None
    )
    owed = _Owed(panels_owed, text != stream.text, element_changed)
    budgets = _Budgets(whole=whole, text_alone=text_alone)
    return _choose(stream, owed, streams=streams, urgent=urgent, now=now, pacing=pacing, budgets=budgets)


def plan_ahead(
    stream: CardStream,
    *,
    panel_version: int,
    text_version: int,
    streams: bool,
    urgent: bool,
    now: float,
    pacing: Pacing,
) -> tuple[Plan, ...]:
    """The calls the next write may make, from the card's versions alone (before it is built), best
    first: the scheduler takes the budgets of the first whose APIs all have room — so when the panels
    are due but their budget is spent, the text still goes alone. ``plan`` decides again from the built
    card; a call this did not foresee waits for the next write (its panels then at once: ``panels_due``)."""
    text_owed = text_version != stream.text_version
    appears = text_owed and stream.text is None  # no answer element yet: text needs a whole write
    panels_owed = stream.panel_version != panel_version or stream.panels_due is not None or appears
    owed = _Owed(panels_owed, text_owed, appears)
    best = _choose(stream, owed, streams=streams, urgent=urgent, now=now, pacing=pacing)
    # The other API: the text alone when the whole card's budget is spent, or the text in a whole write
    # when the text's own budget is spent (the card-update API's spare room carries text too).
    other = _Budgets(whole=False) if Op.FULL in best.ops else _Budgets(text_alone=False)
    fallback = _choose(stream, owed, streams=streams, urgent=urgent, now=now, pacing=pacing, budgets=other)
    if not fallback.ops or fallback.ops == best.ops:
        return (best,)
    if _takes_turn(stream, best, fallback, urgent=urgent):
        return fallback, best
    return best, fallback


def _takes_turn(stream: CardStream, best: Plan, fallback: Plan, *, urgent: bool) -> bool:
    """Whether a write that could be whole sends the text alone first, its last write having been whole.

    Under load every write of a card finds its panels due again, and a card that always asked for the
    card-update budget first would leave the element-content budget to whoever that one turned away:
    the cards would stand in two lines, one per API, of lengths nothing sets (at 100 cards about 60 and
    40, so one line's text waited 3.6 s and the other's 2.4 s). A card whose writes take turns between
    the two APIs puts as many cards in each line as the other. An urgent write (a click's change) and
    one that resumes streaming show the whole card at once, as ever.
    """
    return (
        stream.whole_last
        and not urgent
        and stream.streaming is True
        and Op.FULL in best.ops
        and Op.TEXT in fallback.ops
    )


@dataclass(frozen=True, slots=True)
class _Budgets:
    """Which calls a write may make: a whole card (card update), the text alone (element content)."""

    whole: bool = True
    text_alone: bool = True


@dataclass(frozen=True, slots=True)
class _Owed:
    """What the entity lacks: its panels, its text, and whether the answer element comes or goes."""

    panels: bool
    text: bool
    element_changed: bool


def _choose(
    stream: CardStream,
    owed: _Owed,
    *,
    streams: bool,
    urgent: bool,
    now: float,
    pacing: Pacing,
    budgets: _Budgets = _Budgets(),
) -> Plan:
    panels_owed, text_owed, element_changed = owed.panels, owed.text, owed.element_changed
    whole = budgets.whole
    if not streams:
        # Waiting for the user, or ended: streaming off first (it would block the callback's update).
        switch = (Op.STREAM_OFF,) if stream.streaming is not False else ()
        changed = panels_owed or text_owed or bool(switch)
        if not whole:  # only a whole write shows this state: it waits for its budget
            return Plan((), now if changed else None)
        return Plan((*switch, Op.FULL) if changed else ())
    resumed = stream.streaming is not True  # after a wait for the user (or unknown): show the new state now
    reopen = resumed or now - stream.opened_at >= pacing.streaming_window
    switch = (Op.STREAM_ON,) if reopen else ()
    due = stream.panels_due_at(pacing)
    if panels_owed and (urgent or now >= due or element_changed or resumed):
        if whole:
            return Plan((*switch, Op.FULL))
        if element_changed:  # no answer element to stream into: only a whole write will do
            return Plan((), now)
    owed_at = due if panels_owed else None
    if text_owed and not budgets.text_alone:
        return Plan((*switch, Op.FULL) if whole else (), None if whole else now)
    if text_owed:
        return Plan((*switch, Op.TEXT), owed_at)
    return Plan(switch, owed_at)


# Each call goes to its own Open API, with its own app budget (the names of the budget table).
OP_API: dict[Op, str] = {
    Op.STREAM_ON: "card_settings",
    Op.STREAM_OFF: "card_settings",
    Op.FULL: "card_update",
    Op.TEXT: "card_content",
}
WRITE_APIS = ("card_content", "card_update")  # what almost every write of a card entity spends


def choices_of(plans: tuple[Plan, ...]) -> WriteChoices:
    """``plan_ahead``'s plans as the scheduler takes them."""
    owed = [chosen.owed_at for chosen in plans if chosen.owed_at is not None]
    return WriteChoices(tuple(apis_of(chosen) for chosen in plans), min(owed, default=math.inf))


def apis_of(chosen: Plan) -> tuple[str, ...]:
    """The Open APIs a plan's calls go to, each once (a write never calls one API twice)."""
    return tuple(dict.fromkeys(OP_API[op] for op in chosen.ops))


__all__ = [
    "OP_API",
    "WRITE_APIS",
    "CardStream",
    "Op",
    "Pacing",
    "Plan",
    "SequenceExhausted",
    "Shown",
    "apis_of",
    "choices_of",
    "plan",
    "plan_ahead",
]

"""The delivery issue's "Done when", through the real HTTP path, against the sandbox's real limits.

DeliveryScheduler → the card's PatchWriter → FeishuClient (one aiohttp session) → the sandbox
(``run_sandbox`` on a free port), which enforces 5 PATCH/s per message, 50/s and 1000/min per app,
30 KB per card, recalls, and answers with Feishu's real codes (230020, 99991400/HTTP 429, 230025, 230011).

Time is scaled: a ``ScaledClock`` makes ``SCALE`` (10) fake seconds pass per real second, and the very
same clock drives the scheduler, the client's token cache and the sandbox (``run_sandbox(clock=...)``),
so the sandbox measures its windows in the seconds the scheduler budgets in. "Scaled s" below means
seconds of that clock; a 60 s budget window lasts 6 real seconds. Real latency is magnified by the same
factor (1 ms of real latency is 10 ms of scaled time), which makes these runs *harsher* than real Feishu
on the budget's margins, never gentler.

Why these tests would catch a regression (not just pass on a quiet server):
- ``test_without_the_app_budget_the_same_load_meets_429s`` runs the load with the budget lifted and sees
  the sandbox answer 99991400/429: the zero-429 assertion of the 500-card test is therefore not vacuous.
- The 500-card test demands >= 95 % of what 1000/min allows; a scheduler that paced too timidly, starved
  cards, or lost a final state fails it, and one that overspent meets 429s (the sandbox counts them).
- The fault tests look at what the sandbox holds (its per-message history and answer counters), not at
  what the scheduler believes it did.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from feishu_progress.cards.builder import BuiltCard, build_card, build_degraded, build_progress_card
from feishu_progress.config import CardKitSettings, FeishuSettings, RateSettings
from feishu_progress.domain import CardModel, TaskStatus
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.feishu.writers import CardWriters
from feishu_progress.progress.live_card import BuildCard, CardContext, LiveCard
from feishu_progress.progress.rate_budget import BudgetTable
from feishu_progress.progress.scheduler import BackoffPolicy, DeliveryScheduler
from feishu_progress.sandbox import RunningSandbox, SandboxConfig, SandboxMessage, run_sandbox
from tests.fakes import card_model
from tests.test_scheduler_fakes import finish, push

pytestmark = pytest.mark.slow

SCALE = 10.0  # scaled seconds per real second
# The 500-card run's: a stall of the process (the other test worker busy on the second core) leaves the
# budget unspent for that long, and the smoothing bucket banks only a second's worth (50 calls) to catch
# up with. At 10x, two 0.4 s real stalls (SIGSTOP) cost 1.3 % of the run's budget against a 5 % margin,
# and CI once spent 94.6 %; at 5x the same stalls cost half as many scaled seconds.
LOAD_SCALE = 5.0
# The load tests skip the sandbox's JSON-schema check of each card (2-5 ms of CPU in this very event loop,
# which at 10x time would cap the sandbox near 20 requests per scaled second, below the 50/s it must
# enforce). Sizes, element counts and every rate limit are still enforced; that the builder's cards pass
# the schema is proven by tests/test_cards_*.py, and the fault tests below keep the check on.
LOAD = SandboxConfig(validate_cards=False)
PER_MINUTE = 1000  # the default app budget (RateSettings / SandboxConfig)
PER_SECOND = 50
RUNNING = TaskStatus.RUNNING
COMPLETED = TaskStatus.COMPLETED

# Codes the sandbox answers with (docs/feishu-platform.md).
MESSAGE_RATE_LIMITED = 230020
GATEWAY_RATE_LIMITED = 99991400
HTTP_TOO_MANY = 429
CARD_TOO_LARGE = 230025
MESSAGE_RECALLED = 230011


class ScaledClock:
    """ports.Clock where ``scale`` fake seconds pass per real second (sleeps shrink by the same factor)."""

    def __init__(self, scale: float, origin: float = 1000.0, wall_origin: float = 1_780_000_000.0) -> None:
        self.scale = scale
        self._origin = origin
        self._wall_offset = wall_origin - origin
        self._start = time.monotonic()

    def monotonic(self) -> float:
        return self._origin + (time.monotonic() - self._start) * self.scale

    def wall(self) -> float:
        return self.monotonic() + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.scale)


def as_sent(card: dict[str, Any]) -> dict[str, Any]:
    """A card as the sandbox stores it (what travelled as JSON, parsed back)."""
    parsed: dict[str, Any] = json.loads(json.dumps(card, ensure_ascii=False))
    return parsed


@dataclass
class Rig:
    """One sandbox, one client session, one scheduler, all on one scaled clock."""

    clock: ScaledClock
    sandbox: RunningSandbox
    client: FeishuClient
    scheduler: DeliveryScheduler
    writers: CardWriters

    def message(self, card: LiveCard) -> SandboxMessage:
        return self.sandbox.state.messages[card.message_id]

    def sandbox_now(self) -> float:
        """The sandbox's own timestamp for "now" (history entries use this time base)."""
        return self.sandbox.state.now()

    async def open_cards(
        self, count: int, *, build_card: BuildCard = build_card, per_second: int = 40
    ) -> list[LiveCard]:
        """Send ``count`` card messages (within the send budget: no 429 is spent here) and wrap each."""
        cards: list[LiveCard] = []
        for first in range(0, count, per_second):
            batch = range(first, min(first + per_second, count))
            contexts = [
                CardContext(
                    session_id=i + 1, message_id="", title=f"task {i + 1}", started_at=self.clock.wall()
                )
                for i in batch
            ]
            first_cards = [
                build_card(card_model(session_id=c.session_id, status=RUNNING)).card for c in contexts
            ]
            ids = await asyncio.gather(
                *(
                    self.client.send_card("ou_tester", "open_id", body, f"fp-delivery-{c.session_id}")
                    for c, body in zip(contexts, first_cards, strict=True)
                )
            )
            cards.extend(
                LiveCard(
                    CardContext(c.session_id, mid, title=c.title, started_at=c.started_at),
                    writer=self.writers.for_card(mid, None, 0),
                    clock=self.clock,
                    build_card=build_card,
                    build_degraded_card=build_degraded,
                    scheduler=self.scheduler,
                )
                for c, mid in zip(contexts, ids, strict=True)
            )
            # Sandbox: 50 sends/s, counted when a request *arrives*. Every send of this batch arrived
            # before it was answered, so one second after the last answer they are all out of the window.
            await self.clock.sleep(1.05)
        return cards

    async def drain(self, deadline: float) -> None:
        """Wait (scaled seconds) until nothing is pending; fail if that takes longer than ``deadline``."""
        end = self.clock.monotonic() + deadline
        while self.scheduler.pending_message_ids():
            assert self.clock.monotonic() < end, (
                f"{len(self.scheduler.pending_message_ids())} cards still pending after {deadline} scaled s"
            )
            await self.clock.sleep(0.25)


@asynccontextmanager
async def rig(
    *,
    rate: RateSettings | None = None,
    config: SandboxConfig | None = None,
    backoff: BackoffPolicy | None = None,
    scale: float = SCALE,
) -> AsyncIterator[Rig]:
    clock = ScaledClock(scale)
    async with run_sandbox(config or SandboxConfig(), clock=clock.monotonic) as sandbox:
        settings = FeishuSettings(base_url=sandbox.base_url, timeout_seconds=10.0)
        async with FeishuClient(settings, clock=clock) as client:
            rate = rate or RateSettings()
            scheduler = DeliveryScheduler(
                BudgetTable(rate), clock=clock, backoff=backoff, rng=random.Random(7)
            )
            writers = CardWriters(
                client, CardKitSettings(), clock=clock, message_interval=rate.message_interval_ms / 1000
            )
            scheduler.start()
            try:
                yield Rig(clock, sandbox, client, scheduler, writers)
            finally:
                await scheduler.stop()


async def drive(
    rig: Rig, cards: Sequence[LiveCard], *, seconds: float, per_second: float
) -> dict[str, float]:
    """Update ``cards`` round-robin at ``per_second`` updates per scaled second for ``seconds``.

    Returns each card's first update time in sandbox time (from then on it always has news within one
    round-robin lap, so gaps between its PATCHes measure how long it waited).
    """
    first_update: dict[str, float] = {}
    rounds = [card.state.panels.round for card in cards]  # a second drive continues where the first stopped
    started = rig.clock.monotonic()
    done = 0
    while (elapsed := rig.clock.monotonic() - started) < seconds:
        target = int(elapsed * per_second) + 1
        while done < target:
            index = done % len(cards)
            card = cards[index]
            rounds[index] += 1
            push(card, round=rounds[index], content=f"step {rounds[index]} of task {card.session_id}")
            first_update.setdefault(card.message_id, rig.sandbox_now())
            done += 1
        await rig.clock.sleep(0.05)
    return first_update


def patch_times(message: SandboxMessage) -> list[float]:
    """Sandbox times of the PATCHes the sandbox accepted (history[0] is the send)."""
    return [at for at, _ in message.history[1:]]


def max_in_window(times: Sequence[float], span: float) -> int:
    """The most events any half-open window of ``span`` seconds holds (the sandbox's own rule)."""
    ordered = sorted(times)
    return max((i + 1 - bisect.bisect_right(ordered, t - span) for i, t in enumerate(ordered)), default=0)


def assert_no_rate_limit_answers(rig: Rig) -> None:
    responses = rig.sandbox.state.responses
    assert responses[MESSAGE_RATE_LIMITED] == 0, f"per-message limit hit: {responses}"
    assert responses[GATEWAY_RATE_LIMITED] == 0, f"app budget overspent: {responses}"
    assert responses[HTTP_TOO_MANY] == 0, f"HTTP 429 seen: {responses}"


def assert_final_state_is_latest(rig: Rig, cards: Sequence[LiveCard]) -> None:
    for card in cards:
        assert card.is_terminal and card.stopped_reason is None
        # A terminal card's elapsed time is frozen, so rendering it now gives exactly what was sent.
        assert rig.message(card).card == as_sent(card.render_current()), f"{card.message_id} stale"


# -- 1. 500 cards at ten times the budget ---------------------------------------------------------------


async def test_500_cards_at_ten_times_the_budget_spend_it_fully_fairly_and_without_a_429() -> None:
    """500 cards, 10x the 1000/min budget of updates for 120 scaled s, then 500 final states.

    Time runs 5x faster than real time (``LOAD_SCALE``): about 165 scaled s take about 33 real seconds.
    """
    cards_count, window = 500, 120.0
    budget_per_second = PER_MINUTE / 60.0
    started_real = time.monotonic()
    async with rig(config=LOAD, scale=LOAD_SCALE) as r:
        cards = await r.open_cards(cards_count)
        window_start = r.sandbox_now()
        first_update = await drive(r, cards, seconds=window, per_second=10 * budget_per_second)
        window_end = r.sandbox_now()
        for card in cards:
            finish(card, COMPLETED, r.clock, content=f"done: task {card.session_id}")
        # 500 final states at 1000/min need 30 scaled s; allow twice that.
        await r.drain(60.0)
        finished = r.sandbox_now()

        messages = [r.message(card) for card in cards]
        all_times = [at for message in messages for at in patch_times(message)]
        in_window = [at for at in all_times if window_start <= at <= window_end]
        allowed = budget_per_second * (window_end - window_start)
        # No starvation: from its first change to its final state, every card was PATCHed at least every
        # cards ÷ budget × 2 scaled seconds (30 s per lap at 1000/min → 60 s). Measured from the first
        # change on, so the time a card had nothing new (< 3 s per lap here) counts against it too.
        bound = cards_count / budget_per_second * 2
        worst = max(
            max(b - a for a, b in itertools.pairwise([first_update[card.message_id], *patch_times(message)]))
            for card, message in zip(cards, messages, strict=True)
        )
        print(
            f"\n500 cards: {len(in_window)} PATCHes in {window_end - window_start:.1f} scaled s "
            f"(budget {allowed:.0f}, {len(in_window) / allowed:.1%}); worst gap {worst:.1f} s "
            f"(bound {bound:.0f}); finals drained in {finished - window_end:.1f} scaled s; "
            f"{time.monotonic() - started_real:.1f} s real; answers {dict(r.sandbox.state.responses)}"
        )

        assert_final_state_is_latest(r, cards)
        assert len(in_window) >= 0.95 * allowed, f"{len(in_window)} PATCHes, budget allowed {allowed:.0f}"
        # Never more than the sandbox's own windows hold (the accepted PATCHes: true by construction;
        # the attempts beyond them are the 429s checked next).
        assert max_in_window(all_times, 60.0) <= PER_MINUTE
        assert max_in_window(all_times, 1.0) <= PER_SECOND
        assert worst <= bound, f"a card waited {worst:.1f} scaled s (bound {bound:.0f})"
        # Spending at 100 % of the budget must still never cross it where Feishu counts: on arrival.
        # (Fails as of this writing: AppBudget frees a slot `window` s after a PATCH *started*, but the
        # gateway counts arrivals, which come later by a varying latency; see the delivery issue.)
        assert_no_rate_limit_answers(r)
        # Every PATCH that reached the sandbox was accepted: no budget wasted on refusals.
        assert r.sandbox.state.requests["patch"] == len(all_times)


async def test_without_the_app_budget_the_same_load_meets_429s() -> None:
    """The control: lift the scheduler's budget and the sandbox answers 99991400/429 at once."""
    unlimited = RateSettings.lifted(1e6, 1e9)
    # Time runs 2x only: the control must push more than 50 PATCHes per scaled second, and at 10x that is
    # 500 real ones a second, which a busy 2-core machine cannot always do (then no 429 shows up).
    async with rig(rate=unlimited, config=LOAD, scale=2.0) as r:
        cards = await r.open_cards(200)
        await drive(r, cards, seconds=5.0, per_second=10 * PER_MINUTE / 60.0)
        responses = r.sandbox.state.responses
        assert responses[GATEWAY_RATE_LIMITED] > 0, responses


# -- 2. transient server errors -------------------------------------------------------------------------


async def test_every_final_state_arrives_although_30_percent_of_patches_fail_with_5xx() -> None:
    async with rig() as r:
        cards = await r.open_cards(60)
        r.sandbox.state.faults.fail(0.3, status=500, endpoints=("patch",), seed=11)
        await drive(r, cards, seconds=20.0, per_second=60.0)
        for card in cards:
            finish(card, COMPLETED, r.clock, content=f"done: task {card.session_id}")
        # Backoff is at most 30 s per attempt; a 20-attempt streak at 30 % is ~1e-11 likely.
        await r.drain(120.0)

        responses = r.sandbox.state.responses
        assert responses[500] >= 0.2 * r.sandbox.state.requests["patch"], responses
        assert_no_rate_limit_answers(r)
        assert_final_state_is_latest(r, cards)


# -- 3. a card Feishu refuses as too large ----------------------------------------------------------------


BIG_SESSION = 3


def oversized_for_one_session(model: CardModel) -> BuiltCard:
    """The real builder, except that one task's card grows past 30 KB (as a builder bug would)."""
    card = build_progress_card(model)
    if model.session_id == BIG_SESSION and model.panels.round > 0:
        card["body"]["elements"].append({"tag": "markdown", "content": "x" * (31 * 1024)})
    return BuiltCard(card)


async def test_an_oversized_card_arrives_degraded_never_lost() -> None:
    async with rig() as r:
        cards = await r.open_cards(6, build_card=oversized_for_one_session)
        big = next(card for card in cards if card.session_id == BIG_SESSION)
        await drive(r, cards, seconds=3.0, per_second=12.0)
        await r.drain(10.0)

        def degraded_now(card: LiveCard) -> dict[str, Any]:
            twin = LiveCard(
                card.context,
                writer=card.writer,
                clock=r.clock,
                build_card=build_degraded,
                build_degraded_card=build_degraded,
                state=card.state,
            )
            return as_sent(twin.render_current())

        running = r.message(big)
        assert running.responses[CARD_TOO_LARGE] == 1  # refused once; degrading is sticky
        assert len(running.history) > 1
        expected = degraded_now(big)
        for _, accepted in running.history[1:]:  # every accepted PATCH was the degraded card
            assert accepted["body"]["elements"][1] == expected["body"]["elements"][1]
        # ...and the latest one carries the latest round (the summary has no elapsed time in it).
        assert running.card["config"] == expected["config"]

        for card in cards:
            finish(card, COMPLETED, r.clock, content=f"done: task {card.session_id}")
        await r.drain(10.0)

        assert big.stopped_reason is None
        assert r.message(big).card == degraded_now(big)
        assert r.message(big).responses[CARD_TOO_LARGE] == 1
        assert_final_state_is_latest(r, [card for card in cards if card is not big])
        assert_no_rate_limit_answers(r)


# -- 4. a recalled message -------------------------------------------------------------------------------


async def test_a_recalled_message_is_never_patched_again_and_says_why() -> None:
    async with rig() as r:
        cards = await r.open_cards(5)
        recalled, others = cards[0], cards[1:]
        await drive(r, cards, seconds=2.0, per_second=10.0)
        await r.drain(10.0)
        message = r.message(recalled)
        delivered_before = len(message.history)
        assert delivered_before > 1

        r.sandbox.state.recall(recalled.message_id)
        await drive(r, cards, seconds=3.0, per_second=10.0)
        await r.drain(10.0)
        assert recalled.stopped_reason == "message recalled"
        assert message.responses[MESSAGE_RECALLED] == 1
        answered = sum(message.responses.values())

        # Keep changing it, end it: nothing more reaches the sandbox for this message.
        await drive(r, cards, seconds=5.0, per_second=10.0)
        finish(recalled, COMPLETED, r.clock, content="done")
        for card in others:
            finish(card, COMPLETED, r.clock, content="done")
        await r.drain(10.0)
        await r.clock.sleep(2.0)

        assert sum(message.responses.values()) == answered
        # Exactly one PATCH reached the sandbox after the recall: the one answered 230011.
        assert message.responses == {0: delivered_before - 1, MESSAGE_RECALLED: 1}
        assert len(message.history) == delivered_before
        assert recalled.message_id not in r.scheduler.pending_message_ids()
        # Every PATCH the sandbox saw is accounted to some message: the per-message count is complete.
        counted = sum(sum(m.responses.values()) for m in r.sandbox.state.messages.values())
        assert counted == r.sandbox.state.requests["patch"]
        assert_final_state_is_latest(r, others)
        assert_no_rate_limit_answers(r)


# -- 5. Feishu down for everyone for 12 s -------------------------------------------------------------------


@pytest.mark.parametrize("cards_count", [10, 100])
async def test_a_12_second_outage_costs_one_probe_per_2_s_and_every_final_lands_within_5_s(
    cards_count: int,
) -> None:
    # Time runs only 2x here: at 10x, 50 PATCHes per scaled second are 500 real ones a second through one
    # event loop holding both client and sandbox, and the test would measure this machine's CPU.
    async with rig(config=LOAD, scale=2.0) as r:
        cards = await r.open_cards(cards_count)
        await drive(r, cards, seconds=2.0, per_second=min(40.0, 4.0 * cards_count))
        r.sandbox.state.faults.fail(1.0, status=503, endpoints=("patch",))  # every PATCH, the whole app
        outage_start = r.clock.monotonic()
        await drive(r, cards, seconds=2.0, per_second=min(40.0, 4.0 * cards_count))  # streaming goes on
        for card in cards:
            finish(card, COMPLETED, r.clock, content=f"done: task {card.session_id}")
        assert r.scheduler.breaker.is_open
        await r.clock.sleep(outage_start + 4.0 - r.clock.monotonic())
        requests_before = r.sandbox.state.requests["patch"]
        await r.clock.sleep(outage_start + 12.0 - r.clock.monotonic())
        probes = r.sandbox.state.requests["patch"] - requests_before
        assert probes <= 8 / 2 + 1, f"{probes} PATCHes in the outage's last 8 s"
        r.sandbox.state.faults.clear()  # Feishu answers again
        back = r.sandbox_now()
        await r.drain(30.0)
        landed = [r.message(card).history[-1][0] for card in cards]
        assert max(landed) - back <= 5.0, f"last final {max(landed) - back:.2f} s after Feishu returned"
        assert_no_rate_limit_answers(r)
        assert_final_state_is_latest(r, cards)

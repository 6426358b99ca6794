"""Benchmark: what the delivery scheduler costs with many live cards, idle or busy.

    python bench/scheduler_cpu.py --idle 10000 --busy 1000 --seconds 20 --runs 3 --transport patch

One process, the real clock, one app's scheduler with its default budgets (50/s and 1 000/min per Open
API), the real card builder, and a stand-in Open API client that answers every write after 20 ms (no
HTTP: the sandbox's own cost would drown the scheduler's). Three scenarios:

- idle: ``--idle`` cards, each written once, then nothing changes;
- busy: ``--busy`` cards, each changing its answer text every 100–300 ms (far more than the budget
  lets through: most cards wait for their turn all the time);
- mix: the busy cards among the idle ones (what a long-lived process holds: a few cards streaming,
  thousands that have not changed for a while).

Measured over the last ``--seconds`` (after a warm-up of a quarter of that): the process's CPU share
(CPU seconds per wall second: the scheduler, the cards' builds, the stand-in's answers and the driver's
state changes together), the dispatcher's own share (CPU inside its passes, which decide who goes next),
passes per second and writes per second.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import command_line, machine, write_section
from feishu_progress.cards.builder import build_card, build_degraded
from feishu_progress.config import CardKitSettings, RateSettings
from feishu_progress.domain import CardPanels, CardState, TaskStatus
from feishu_progress.feishu.writers import CardWriters
from feishu_progress.metrics import Metrics
from feishu_progress.ports import SystemClock
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.progress.rate_budget import BudgetTable
from feishu_progress.progress.scheduler import DeliveryScheduler

ANSWER_SECONDS = 0.02  # the stand-in Open API's latency
CHANGE_EVERY = (0.1, 0.3)  # a busy card's text changes this often (seconds, uniform)
DRIVER_TICK = 0.01


class WarpClock(SystemClock):
    """The real clock, ``offset`` seconds ahead (the setup jumps it to refill the budgets)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


class StandInClient:
    """Every Open API write the scheduler makes, answered after ``ANSWER_SECONDS``; counted."""

    def __init__(self) -> None:
        self.writes = 0

    async def _answer(self) -> None:
        self.writes += 1
        await asyncio.sleep(ANSWER_SECONDS)

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> None:
        await self._answer()

    async def update_card_entity(
        self, card_id: str, card: Mapping[str, Any], sequence: int, uuid: str
    ) -> None:
        await self._answer()

    async def set_card_streaming(self, card_id: str, streaming: bool, sequence: int, uuid: str) -> None:
        await self._answer()

    async def stream_card_text(
        self, card_id: str, element_id: str, content: str, sequence: int, uuid: str
    ) -> None:
        await self._answer()


@dataclass
class Rig:
    scheduler: DeliveryScheduler
    clock: WarpClock
    client: StandInClient
    cards: list[LiveCard]
    passes: list[int]
    pass_cpu: list[float]


def _rig(transport: str, cards: int) -> Rig:
    """One app's scheduler over the stand-in, and ``cards`` live cards of ``transport``."""
    clock, client = WarpClock(), StandInClient()
    rate, cardkit = RateSettings(), CardKitSettings()
    scheduler = DeliveryScheduler(BudgetTable(rate), clock=clock, metrics=Metrics())
    writers = CardWriters(client, cardkit, clock=clock, message_interval=rate.message_interval_ms / 1000)
    live = [
        LiveCard(
            CardContext(session_id=n, message_id=f"om_{n}", title=f"task {n}", started_at=time.time()),
            writer=writers.for_card(f"om_{n}", f"card_{n}" if transport == "cardkit" else None, 1),
            clock=clock,
            build_card=build_card,
            build_degraded_card=build_degraded,
            scheduler=scheduler,
        )
        for n in range(1, cards + 1)
    ]
    return Rig(scheduler, clock, client, live, *_count_passes(scheduler))


def _count_passes(scheduler: DeliveryScheduler) -> tuple[list[int], list[float]]:
    """Wrap the dispatcher's pass (bench-only instrumentation): how many, and their CPU time."""
    passes, cpu = [0], [0.0]
    original: Callable[[float], float | None] = scheduler._launch_ready

    def timed(now: float) -> float | None:
        started = time.thread_time()
        try:
            return original(now)
        finally:
            cpu[0] += time.thread_time() - started
            passes[0] += 1

    scheduler._launch_ready = timed  # type: ignore[method-assign]
    return passes, cpu


def _state(text: str) -> CardState:
    return CardState(CardPanels(status=TaskStatus.RUNNING, round=1), text, len(text))


async def _drive(busy: list[LiveCard], until: float, rng: random.Random) -> None:
    """Change each busy card's text every 100–300 ms until ``until`` (monotonic)."""
    due = [(time.monotonic() + rng.uniform(*CHANGE_EVERY), n) for n in range(len(busy))]
    heapq.heapify(due)
    texts = ["" for _ in busy]
    while time.monotonic() < until:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, n = heapq.heappop(due)
            texts[n] += "流式文本 "
            busy[n].record(_state(texts[n][-2000:]))
            heapq.heappush(due, (now + rng.uniform(*CHANGE_EVERY), n))
        await asyncio.sleep(DRIVER_TICK)


@dataclass(frozen=True)
class Sample:
    cpu_share: float
    pass_share: float
    passes_per_s: float
    writes_per_s: float


async def _measure(transport: str, idle: int, busy: int, seconds: float, seed: int) -> Sample:
    rig = _rig(transport, idle + busy)
    rig.scheduler.start()
    try:
        # The first writes of every card go at the budget's pace (10,000 cards: ~10 min at 1 000/min);
        # what is measured is the steady state after them, so they are let through unbudgeted.
        await _first_writes(rig, idle + busy)
        busy_cards = rig.cards[idle:]
        warm = seconds / 4
        start = time.monotonic()
        driving = asyncio.create_task(_drive(busy_cards, start + warm + seconds, random.Random(seed)))
        await asyncio.sleep(warm)
        wall0, cpu0, passes0, pass_cpu0, writes0 = (
            time.monotonic(),
            time.process_time(),
            rig.passes[0],
            rig.pass_cpu[0],
            rig.client.writes,
        )
        await driving
        wall = time.monotonic() - wall0
        return Sample(
            cpu_share=(time.process_time() - cpu0) / wall,
            pass_share=(rig.pass_cpu[0] - pass_cpu0) / wall,
            passes_per_s=(rig.passes[0] - passes0) / wall,
            writes_per_s=(rig.client.writes - writes0) / wall,
        )
    finally:
        await rig.scheduler.stop()


async def _first_writes(rig: Rig, cards: int) -> None:
    """Write every card's first state, a burst the budget takes at once at a time, the clock jumping a
    minute after each (setup only: 10,000 first writes at 1 000/min would take ten minutes)."""
    chunk = 40
    for start in range(0, cards, chunk):
        for card in rig.cards[start : start + chunk]:
            card.record(_state("started"))
        while rig.scheduler.pending_message_ids():
            await asyncio.sleep(0.01)
        rig.clock.offset += 61.0


def _fmt(values: list[float], digits: int = 1, scale: float = 1.0) -> str:
    xs = [v * scale for v in values]
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f}–{max(xs):,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--busy", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--transport", choices=("patch", "cardkit"), default="patch")
    parser.add_argument("--label", default="", help="what this build is (e.g. before / after)")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    scenarios = {"idle": (args.idle, 0), "busy": (0, args.busy), "mix": (args.idle, args.busy)}
    rows = []
    for name, (idle, busy) in scenarios.items():
        samples = [
            asyncio.run(_measure(args.transport, idle, busy, args.seconds, seed)) for seed in range(args.runs)
        ]
        for n, s in enumerate(samples, 1):
            print(
                f"{name} run {n}: CPU {s.cpu_share:.1%}, passes {s.pass_share:.2%} of a core "
                f"({s.passes_per_s:.0f}/s), writes {s.writes_per_s:.1f}/s",
                flush=True,
            )
        rows.append(
            f"| {name} | {idle:,} | {busy:,} | {_fmt([s.cpu_share for s in samples], 1, 100)} "
            f"| {_fmt([s.pass_share for s in samples], 2, 100)} "
            f"| {_fmt([s.passes_per_s for s in samples], 0)} "
            f"| {_fmt([s.writes_per_s for s in samples], 1)} |"
        )
    body = "\n".join(
        [
            f"### {args.transport} transport{' — ' + args.label if args.label else ''}, "
            f"medians of {args.runs} run(s) (min–max), {args.seconds:.0f} s measured",
            "",
            "| scenario | idle cards | busy cards | process CPU % | dispatcher passes, % of a core "
            "| passes/s | writes/s |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"*Machine:* {machine()}  ",
            f"*Command:* `{command_line()}`",
        ]
    )
    print("\n" + body)
    if not args.no_write:
        write_section(f"scheduler-cpu-{args.transport}{'-' + args.label if args.label else ''}", body)


if __name__ == "__main__":
    main()

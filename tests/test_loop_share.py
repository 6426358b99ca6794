"""Event batches take turns of the event loop (``LoopShare``): a turn holds at most a slice of them.

The slice is measured on a clock the test moves: each batch "works" by moving it, so which loop turn
each batch ran in is exact, not a matter of the machine's speed (``TurnCounter`` counts the turns).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.config import AdminSettings, ApiSettings, HttpSettings, Settings
from feishu_progress.web.load import LoopShare
from tests.fakes import TurnCounter


class WorkClock:
    """Seconds of work done: batches move it, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _batches(share: LoopShare, clock: WorkClock, count: int, work: float) -> list[tuple[int, int]]:
    """``count`` batches arriving together, each working ``work`` seconds: (batch, turn) as they ran."""
    turns = TurnCounter()
    ran: list[tuple[int, int]] = []

    async def batch(index: int) -> None:
        await share.take_turn()
        ran.append((index, turns.turn))
        clock.now += work

    await asyncio.gather(*(batch(index) for index in range(count)))
    turns.stop()
    return ran


async def test_a_turn_holds_no_more_batches_than_fit_in_the_slice() -> None:
    clock, waits = WorkClock(), []
    share = LoopShare(0.01, clock=clock, on_wait=lambda: waits.append(1))
    ran = await _batches(share, clock, count=40, work=0.003)
    per_turn: dict[int, int] = {}
    for _, turn in ran:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    # Batches start while the turn is younger than 10 ms: at 0, 3, 6 and 9 ms.
    assert max(per_turn.values()) <= 4
    assert len(per_turn) >= 10  # so the 40 took at least ten turns, with the loop's other work between
    assert [index for index, _ in ran] == list(range(40))  # and they ran in the order they came
    assert len(waits) == 36


async def test_a_batch_on_a_quiet_loop_never_waits() -> None:
    clock, waits = WorkClock(), []
    share = LoopShare(0.01, clock=clock, on_wait=lambda: waits.append(1))
    for _ in range(5):
        await share.take_turn()
        clock.now += 0.001
        await asyncio.sleep(0)  # the next batch comes in a later turn
        await asyncio.sleep(0)
    assert waits == []


async def test_a_waiting_batch_that_goes_away_does_not_hold_up_the_others() -> None:
    clock = WorkClock()
    share = LoopShare(0.01, clock=clock)

    async def batch(work: float) -> None:
        await share.take_turn()
        clock.now += work

    first = asyncio.ensure_future(batch(0.05))  # spends the turn's slice
    gone = asyncio.ensure_future(batch(0.0))
    kept = asyncio.ensure_future(batch(0.0))
    await asyncio.sleep(0)  # the three ran: the first is done, the others wait for the next turn
    assert first.done() and not kept.done()
    gone.cancel()  # a runtime that hung up while its batch waited
    await asyncio.wait_for(kept, timeout=1.0)
    assert gone.cancelled()


async def test_the_runtime_api_s_batches_take_turns_and_every_event_is_applied(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    """The production path: POST /v1/tasks/{id}/events waits for its turn before it is read."""
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'share.db'}",
        http=HttpSettings(host="127.0.0.1", port=0, batch_slice_seconds=1e-9),  # one batch a turn
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token="t"),
    )
    auth = {"Authorization": "Bearer t"}
    registry = CollectorRegistry()
    app = create_app(settings, registry=registry)
    client: TestClient[Any, Any] = await aiohttp_client(app)
    task = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1"}
    sessions = [
        (await (await client.post("/v1/tasks", json=task, headers=auth)).json())["session_id"]
        for _ in range(8)
    ]

    async def post(session_id: int, part: int) -> int:
        body = {"events": [{"type": "content_delta", "text": f"{part}."}]}
        answer = await client.post(f"/v1/tasks/{session_id}/events", json=body, headers=auth)
        return answer.status

    for part in range(3):
        statuses = await asyncio.gather(*(post(session_id, part) for session_id in sessions))
        assert statuses == [202] * len(sessions)
    service = app[SERVICES].service
    for session_id in sessions:
        task_now = await service.require(session_id)
        assert task_now.state.content == "0.1.2."
    waits = registry.get_sample_value("fp_batch_turn_waits_total")
    assert waits is not None and waits >= len(sessions) - 1  # a round: one batch a turn, the others wait

"""The topology: single mode's null objects, and cluster mode's click path (cluster/clicks.py).

Run in one process on SQLite against the sandbox: single mode as it serves, and cluster mode's
click handler around the same card actions, with the card's writer played by a fake peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from feishu_progress.cluster.clicks import ClusterClicks
from feishu_progress.config import Settings
from feishu_progress.embedded import EmbeddedService
from feishu_progress.errors import ForwardFailed, NotWritableHere, OwnedElsewhere
from feishu_progress.feishu.callback import CardActionEvent
from feishu_progress.runtime.card_actions import CardActions
from feishu_progress.runtime.task import Task
from feishu_progress.topology import AlwaysTheWriter, SingleInstance
from tests.rigs import eventually

REQUESTER = "ou_requester"
WRITER = "http://writer.invalid:8000"


@pytest.fixture
async def fp(app_settings: Settings) -> AsyncIterator[EmbeddedService]:
    async with EmbeddedService(app_settings, serve_http=False) as service:
        yield service


async def test_single_mode_is_built_with_the_null_topology(fp: EmbeddedService) -> None:
    services = fp.services
    assert isinstance(services.topology, SingleInstance)
    assert isinstance(services.service.ownership, AlwaysTheWriter)
    assert not any(app.scheduler.has_gate for app in services.apps)  # the app's own budget only
    assert services.topology.clicks(services.actions, services.service.snapshots.load) is services.actions


async def test_two_lookups_of_an_evicted_streamed_task_both_find_it(fp: EmbeddedService) -> None:
    """Single mode loads an evicted task once: two loads at once used to race for the CardKit fence, and
    the loser answered "no such task" (a click's 任务不存在, a runtime's 404)."""
    created = await fp.create_task(receive_id="oc_1", receive_id_type="chat_id", requester_open_id=REQUESTER)
    await fp.post_events(created.session_id, [{"type": "finished", "status": "COMPLETED", "content": "done"}])
    registry = fp.services.service.registry
    await eventually(lambda: registry.get(created.session_id) is None)  # final delivered: evicted
    first, second = await asyncio.gather(
        fp.services.service.task(created.session_id), fp.services.service.task(created.session_id)
    )
    assert first is not None and first is second
    assert first.state.card_id is not None, "a CardKit card: each load from the database takes a new fence"


class Writer:
    """The card's writer as a peer: answers a forwarded click, or does not answer at all."""

    def __init__(self, *, fails: bool = False) -> None:
        self.fails = fails
        self.clicks: list[tuple[str, str]] = []

    async def click(self, address: str, event: CardActionEvent) -> Mapping[str, Any]:
        self.clicks.append((address, event.event_id))
        if self.fails:
            raise ForwardFailed("no answer")
        return {"toast": {"type": "success", "content": "from the writer"}}


def _dislike(session_id: int, message_id: str, event_id: str) -> CardActionEvent:
    return CardActionEvent(
        event_id=event_id,
        token=f"tok-{event_id}",
        open_id=REQUESTER,
        message_id=message_id,
        value={"v": 1, "action": "dislike", "session_id": session_id},
    )


def _elsewhere(address: str | None) -> Any:
    async def lookup(session_id: int) -> Task | None:
        raise OwnedElsewhere(session_id, "peer-1", address)

    return lookup


def _cluster_clicks(fp: EmbeddedService, tasks: Any, writer: Writer) -> ClusterClicks:
    service = fp.services.service
    here = CardActions(
        tasks=tasks,
        action_log=service.action_log,
        snapshots=service.snapshots,
        settings=fp.services.settings,
        clock=fp.services.clock,
    )
    return ClusterClicks(here, writer, service.snapshots.load)


async def _dislikes(fp: EmbeddedService, session_id: int) -> int:
    actions, _ = await fp.actions(session_id)
    return sum(action["kind"] == "dislike" for action in actions)


async def test_a_click_for_a_card_a_peer_writes_is_answered_by_that_peer(fp: EmbeddedService) -> None:
    created = await fp.create_task(receive_id="oc_1", receive_id_type="chat_id", requester_open_id=REQUESTER)
    writer = Writer()
    clicks = _cluster_clicks(fp, _elsewhere(WRITER), writer)
    reply = await clicks.handle(_dislike(created.session_id, created.message_id, "ev-1"))
    assert writer.clicks == [(WRITER, "ev-1")]
    assert reply.rendered == {"toast": {"type": "success", "content": "from the writer"}}
    assert await _dislikes(fp, created.session_id) == 0, "the writer records it, not this instance"


@pytest.mark.parametrize(
    ("tasks", "writer"),
    [
        (_elsewhere(WRITER), Writer(fails=True)),  # the writer did not answer
        (_elsewhere(None), Writer()),  # the writer's address is unknown
    ],
    ids=["writer-silent", "writer-unknown"],
)
async def test_a_click_whose_writer_is_out_of_reach_is_recorded_here(
    fp: EmbeddedService, tasks: Any, writer: Writer
) -> None:
    created = await fp.create_task(receive_id="oc_1", receive_id_type="chat_id", requester_open_id=REQUESTER)
    reply = await _cluster_clicks(fp, tasks, writer).handle(
        _dislike(created.session_id, created.message_id, "e")
    )
    assert reply.toast_type == "success" and reply.card is None, "a toast only: this instance writes no card"
    assert await _dislikes(fp, created.session_id) == 1


async def test_a_click_while_this_lease_lapsed_is_recorded_not_forwarded(fp: EmbeddedService) -> None:
    created = await fp.create_task(receive_id="oc_1", receive_id_type="chat_id", requester_open_id=REQUESTER)

    async def lapsed(session_id: int) -> Task | None:
        raise NotWritableHere(f"task {session_id}")

    writer = Writer()
    reply = await _cluster_clicks(fp, lapsed, writer).handle(_dislike(created.session_id, "om_other", "e2"))
    assert reply.toast_type == "error", "bound to its card even when only recorded"
    assert writer.clicks == [] and await _dislikes(fp, created.session_id) == 0
    reply = await _cluster_clicks(fp, lapsed, writer).handle(
        _dislike(created.session_id, created.message_id, "e3")
    )
    assert reply.toast_type == "success" and writer.clicks == []
    assert await _dislikes(fp, created.session_id) == 1

"""Issue 17 item 3: the Python client against the real app (sandbox mode, in-process, over HTTP).

What the service received is observed on the service's side (the batches its TaskService was handed,
the sandbox's requests), never taken from the client's own account of itself. Retries and the event
buffer's timer run on an injected clock: nothing here waits on wall time but HTTP round trips.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.client import (
    Conflict,
    FeishuProgressClient,
    InvalidRequest,
    NotFound,
    RetryPolicy,
    Unauthorized,
    Unavailable,
)
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.demo import tiny_png
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.responses import AnswersAction, CancelAction, DislikeAction
from feishu_progress.runtime.service import TaskService
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox
from feishu_progress.services import Services
from tests.fakes import FakeClock

TOKEN = "client-token"
REQUESTER = "ou_requester"
TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
ASK = {"type": "ask", "ask_id": "a1", "questions": [{"question": "Which?", "options": ["A", "B"]}]}


@dataclass
class RecordingClock:
    """A clock whose sleeps return at once and are written down; ``on_sleep`` runs during each."""

    sleeps: list[float] = field(default_factory=list)
    on_sleep: Any = None

    def monotonic(self) -> float:
        return 0.0

    def wall(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep()


class Service:
    """The app under test, what its TaskService was handed, and Feishu's side (clicks, faults)."""

    def __init__(self, client: TestClient[Any, Any], services: Services) -> None:
        self.url = f"http://{client.host}:{client.port}"
        self.services = services
        self.batches: list[list[dict[str, Any]]] = []
        self.arrived = asyncio.Event()

    @property
    def service(self) -> TaskService:
        return self.services.service

    @property
    def sandbox(self) -> RunningSandbox:
        assert self.services.sandbox is not None
        return self.services.sandbox

    def record_batches(self, monkeypatch: pytest.MonkeyPatch, hold: asyncio.Event | None = None) -> None:
        """Write down each batch the service is handed; with ``hold``, answer only once it is set."""
        applied = self.service.apply_events

        async def recording(
            session_id: int, batch: ev.EventBatch, key: str | None = None, digest: str | None = None
        ) -> int:
            self.batches.append([event.model_dump(by_alias=True) for event in batch.events])
            self.arrived.set()
            if hold is not None:
                await hold.wait()
            return await applied(session_id, batch, key, digest)

        monkeypatch.setattr(self.service, "apply_events", recording)

    def content(self, session_id: int) -> str:
        task = self.service.registry.get(session_id)
        assert task is not None
        return task.state.content

    async def click(self, session_id: int, message_id: str, action: str, **extra: Any) -> None:
        feishu = self.services.settings.feishu
        assert feishu.encrypt_key is not None and feishu.verification_token is not None
        form = extra.pop("form", None)
        payload = card_action_payload(
            open_id=REQUESTER,
            message_id=message_id,
            value={"v": 1, "action": action, "session_id": session_id, **extra},
            form_value=form,
            verification_token=feishu.verification_token.get_secret_value(),
            now=time.time(),
        )
        body, headers = signed_request(
            payload, encrypt_key=feishu.encrypt_key.get_secret_value(), now=time.time()
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/feishu/callback", data=body, headers=headers) as response,
        ):
            assert response.status == 200, await response.text()
            assert (await response.json())["toast"]["type"] == "success"


@pytest.fixture
async def app(tmp_path: Path, aiohttp_client: Any) -> AsyncIterator[Service]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'fp.db'}",
        feishu=FeishuSettings(),  # no credentials: sandbox mode
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=TOKEN),
    )
    application = create_app(settings, registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(application)
    yield Service(client, application[SERVICES])


def _client(app: Service, **options: Any) -> FeishuProgressClient:
    return FeishuProgressClient(app.url, TOKEN, **options)


async def test_a_task_from_creation_to_its_actions(app: Service) -> None:
    async with _client(app) as fp:
        task = await fp.create_task(**TASK, title="client", idempotency_key="run-1")
        again = await fp.create_task(**TASK, title="client", idempotency_key="run-1")
        assert again == task and task.message_id in app.sandbox.state.messages
        events: list[Mapping[str, Any] | ev.StatusEvent] = [
            ev.StatusEvent(type="status", status="RUNNING", round=1),
            {"type": "content", "text": "hello"},
            ASK,
        ]
        assert await fp.post_events(task.session_id, events) == 3
        image = await fp.upload_image(task.session_id, tiny_png())
        assert app.sandbox.state.images[image.image_key] == tiny_png()
        view = await fp.get_task(task.session_id)
        assert (view.status, view.round, view.message_id) == ("WAITING", 1, task.message_id)
        assert app.content(task.session_id) == "hello"


async def test_actions_long_poll_and_resume_from_a_cursor(app: Service) -> None:
    async with _client(app) as fp:
        task = await fp.create_task(**TASK)
        await fp.post_events(task.session_id, [ASK])
        assert (await fp.poll_actions(task.session_id)).actions == []  # nothing clicked yet
        stream = fp.actions(task.session_id, wait=10)
        first = asyncio.ensure_future(anext(stream))  # long-polls until the click below
        await app.click(task.session_id, task.message_id, "answers", ask_id="a1", form={"q0_0": "1"})
        answered = await asyncio.wait_for(first, 10)
        assert isinstance(answered, AnswersAction)
        assert answered.payload.answers[0].selected_labels == ["B"]
        await app.click(task.session_id, task.message_id, "dislike")
        assert isinstance(await asyncio.wait_for(anext(stream), 10), DislikeAction)
        await stream.aclose()
        await app.click(task.session_id, task.message_id, "cancel")
        # A reader that stopped after the answer resumes from its cursor: it sees what came later, once.
        resumed = fp.actions(task.session_id, after=answered.cursor, wait=10)
        later = [await asyncio.wait_for(anext(resumed), 10) for _ in range(2)]
        await resumed.aclose()
        assert [type(action) for action in later] == [DislikeAction, CancelAction]


async def test_errors_are_typed_and_name_the_field(app: Service) -> None:
    async with _client(app) as fp:
        task = await fp.create_task(**TASK)
        with pytest.raises(InvalidRequest) as bad:
            await fp.post_events(task.session_id, [{"type": "tool_started", "name": "shell"}])
        assert (bad.value.status, bad.value.code, bad.value.field) == (
            422,
            "invalid_event",
            "events[0].call_id",
        )
        with pytest.raises(NotFound):
            await fp.get_task(task.session_id + 1000)
        with pytest.raises(InvalidRequest) as not_image:
            await fp.upload_image(task.session_id, b"plain text")
        assert not_image.value.code == "invalid_image"
        await fp.post_events(task.session_id, [{"type": "finished", "status": "COMPLETED"}])
        with pytest.raises(Conflict):
            await fp.post_events(task.session_id, [{"type": "content", "text": "late"}])
        with pytest.raises(Conflict):  # a finished task takes no image: refused before its body is read
            await fp.upload_image(task.session_id, b"\x89PNG\r\n\x1a\n")
    async with FeishuProgressClient(app.url, "wrong-token") as stranger:
        with pytest.raises(Unauthorized):
            await stranger.get_task(task.session_id)


async def test_a_503_is_retried_after_the_retry_after_it_names(app: Service) -> None:
    faults = app.sandbox.state.faults
    faults.fail(1.0, status=400, endpoints=("send",))  # Feishu refuses the first card: 503, retry_after 2
    clock = RecordingClock(on_sleep=faults.clear)  # ... until the client waits, as Feishu recovers
    async with _client(app, clock=clock) as fp:
        task = await fp.create_task(**TASK, idempotency_key="retried")
    assert clock.sleeps == [2.0]
    assert app.sandbox.state.requests["send"] == 2
    assert task.message_id in app.sandbox.state.messages


async def test_retries_are_bounded_and_end_in_unavailable(app: Service) -> None:
    app.sandbox.state.faults.fail(1.0, status=400, endpoints=("send",))
    clock = RecordingClock()
    async with _client(app, clock=clock, retry=RetryPolicy(attempts=3, max_delay=1.5)) as fp:
        with pytest.raises(Unavailable) as failed:
            await fp.create_task(**TASK)
    assert failed.value.retry_after == 2
    assert clock.sleeps == [1.5, 1.5]  # retry_after 2, capped by max_delay
    assert app.sandbox.state.requests["send"] == 3


async def test_an_error_not_503_is_not_retried(app: Service) -> None:
    clock = RecordingClock()
    async with _client(app, clock=clock) as fp:
        with pytest.raises(InvalidRequest):
            await fp.create_task(**{**TASK, "locale": "en"})
    assert clock.sleeps == []


async def test_the_event_stream_coalesces_deltas_and_flushes_on_its_timer(
    app: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    app.record_batches(monkeypatch)
    async with _client(app, clock=clock) as fp:
        task = await fp.create_task(**TASK)
        async with fp.event_stream(task.session_id, flush_after=0.25) as events:
            for token in ("Hel", "lo, ", "world"):
                await events.add({"type": "content_delta", "text": token})
            await events.add({"type": "tool_started", "call_id": "c1", "name": "shell"})
            await events.add({"type": "content_delta", "text": "!"})
            await clock.settle()
            assert app.batches == [] and clock.sleepers == 1  # buffered, the timer asleep
            await clock.advance(0.25)
            await events.flush()  # waits for the batch the timer sent
            assert app.batches == [
                [
                    {"type": "content_delta", "text": "Hello, world"},
                    {"type": "tool_started", "call_id": "c1", "name": "shell", "args": None},
                    {"type": "content_delta", "text": "!"},
                ]
            ]
            await events.add({"type": "content_delta", "text": " Done."})
        assert app.batches[-1] == [{"type": "content_delta", "text": " Done."}]  # the block's end flushed it
    assert app.content(task.session_id) == "Hello, world! Done."


async def test_an_event_added_while_a_batch_is_on_its_way_gets_a_timer_of_its_own(
    app: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, answer = FakeClock(), asyncio.Event()
    app.record_batches(monkeypatch, hold=answer)
    async with _client(app, clock=clock) as fp:
        task = await fp.create_task(**TASK)
        async with fp.event_stream(task.session_id, flush_after=0.25) as events:
            await events.add({"type": "round_finished", "round": 1})
            await clock.advance(0.25)
            await asyncio.wait_for(app.arrived.wait(), 10)  # the timer's batch is at the service, unanswered
            await events.add({"type": "round_finished", "round": 2})
            await clock.settle()
            assert clock.sleepers == 1  # the later event is not left waiting for a flush nobody makes
            answer.set()
            await clock.advance(0.25)
    assert app.batches == [[{"type": "round_finished", "round": 1}], [{"type": "round_finished", "round": 2}]]


async def test_the_event_stream_flushes_when_full_and_on_finished(
    app: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    app.record_batches(monkeypatch)
    async with _client(app, clock=clock) as fp:
        task = await fp.create_task(**TASK)
        events = fp.event_stream(task.session_id, max_buffered=2)
        await events.add({"type": "status", "status": "RUNNING", "round": 1})
        assert app.batches == []
        await events.add({"type": "round_finished", "round": 1})
        assert [len(batch) for batch in app.batches] == [2]  # full: sent before add returned
        await events.add({"type": "finished", "status": "COMPLETED"})
        assert [len(batch) for batch in app.batches] == [2, 1]  # the last event goes at once
        await events.close()
    assert (await _view_status(app, task.session_id)) == "COMPLETED"


async def test_a_failed_background_batch_is_raised_by_the_next_call(app: Service) -> None:
    clock = FakeClock()
    async with _client(app, clock=clock) as fp:
        task = await fp.create_task(**TASK)
        events = fp.event_stream(task.session_id)
        await events.add({"type": "tool_args", "call_id": "c1"})  # no args: the service refuses it
        await clock.advance(1)
        with pytest.raises(InvalidRequest) as refused:
            await events.flush()
        assert refused.value.field == "events[0].args"
        await events.add({"type": "content", "text": "after"})  # the stream goes on
        await events.close()
    assert app.content(task.session_id) == "after"


async def _view_status(app: Service, session_id: int) -> str:
    return (await app.service.view(session_id)).status.value

"""The service in FP_FEISHU__MODE=ws, end to end: lark-oapi's ws.Client against the sandbox's gateway.

The app runs in-process (SQLite, the sandbox over real HTTP and a real websocket); the SDK's client
runs in its own thread, exactly as in production. These tests wait on real time (a reconnect takes
the gateway's 1 s ReconnectInterval; the first SDK import ~5 s), so every wait is bounded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.background import BackgroundTasks
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.errors import ConfigError
from feishu_progress.feishu.callback import MemoryDeduper
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.feishu.ws import (
    SILENT_PING_INTERVALS,
    THREAD_NAME,
    WsCallbackBridge,
    start_long_connection,
)
from feishu_progress.i18n import Msg, translate
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.sandbox.ws_gateway import ClientConfig, Delivery
from tests.test_callback_support import RecordingHandler

pytestmark = pytest.mark.ws

APP_ID, APP_SECRET, VTOKEN, API_TOKEN = "cli_ws", "ws-secret", "ws-verification", "ws-api-token"
REQUESTER, CHAT = "ou_requester", "oc_ws"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
# Feishu's own values are 120 s / 30 s / 120 s; the sandbox's are short so a reconnect takes ~1 s.
FAST = ClientConfig(reconnect_count=-1, reconnect_interval=1, reconnect_nonce=0, ping_interval=1)
CONNECT_SECONDS = 30.0  # the first connect includes importing lark-oapi in the ws thread
FEISHU_DEADLINE_SECONDS = 3.0

Client = TestClient[Any, Any]


def _receiver_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


@pytest.fixture(autouse=True)
def no_receiver_outlives_its_test() -> Iterator[None]:
    """The SDK thread must end with the app that started it, even when the test failed."""
    yield
    leaked = _receiver_threads()
    for thread in leaked:
        thread.join(5.0)
    assert not [thread for thread in leaked if thread.is_alive()], "the long-connection thread leaked"


@pytest.fixture
async def sandbox() -> AsyncIterator[RunningSandbox]:
    config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)
    async with run_sandbox(config, ws_client_config=FAST) as running:
        yield running


def _settings(sandbox: RunningSandbox, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ws.db'}",
        feishu=FeishuSettings(
            base_url=sandbox.base_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            verification_token=VTOKEN,
            mode="ws",
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=API_TOKEN),
    )


@pytest.fixture
async def client(sandbox: RunningSandbox, tmp_path: Path, aiohttp_client: Any) -> AsyncIterator[Client]:
    test_client: Client = await aiohttp_client(
        create_app(_settings(sandbox, tmp_path), registry=CollectorRegistry())
    )
    await _until(lambda: sandbox.gateway.connection_count == 1, CONNECT_SECONDS, "the first connect")
    yield test_client


async def _until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _create_task(client: Client) -> tuple[int, str]:
    body = {"receive_id": CHAT, "receive_id_type": "chat_id", "requester_open_id": REQUESTER, "title": "ws"}
    response = await client.post("/v1/tasks", json=body, headers=AUTH)
    assert response.status == 201, await response.text()
    data = await response.json()
    return data["session_id"], data["message_id"]


async def _push_cancel(sandbox: RunningSandbox, session_id: int, message_id: str) -> Delivery:
    payload = card_action_payload(
        open_id=REQUESTER,
        message_id=message_id,
        chat_id=CHAT,
        value={"v": 1, "action": "cancel", "session_id": session_id},
        verification_token=VTOKEN,  # over the long connection: no encryption, no signature
        now=time.time(),
    )
    return await sandbox.gateway.push(payload)


async def _readyz(client: Client) -> tuple[int, dict[str, Any]]:
    admin_url = client.server.app[ADMIN_URL]
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(f"{admin_url}/readyz") as response,
    ):
        return response.status, await response.json()


async def _until_ready(client: Client, ready: bool, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        status, body = await _readyz(client)
        if (status == 200) == ready:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"/readyz still {status} {body} after {seconds} s")
        await asyncio.sleep(0.05)


async def _actions(client: Client, session_id: int) -> list[tuple[str, str]]:
    response = await client.get(f"/v1/tasks/{session_id}/actions?after=0&wait=2", headers=AUTH)
    log = await response.json()
    return [(action["kind"], action["operator_open_id"]) for action in log["actions"]]


async def test_a_click_as_an_event_frame_is_answered_by_the_card_actions_within_3_s(
    client: Client, sandbox: RunningSandbox
) -> None:
    session_id, message_id = await _create_task(client)
    delivery = await _push_cancel(sandbox, session_id, message_id)
    answer = await delivery.wait(FEISHU_DEADLINE_SECONDS)
    assert answer.seconds < FEISHU_DEADLINE_SECONDS
    assert answer.code == 200 and answer.body is not None
    assert answer.body["toast"]["type"] == "success"
    assert answer.body["toast"]["content"] == translate(Msg("card.toast.cancelling"), "zh_cn")
    assert "card" not in answer.body  # a CardKit card: the click's change is written to the entity
    assert await _actions(client, session_id) == [("cancel", REQUESTER)]
    registry = client.server.app[SERVICES].metrics.registry
    assert registry.get_sample_value("fp_callback_latency_seconds_count") == 1


async def test_no_webhook_route_is_open_in_ws_mode(client: Client) -> None:
    payload = card_action_payload(
        open_id=REQUESTER, message_id="om_x", value={}, verification_token=VTOKEN, now=time.time()
    )
    body, headers = signed_request(payload, encrypt_key=None, now=time.time())
    response = await client.post("/feishu/callback", data=body, headers=headers)
    assert response.status == 404


async def test_readyz_follows_the_connection_and_a_click_during_an_outage_is_not_lost(
    client: Client, sandbox: RunningSandbox
) -> None:
    ready = await _until_ready(client, ready=True, seconds=5)
    assert "long_connection" in ready["checks"]
    session_id, message_id = await _create_task(client)

    sandbox.gateway.available = False  # discovery answers 503: the client keeps retrying
    assert await sandbox.gateway.drop_all() == 1
    down = await _until_ready(client, ready=False, seconds=5)
    assert "down" in down["reasons"]["long_connection"]
    delivery = await _push_cancel(sandbox, session_id, message_id)
    assert sandbox.gateway.queued == 1  # nobody connected: the gateway holds the click

    sandbox.gateway.available = True
    answer = await delivery.wait(10)  # one ReconnectInterval, then the queued frame
    assert answer.body is not None and answer.body["toast"]["type"] == "success"
    assert answer.seconds < FEISHU_DEADLINE_SECONDS
    assert (sandbox.gateway.connects, sandbox.gateway.connection_count) == (2, 1)
    await _until_ready(client, ready=True, seconds=5)
    assert await _actions(client, session_id) == [("cancel", REQUESTER)]


async def test_a_gateway_that_stops_answering_pings_makes_readyz_fail(
    client: Client, sandbox: RunningSandbox
) -> None:
    await _until_ready(client, ready=True, seconds=5)
    sandbox.gateway.answer_pings = False  # connected, but silent: a dead connection (lark-oapi #144)
    silent = SILENT_PING_INTERVALS * FAST.ping_interval
    stale = await _until_ready(client, ready=False, seconds=silent + 5)
    assert "no frame from the gateway" in stale["reasons"]["long_connection"]
    sandbox.gateway.answer_pings = True
    await _until_ready(client, ready=True, seconds=5)


async def test_stopping_the_app_stops_the_receiver_thread_and_closes_its_connection(
    sandbox: RunningSandbox, tmp_path: Path
) -> None:
    app = create_app(_settings(sandbox, tmp_path), registry=CollectorRegistry())
    async with TestClient(TestServer(app)):
        await _until(lambda: sandbox.gateway.connection_count == 1, CONNECT_SECONDS, "the first connect")
        assert len(_receiver_threads()) == 1
        started = time.monotonic()
    assert time.monotonic() - started < 5  # the whole app shutdown, receiver first
    assert _receiver_threads() == []
    await _until(lambda: sandbox.gateway.connection_count == 0, 5, "the gateway to see the close")


async def test_without_credentials_ws_mode_connects_to_the_in_process_sandboxs_gateway(
    tmp_path: Path,
) -> None:
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'sandboxed.db'}",
        feishu=FeishuSettings(mode="ws"),  # no app id/secret: sandbox mode, as `demo` runs
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
    )
    app = create_app(settings, registry=CollectorRegistry())
    async with TestClient(TestServer(app)) as client:
        sandbox = app[SERVICES].sandbox
        assert sandbox is not None
        await _until(lambda: sandbox.gateway.connection_count == 1, CONNECT_SECONDS, "the first connect")
        response = await client.post(
            "/v1/tasks",
            json={"receive_id": CHAT, "receive_id_type": "chat_id", "requester_open_id": REQUESTER},
        )
        assert response.status == 201, await response.text()
        created = await response.json()
        delivery = await _push_cancel(sandbox, created["session_id"], created["message_id"])
        answer = await delivery.wait(FEISHU_DEADLINE_SECONDS)
        assert answer.body is not None and answer.body["toast"]["type"] == "success"


async def test_stop_ends_a_client_still_waiting_to_reconnect_and_one_runs_per_process(
    sandbox: RunningSandbox,
) -> None:
    sandbox.gateway.available = False  # Feishu down at startup: the first connect fails
    pipeline = CallbackPipeline(RecordingHandler(), MemoryDeduper(60), ("zh_cn",), BackgroundTasks())
    bridge = WsCallbackBridge(pipeline, asyncio.get_running_loop())
    connection = start_long_connection(APP_ID, APP_SECRET, sandbox.base_url, bridge)
    try:
        await _until(lambda: sandbox.gateway.discoveries >= 1, CONNECT_SECONDS, "a discovery attempt")
        # lark-oapi now sleeps up to its ReconnectNonce (30 s) before retrying.
        assert connection.problem() == "long connection not established yet"
        with pytest.raises(ConfigError, match="already running"):
            start_long_connection(APP_ID, APP_SECRET, sandbox.base_url, bridge)
    finally:
        started = time.monotonic()
        stopped = await asyncio.to_thread(connection.stop, 5.0)
    assert stopped and time.monotonic() - started < 2
    assert connection.problem() == "long-connection receiver thread is not running"
    assert sandbox.gateway.connects == 0


async def test_a_refused_app_secret_ends_the_receiver_and_says_so(sandbox: RunningSandbox) -> None:
    pipeline = CallbackPipeline(RecordingHandler(), MemoryDeduper(60), ("zh_cn",), BackgroundTasks())
    bridge = WsCallbackBridge(pipeline, asyncio.get_running_loop())
    connection = start_long_connection(APP_ID, "wrong-secret", sandbox.base_url, bridge)
    try:
        await _until(lambda: not connection.alive, CONNECT_SECONDS, "lark-oapi to give up on code 10014")
    finally:
        assert await asyncio.to_thread(connection.stop, 5.0)
    assert connection.problem() == "long-connection receiver thread is not running"
    assert (sandbox.gateway.discoveries, sandbox.gateway.connects) == (1, 0)

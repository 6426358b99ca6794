"""The service in ws mode, end to end: our long-connection client against the sandbox's gateway.

The app runs in-process (SQLite, the sandbox over real HTTP and a real websocket), exactly as in
production. These tests wait on real time (a reconnect takes the gateway's 1 s ReconnectInterval), so
every wait is bounded. The last ones run two apps, each on its own sandbox, each in ws mode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.feishu.ws import SILENT_PING_INTERVALS
from feishu_progress.feishu.ws_protocol import ClientConfig
from feishu_progress.i18n import Msg, translate
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.sandbox.ws_gateway import Delivery
from tests.rigs import API_TOKEN, APP_ID, APP_SECRET, AUTH, VERIFICATION_TOKEN, Client, eventually, readyz
from tests.test_multi_app import APPS, set_app_env, settings_for

pytestmark = pytest.mark.ws

REQUESTER, CHAT = "ou_requester", "oc_ws"
# Feishu's own values are 120 s / 30 s / 120 s; the sandbox's are short so a reconnect takes ~1 s.
FAST = ClientConfig(reconnect_count=-1, reconnect_interval=1, reconnect_nonce=0, ping_interval=1)
CONNECT_SECONDS = 10.0
FEISHU_DEADLINE_SECONDS = 3.0


def _receivers() -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name().startswith("long-connection-")]


@pytest.fixture(autouse=True)
async def no_receiver_outlives_its_test() -> AsyncIterator[None]:
    """A long connection must end with the app that started it, even when the test failed."""
    yield
    leaked = _receivers()
    for task in leaked:
        task.cancel()
    assert not leaked, "a long-connection task leaked"


@pytest.fixture
def sandbox_ws_config() -> ClientConfig:
    return FAST


def _settings(sandbox: RunningSandbox, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ws.db'}",
        feishu=FeishuSettings(
            base_url=sandbox.base_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            verification_token=VERIFICATION_TOKEN,
            mode="ws",
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=API_TOKEN),
    )


@pytest.fixture
def app_settings(sandbox: RunningSandbox, tmp_path: Path) -> Settings:
    return _settings(sandbox, tmp_path)


@pytest.fixture
async def connected(client: Client, sandbox: RunningSandbox) -> None:
    """The ``client`` app's long connection is up."""
    await eventually(lambda: sandbox.gateway.connection_count == 1, CONNECT_SECONDS, "the first connect")


async def _create_task(client: Client, app: str | None = None) -> tuple[int, str]:
    body = {"receive_id": CHAT, "receive_id_type": "chat_id", "requester_open_id": REQUESTER, "title": "ws"}
    if app is not None:
        body["app"] = app
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
        verification_token=VERIFICATION_TOKEN,  # over the long connection: no encryption, no signature
        now=time.time(),
    )
    return await sandbox.gateway.push(payload)


async def _until_ready(client: Client, ready: bool, seconds: float) -> dict[str, Any]:
    """/readyz's body once it says ``ready`` (200) or not (503)."""
    _, body = await eventually(
        lambda: readyz(client),
        seconds,
        f"/readyz to be {'200' if ready else 'not 200'}",
        until=lambda answer: (answer[0] == 200) == ready,
    )
    return body


async def _actions(client: Client, session_id: int) -> list[tuple[str, str]]:
    response = await client.get(f"/v1/tasks/{session_id}/actions?after=0&wait=2", headers=AUTH)
    log = await response.json()
    return [(action["kind"], action["operator_open_id"]) for action in log["actions"]]


@pytest.mark.usefixtures("connected")
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


@pytest.mark.usefixtures("connected")
async def test_no_webhook_route_is_open_in_ws_mode(client: Client) -> None:
    payload = card_action_payload(
        open_id=REQUESTER, message_id="om_x", value={}, verification_token=VERIFICATION_TOKEN, now=time.time()
    )
    body, headers = signed_request(payload, encrypt_key=None, now=time.time())
    response = await client.post("/feishu/callback", data=body, headers=headers)
    assert response.status == 404


@pytest.mark.usefixtures("connected")
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


@pytest.mark.usefixtures("connected")
async def test_a_gateway_that_stops_answering_pings_is_left_and_readyz_says_so(
    client: Client, sandbox: RunningSandbox
) -> None:
    await _until_ready(client, ready=True, seconds=5)
    sandbox.gateway.answer_pings = False  # connected, but silent: a dead connection
    sandbox.gateway.available = False  # and no new one to be had yet
    silent = SILENT_PING_INTERVALS * FAST.ping_interval
    stale = await _until_ready(client, ready=False, seconds=silent + 5)
    assert "down" in stale["reasons"]["long_connection"]
    assert sandbox.gateway.connection_count == 0  # the client closed the silent connection itself
    sandbox.gateway.answer_pings = sandbox.gateway.available = True
    await _until_ready(client, ready=True, seconds=5)
    assert sandbox.gateway.connects == 2


async def test_stopping_the_app_stops_the_receiver_and_closes_its_connection(
    sandbox: RunningSandbox, tmp_path: Path
) -> None:
    app = create_app(_settings(sandbox, tmp_path), registry=CollectorRegistry())
    async with TestClient(TestServer(app)):
        await eventually(lambda: sandbox.gateway.connection_count == 1, CONNECT_SECONDS, "the first connect")
        assert len(_receivers()) == 1
        started = time.monotonic()
    assert time.monotonic() - started < 5  # the whole app shutdown, receiver first
    assert _receivers() == []
    await eventually(lambda: sandbox.gateway.connection_count == 0, 5, "the gateway to see the close")


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
        await eventually(lambda: sandbox.gateway.connection_count == 1, CONNECT_SECONDS, "the first connect")
        response = await client.post(
            "/v1/tasks",
            json={"receive_id": CHAT, "receive_id_type": "chat_id", "requester_open_id": REQUESTER},
        )
        assert response.status == 201, await response.text()
        created = await response.json()
        delivery = await _push_cancel(sandbox, created["session_id"], created["message_id"])
        answer = await delivery.wait(FEISHU_DEADLINE_SECONDS)
        assert answer.body is not None and answer.body["toast"]["type"] == "success"


# -- two apps, each on its own sandbox (its own gateway), each in ws mode --------------------------------


@pytest.fixture
async def two_sandboxes() -> AsyncIterator[dict[str, RunningSandbox]]:
    research, sales = APPS["research"], APPS["sales"]
    async with (
        run_sandbox(
            SandboxConfig(app_id=research[0], app_secret=research[1], id_prefix="research"),
            ws_client_config=FAST,
        ) as first,
        run_sandbox(
            SandboxConfig(app_id=sales[0], app_secret=sales[1], id_prefix="sales"), ws_client_config=FAST
        ) as second,
    ):
        yield {"research": first, "sales": second}


@pytest.fixture
async def two_apps(
    monkeypatch: pytest.MonkeyPatch,
    two_sandboxes: dict[str, RunningSandbox],
    tmp_path: Path,
    aiohttp_client: Any,
) -> Client:
    set_app_env(monkeypatch)
    settings = settings_for(tmp_path, two_sandboxes).model_copy(update={"api": ApiSettings(token=API_TOKEN)})
    assert settings.apps_file is not None
    apps_file = Path(settings.apps_file)
    apps_file.write_text(apps_file.read_text().replace('mode = "webhook"', 'mode = "ws"'))
    test_client: Client = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    gateways = [sandbox.gateway for sandbox in two_sandboxes.values()]
    await eventually(
        lambda: all(g.connection_count == 1 for g in gateways), CONNECT_SECONDS, "both connections"
    )
    return test_client


async def _toast(delivery: Delivery) -> str:
    answer = await delivery.wait(FEISHU_DEADLINE_SECONDS)
    assert answer.code == 200 and answer.body is not None
    return str(answer.body["toast"]["type"])


async def test_two_apps_in_ws_mode_take_each_click_on_its_own_connection(
    two_apps: Client, two_sandboxes: dict[str, RunningSandbox]
) -> None:
    tasks = {name: await _create_task(two_apps, name) for name in APPS}
    # Research's card clicked over sales' connection: tagged sales, so not sales' card to act on.
    assert await _toast(await _push_cancel(two_sandboxes["sales"], *tasks["research"])) == "error"
    for name, sandbox in two_sandboxes.items():
        assert await _toast(await _push_cancel(sandbox, *tasks[name])) == "success"
        assert await _actions(two_apps, tasks[name][0]) == [("cancel", REQUESTER)]
    ready = await _until_ready(two_apps, ready=True, seconds=5)
    assert {name: entry["connection"] for name, entry in ready["apps"].items()} == {
        "research": "ok",
        "sales": "ok",
    }


async def test_one_apps_gateway_dropped_and_back_reconnects_only_that_app(
    two_apps: Client, two_sandboxes: dict[str, RunningSandbox]
) -> None:
    research, sales = two_sandboxes["research"].gateway, two_sandboxes["sales"].gateway
    research.available = False
    assert await research.drop_all() == 1
    down = await _until_ready(two_apps, ready=False, seconds=5)
    reason = down["reasons"]["long_connection"]
    assert "app research: long connection down" in reason and "app sales" not in reason
    assert "down" in down["apps"]["research"]["connection"] and down["apps"]["sales"]["connection"] == "ok"
    # Sales keeps its first connection, and its clicks are answered while research is away.
    sales_task = await _create_task(two_apps, "sales")
    assert await _toast(await _push_cancel(two_sandboxes["sales"], *sales_task)) == "success"
    research_task = await _create_task(two_apps, "research")
    pushed = await _push_cancel(two_sandboxes["research"], *research_task)
    research.available = True
    assert await _toast(pushed) == "success"  # after research's next retry (1 s): not lost
    await _until_ready(two_apps, ready=True, seconds=5)
    assert (research.connects, sales.connects) == (2, 1)
    assert await _actions(two_apps, research_task[0]) == [("cancel", REQUESTER)]

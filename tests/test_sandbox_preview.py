"""The sandbox preview page's server side: change notifications, the live feed, access rules, clicks.

The service runs in sandbox mode in-process (SQLite, its own sandbox over real HTTP); clicks go through
the page's endpoint to the service's real callback route, signed and encrypted. The browser test is in
test_sandbox_preview_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.demo import tiny_png
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.sandbox import RunningSandbox, SandboxConfig, SandboxMessage, preview
from feishu_progress.sandbox.preview import MessageFeed, image_keys
from feishu_progress.sandbox.state import CARD_INVALID, MESSAGE_RATE_LIMITED
from tests.fakes import FakeClock
from tests.rigs import eventually

KEY, VTOKEN, API_TOKEN = "preview-encrypt-key", "preview-verification-token", "preview-api-token"
REQUESTER, BYSTANDER = "ou_alice", "ou_bob"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
REPO = Path(__file__).resolve().parent.parent


def card(text: str = "hello") -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "body": {"elements": [{"tag": "markdown", "content": text}]},
    }


def sandbox_settings(tmp_path: Path, *, api_token: str | None = API_TOKEN) -> Settings:
    """Sandbox mode (no app id/secret), with callback keys so clicks must be signed and encrypted."""
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'preview.db'}",
        feishu=FeishuSettings(encrypt_key=KEY, verification_token=VTOKEN),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=api_token),
    )


@pytest.fixture
def app_settings(tmp_path: Path) -> Settings:
    return sandbox_settings(tmp_path)  # no sandbox of the test's: the service runs its own


def running_sandbox(client: TestClient[Any, Any]) -> RunningSandbox:
    sandbox = client.app[SERVICES].sandbox
    assert sandbox is not None
    return sandbox


async def create_task(client: TestClient[Any, Any]) -> tuple[int, str]:
    body = {
        "receive_id": "oc_chat",
        "receive_id_type": "chat_id",
        "requester_open_id": REQUESTER,
        "title": "t",
    }
    response = await client.post("/v1/tasks", json=body, headers=AUTH)
    assert response.status == 201, await response.text()
    data = await response.json()
    return data["session_id"], data["message_id"]


async def actions(client: TestClient[Any, Any], session_id: int) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/tasks/{session_id}/actions", headers=AUTH)
    data = await response.json()
    found: list[dict[str, Any]] = data["actions"]
    return found


async def wait_for_actions(client: TestClient[Any, Any], session_id: int, count: int) -> list[dict[str, Any]]:
    """The action log once it holds ``count`` entries (it is written in the background)."""
    found: list[dict[str, Any]] = await eventually(
        lambda: actions(client, session_id), until=lambda found: len(found) >= count, timeout=5, interval=0
    )
    return found


# --- the sandbox's change notifications --------------------------------------------------------------


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    return SandboxConfig()  # any app: the client below logs in with no id or secret


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # time stands still: a burst of PATCHes falls in one rate window


@pytest.fixture
def feishu_clock(clock: FakeClock) -> FakeClock:
    return clock


async def test_listeners_hear_every_accepted_and_refused_change(
    sandbox: RunningSandbox, feishu: FeishuClient
) -> None:
    heard: list[tuple[str, int, int | None]] = []

    def listener(message: SandboxMessage) -> None:
        heard.append((message.message_id, len(message.history), message.last_error_code))

    sandbox.state.listeners.append(listener)
    message_id = await feishu.send_card("oc_chat", "chat_id", card("v0"), "")
    reply_id = await feishu.reply_card(message_id, card("reply"), "")
    await feishu.patch_card(message_id, card("v1"))
    with pytest.raises(Exception, match="230099"):
        await feishu.patch_card(message_id, {"schema": "2.0", "body": {"elements": [{"tag": "nope"}]}})
    for i in range(3):  # the refused PATCH counted too: 5 in this second after these
        await feishu.patch_card(message_id, card(f"burst {i}"))
    with pytest.raises(Exception, match="230020"):
        await feishu.patch_card(message_id, card("one too many"))
    assert heard == [
        (message_id, 1, None),
        (reply_id, 1, None),
        (message_id, 2, None),
        (message_id, 2, CARD_INVALID),
        *[(message_id, 3 + i, CARD_INVALID) for i in range(3)],  # a success keeps the last error shown
        (message_id, 5, MESSAGE_RATE_LIMITED),
    ]


async def test_a_refusal_before_the_rules_is_recorded_too(
    sandbox: RunningSandbox, feishu: FeishuClient
) -> None:
    message_id = await feishu.send_card("oc_chat", "chat_id", card(), "")
    heard: list[int | None] = []
    sandbox.state.listeners.append(lambda message: heard.append(message.last_error_code))
    sandbox.state.faults.fail(1.0, status=503)
    async with aiohttp.ClientSession() as http:
        url = f"{sandbox.base_url}/open-apis/im/v1/messages/{message_id}"
        async with http.patch(url, json={"content": json.dumps(card("x"))}) as response:
            assert response.status == 503
    sandbox.state.faults.clear()
    sandbox.state.recall(message_id)
    assert heard == [503, 503]
    assert sandbox.state.messages[message_id].recalled


async def test_a_failing_listener_is_logged_and_breaks_nothing(
    sandbox: RunningSandbox, feishu: FeishuClient, caplog: pytest.LogCaptureFixture
) -> None:
    after: list[str] = []

    def broken(message: SandboxMessage) -> None:
        raise RuntimeError("listener bug")

    sandbox.state.listeners.extend([broken, lambda message: after.append(message.message_id)])
    with caplog.at_level(logging.ERROR, logger="feishu_progress.sandbox.state"):
        message_id = await feishu.send_card("oc_chat", "chat_id", card(), "")
    assert after == [message_id]  # the next listener still heard it
    assert sandbox.state.messages[message_id].card == card()
    assert "listener" in caplog.text and "listener bug" in caplog.text


# --- the live feed -----------------------------------------------------------------------------------


def _message(message_id: str) -> SandboxMessage:
    return SandboxMessage(message_id, "oc_chat", 0.0, [(0.0, card())])


async def test_feed_coalesces_a_burst_into_one_entry_per_message() -> None:
    feed = MessageFeed(limit=10)
    for message_id in ["om_1", "om_2", "om_1", "om_1", "om_3", "om_2"]:
        feed.push(_message(message_id))
    assert await feed.next_batch(timeout=1.0) == ["om_1", "om_2", "om_3"]
    assert await feed.next_batch(timeout=0.0) == []  # nothing new: the heartbeat path


async def test_feed_drops_a_client_that_falls_too_far_behind() -> None:
    feed = MessageFeed(limit=3)
    for i in range(4):
        feed.push(_message(f"om_{i}"))
    assert feed.overflowed and feed.closed
    feed.push(_message("om_late"))  # after the drop, pushing is a no-op and never raises
    assert "om_late" not in await feed.next_batch(timeout=1.0)


async def test_feed_accepts_pushes_from_another_thread() -> None:
    feed = MessageFeed(limit=10)
    await asyncio.to_thread(feed.push, _message("om_threaded"))
    assert await feed.next_batch(timeout=5.0) == ["om_threaded"]


def test_image_keys_finds_every_image_once() -> None:
    found = image_keys(
        {
            "body": {
                "elements": [
                    {"tag": "img", "img_key": "img_a"},
                    {"tag": "collapsible_panel", "elements": [{"tag": "img", "img_key": "img_b"}]},
                    {"tag": "img_combination", "img_list": [{"img_key": "img_a"}, {"img_key": "img_c"}]},
                ]
            }
        }
    )
    assert found == ["img_a", "img_b", "img_c"]


# --- the page and its access rules --------------------------------------------------------------------


async def test_page_is_served_with_a_strict_policy_and_no_inline_script(client: TestClient[Any, Any]) -> None:
    response = await client.get("/sandbox/", headers=AUTH)
    assert response.status == 200
    html = await response.text()
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "unsafe-inline" not in policy
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert '<script src="/sandbox/static/preview.js" defer></script>' in html
    assert html.count("<script") == 1  # the only script is the file: nothing inline
    assert not re.search(r"\son[a-z]+\s*=", html)  # no inline event handlers either
    for name, kind in [("preview.js", "text/javascript"), ("preview.css", "text/css")]:
        static = await client.get(f"/sandbox/static/{name}", headers=AUTH)
        assert static.status == 200 and static.content_type == kind
    assert (await client.get("/sandbox/static/../app.py", headers=AUTH)).status == 404
    assert (await client.get("/sandbox/static/index.html", headers=AUTH)).status == 404


async def test_the_renderer_never_parses_card_text_as_html() -> None:
    source = (REPO / "feishu_progress" / "sandbox" / "static" / "preview.js").read_text()
    for forbidden in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
    ):
        assert forbidden not in source, forbidden


async def test_with_a_token_the_page_and_its_endpoints_require_it(client: TestClient[Any, Any]) -> None:
    for path in ("/sandbox/", "/sandbox/api/messages", "/sandbox/api/events", "/sandbox/static/preview.js"):
        assert (await client.get(path)).status == 401, path
    assert (
        await client.get("/sandbox/api/messages", headers={"Authorization": "Bearer wrong"})
    ).status == 401
    assert (await client.get("/sandbox/?token=wrong", allow_redirects=False)).status == 401
    assert (await client.get("/sandbox/api/messages", headers=AUTH)).status == 200

    visit = await client.get(f"/sandbox/?token={API_TOKEN}", allow_redirects=False)
    assert visit.status == 303 and visit.headers["Location"] == "/sandbox/"
    cookie = visit.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/sandbox" in cookie
    # The client's cookie jar now holds it: the page and its endpoints answer without a header.
    assert (await client.get("/sandbox/")).status == 200
    assert (await client.get("/sandbox/api/messages")).status == 200


async def test_without_a_token_the_page_is_open(tmp_path: Path, aiohttp_client: Any) -> None:
    app = create_app(sandbox_settings(tmp_path, api_token=None), registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(app)
    assert (await client.get("/sandbox/")).status == 200
    assert (await client.get("/sandbox", allow_redirects=False)).headers["Location"] == "/sandbox/"


async def test_the_bare_address_leads_to_the_page_keeping_the_token(client: TestClient[Any, Any]) -> None:
    bare = await client.get("/", allow_redirects=False)
    assert bare.status == 302 and bare.headers["Location"] == "/sandbox/"  # temporary: see routes()
    with_token = await client.get(f"/?token={API_TOKEN}", allow_redirects=False)
    assert with_token.headers["Location"] == f"/sandbox/?token={API_TOKEN}"
    assert (await client.get(f"/?token={API_TOKEN}")).status == 200  # on to the page, which sets the cookie


def test_the_printed_page_url_names_a_reachable_host_and_never_the_token() -> None:
    assert preview.page_url("0.0.0.0", 8000, token_set=False) == "http://127.0.0.1:8000/sandbox/"
    assert preview.page_url("::1", 9, token_set=True) == "http://[::1]:9/sandbox/?token=<FP_API__TOKEN>"
    assert preview.page_url("10.0.0.5", 80, token_set=False) == "http://10.0.0.5:80/sandbox/"


def test_no_page_when_talking_to_feishu(tmp_path: Path) -> None:
    settings = sandbox_settings(tmp_path).model_copy(
        update={
            "feishu": FeishuSettings(
                app_id="cli_real", app_secret="real-secret", encrypt_key=KEY, verification_token=VTOKEN
            )
        }
    )
    paths = {
        resource.canonical
        for resource in create_app(settings, registry=CollectorRegistry()).router.resources()
    }
    assert not any(path.startswith("/sandbox") for path in paths)
    assert "/" not in paths  # the bare address leads nowhere in front of real Feishu (404)
    assert "/feishu/callback" in paths


# --- what the page reads -------------------------------------------------------------------------------


async def test_snapshot_lists_messages_with_their_requester_and_updates(client: TestClient[Any, Any]) -> None:
    _, message_id = await create_task(client)
    state = running_sandbox(client).state
    state.images["img_stored"] = tiny_png()
    response = await client.get("/sandbox/api/messages", headers=AUTH)
    snapshot = await response.json()
    [message] = snapshot["messages"]
    assert message["message_id"] == message_id
    assert message["requester"] == REQUESTER
    assert message["chat_id"] == "oc_chat"
    assert message["updates"] == len(state.messages[message_id].history) - 1
    assert message["card"] == state.messages[message_id].card
    assert REQUESTER in snapshot["operators"]
    assert snapshot["signed"] is True and snapshot["hidden"] == 0


async def test_images_are_served_from_the_sandbox(client: TestClient[Any, Any]) -> None:
    await create_task(client)  # the sandbox exists once the app has started
    running_sandbox(client).state.images["img_stored"] = tiny_png()
    response = await client.get("/sandbox/images/img_stored", headers=AUTH)
    assert response.status == 200 and response.content_type == "image/png"
    assert await response.read() == tiny_png()
    assert (await client.get("/sandbox/images/img_unknown", headers=AUTH)).status == 404


async def _next_event(stream: aiohttp.StreamReader) -> tuple[str, Any]:
    """The next named event of a Server-Sent Events stream (comments and retry lines skipped)."""
    name, data = "", ""
    while True:
        line = (await stream.readline()).decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and name:
            return name, json.loads(data)


async def test_events_stream_a_snapshot_then_each_change(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preview, "DISCONNECT_CHECK_SECONDS", 0.01)
    session_id, message_id = await create_task(client)
    state = running_sandbox(client).state
    async with client.get("/sandbox/api/events", headers=AUTH) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        async with asyncio.timeout(5):
            name, snapshot = await _next_event(response.content)
            assert name == "snapshot" and snapshot["messages"][0]["message_id"] == message_id
            before = len(state.messages[message_id].history)
            reply = await client.post(
                f"/v1/tasks/{session_id}/events",
                json={"events": [{"type": "content", "text": "streamed-marker"}]},
                headers=AUTH,
            )
            assert reply.status == 202
            while True:
                name, update = await _next_event(response.content)
                assert name == "update" and update["message_id"] == message_id
                if "streamed-marker" in json.dumps(update["card"], ensure_ascii=False):
                    break
    assert update["updates"] >= before
    # The page left: its stream notices and unsubscribes.
    await eventually(lambda: not state.listeners, timeout=5, interval=0)


# --- clicks --------------------------------------------------------------------------------------------


async def test_click_reaches_the_service_as_a_signed_callback(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await create_task(client)
    value = {"v": 1, "action": "cancel", "session_id": session_id}
    response = await client.post(
        "/sandbox/api/click", json={"message_id": message_id, "value": value}, headers=AUTH
    )
    assert response.status == 200, await response.text()
    data = await response.json()
    assert data["status"] == 200 and data["operator"] == REQUESTER
    assert data["answer"]["toast"]["type"] == "success"
    assert data["answer"]["toast"]["content"] == "正在取消任务"
    assert "card" not in data["answer"]  # a CardKit card: the change is written to the entity instead
    [action] = await wait_for_actions(client, session_id, 1)
    assert action["kind"] == "cancel" and action["operator_open_id"] == REQUESTER


async def test_click_as_someone_else_is_refused_by_the_service(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await create_task(client)
    body = {"message_id": message_id, "value": {"v": 1, "action": "cancel", "session_id": session_id}}
    response = await client.post("/sandbox/api/click", json={**body, "operator": BYSTANDER}, headers=AUTH)
    data = await response.json()
    assert data["operator"] == BYSTANDER
    assert data["answer"]["toast"]["type"] == "error"
    assert await actions(client, session_id) == []


async def test_click_is_refused_unless_json_from_the_page_itself(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await create_task(client)
    body = {"message_id": message_id, "value": {"v": 1, "action": "cancel", "session_id": session_id}}
    as_form = await client.post("/sandbox/api/click", data={"message_id": message_id}, headers=AUTH)
    assert as_form.status == 415
    foreign = await client.post(
        "/sandbox/api/click", json=body, headers={**AUTH, "Origin": "https://evil.example"}
    )
    assert foreign.status == 403
    own_origin = f"http://{client.host}:{client.port}"
    unknown = await client.post(
        "/sandbox/api/click", json={**body, "message_id": "om_nope"}, headers={**AUTH, "Origin": own_origin}
    )
    assert unknown.status == 404
    bad = await client.post("/sandbox/api/click", json={**body, "operator": "<script>"}, headers=AUTH)
    assert bad.status == 422
    assert (await client.post("/sandbox/api/click", json=body)).status == 401
    assert await actions(client, session_id) == []


async def test_form_submit_records_the_answers(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await create_task(client)
    ask = {
        "type": "ask",
        "ask_id": "ask-1",
        "questions": [
            {"question": "Which?", "options": ["a", "b"]},
            {"question": "Also?", "options": ["x", "y", "z"], "multiSelect": True},
        ],
    }
    assert (
        await client.post(f"/v1/tasks/{session_id}/events", json={"events": [ask]}, headers=AUTH)
    ).status == 202
    value = {"v": 1, "action": "answers", "session_id": session_id, "ask_id": "ask-1"}
    body = {
        "message_id": message_id,
        "value": value,
        "form_value": {"q0_0": "1", "q0_1": ["0", "2"], "q0_1_other": "more"},
        "button_name": "submit_0",
    }
    data = await (await client.post("/sandbox/api/click", json=body, headers=AUTH)).json()
    assert data["answer"]["toast"]["type"] == "success", data
    [action] = await wait_for_actions(client, session_id, 1)
    answers = action["payload"]["answers"]
    assert [a["selected_labels"] for a in answers] == [["b"], ["x", "z"]]
    assert answers[1]["custom_input"] == "more"


# --- demo --serve ------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_demo_serve_keeps_the_page_up_until_interrupted() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "demo", "--serve",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        async with asyncio.timeout(120):
            first = (await process.stdout.readline()).decode()
            assert "sandbox preview" in first, first  # before the demo plays, not after it
            url = first[first.index("http://") :].strip()
            await _line_with(process.stdout, "Ctrl-C stops them")  # the demo has played
            # unsafe: the cookie jar takes cookies from an IP address host (127.0.0.1), as browsers do
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                async with http.get(url) as page:  # follows the redirect that sets the cookie
                    assert page.status == 200 and "sandbox preview" in (await page.text()).lower()
                async with http.get(url.split("?")[0] + "api/messages") as response:
                    snapshot = await response.json()
            assert len(snapshot["messages"]) == 1
            assert (
                snapshot["messages"][0]["card"]["header"]["template"] == "grey"
            )  # the final, cancelled card
            process.send_signal(signal.SIGINT)
            rest = (await process.stdout.read()).decode()
            assert await process.wait() == 0, rest
        assert "stopping" in rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _line_with(stdout: asyncio.StreamReader, text: str) -> str:
    while line := (await stdout.readline()).decode():
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r}")


@pytest.mark.slow
async def test_serve_in_sandbox_mode_prints_the_page_first_once_listening(tmp_path: Path) -> None:
    from tests.service_process import free_port

    port, admin_port = free_port(), free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
    env.update(
        PYTHONPATH=str(REPO),
        FP_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'serve.db'}",
        FP_HTTP__PORT=str(port),
        FP_ADMIN__PORT=str(admin_port),
        FP_API__TOKEN=API_TOKEN,
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        async with asyncio.timeout(60):
            first = (await process.stdout.readline()).decode().strip()
        url = f"http://127.0.0.1:{port}/sandbox/?token=<FP_API__TOKEN>"
        assert first == f"sandbox preview (live cards, clickable): {url}"  # the hint, never the token
        async with (
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
            http.get(f"http://127.0.0.1:{port}/?token={API_TOKEN}") as page,
        ):
            assert page.status == 200 and "sandbox preview" in (await page.text()).lower()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_demo_without_serve_is_unchanged() -> None:
    from feishu_progress.cli import build_parser

    assert build_parser().parse_args(["demo"]).serve is False
    assert build_parser().parse_args(["demo", "--serve"]).serve is True


async def test_served_sandbox_stops_its_streams_on_shutdown(tmp_path: Path) -> None:
    app = create_app(sandbox_settings(tmp_path, api_token=None), registry=CollectorRegistry())
    runner = web.AppRunner(app, shutdown_timeout=30.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    cleaned = False
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{host}:{port}/sandbox/api/events") as stream,
        ):
            await _next_event(stream.content)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await runner.cleanup()  # would wait shutdown_timeout (30 s) for an endless stream
            cleaned = True
            assert loop.time() - started < 10
    finally:
        if not cleaned:
            await runner.cleanup()


async def test_click_is_signed_with_the_keys_sandbox_mode_made_up(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = sandbox_settings(tmp_path).model_copy(update={"feishu": FeishuSettings()})  # no keys given
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    session_id, message_id = await create_task(client)
    value = {"v": 1, "action": "cancel", "session_id": session_id}
    data = await (
        await client.post("/sandbox/api/click", json={"message_id": message_id, "value": value}, headers=AUTH)
    ).json()
    assert data["status"] == 200 and data["answer"]["toast"]["type"] == "success", data
    [action] = await wait_for_actions(client, session_id, 1)
    assert action["kind"] == "cancel"

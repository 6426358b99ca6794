"""Issue 15: a default install is no open door (binding, callback authentication, ids in URLs, slow bodies,
bad bearer tokens). Each test fails on the code before the fix."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    CallbackSettings,
    FeishuSettings,
    HttpSettings,
    Settings,
)
from feishu_progress.errors import ConfigError, FeishuAPIError
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.sandbox.clicks import card_action_payload, encrypt, signed_request
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import success

REQUESTER = "ou_requester"


def _sandbox_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'fp.db'}",
        "http": HttpSettings(port=0),
        "admin": AdminSettings(host="127.0.0.1", port=0, token="admin-token"),
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def sandbox_client(tmp_path: Path, aiohttp_client: Any) -> AsyncIterator[TestClient[Any, Any]]:
    app = create_app(_sandbox_settings(tmp_path), registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(app)
    yield client


# -- 2: sandbox mode is not open to the network -----------------------------------------------------


def test_sandbox_mode_binds_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    assert _sandbox_settings(tmp_path).bind_host == "127.0.0.1"
    with_credentials = _sandbox_settings(
        tmp_path,
        feishu=FeishuSettings(app_id="cli_x", app_secret="s", verification_token="v"),
        api=ApiSettings(token="t"),
    )
    assert with_credentials.bind_host == "0.0.0.0"


def test_sandbox_mode_on_a_public_address_needs_the_api_token(tmp_path: Path) -> None:
    exposed = _sandbox_settings(tmp_path, http=HttpSettings(host="0.0.0.0", port=0))
    with pytest.raises(ConfigError, match="FP_API__TOKEN"):
        create_app(exposed, registry=CollectorRegistry())
    protected = _sandbox_settings(
        tmp_path, http=HttpSettings(host="0.0.0.0", port=0), api=ApiSettings(token="t")
    )
    create_app(protected, registry=CollectorRegistry())  # no error


async def test_serve_refuses_to_start_exposed_sandbox_and_says_why(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
    env.update(FP_HTTP__HOST="0.0.0.0", FP_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "feishu_progress",
        "serve",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode != 0
    assert b"FP_API__TOKEN" in output


async def test_an_unsigned_click_cannot_approve_anything_in_sandbox_mode(
    sandbox_client: TestClient[Any, Any],
) -> None:
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
    created = await (await sandbox_client.post("/v1/tasks", json=body)).json()
    session_id = created["session_id"]
    approval = {"type": "approval", "approval_id": "a1", "tool_name": "shell", "summary": "rm -rf /"}
    response = await sandbox_client.post(f"/v1/tasks/{session_id}/events", json={"events": [approval]})
    assert response.status == 202
    payload = card_action_payload(
        open_id=REQUESTER,
        message_id=created["message_id"],
        value={"v": 1, "action": "approve", "session_id": session_id, "approval_id": "a1"},
        verification_token="guessed",
        now=time.time(),
    )
    raw, headers = signed_request(payload, encrypt_key=None, now=time.time())
    refused = await sandbox_client.post("/feishu/callback", data=raw, headers=headers)
    assert refused.status == 401
    assert (await refused.json())["message"] == "missing signature headers"
    actions = await (await sandbox_client.get(f"/v1/tasks/{session_id}/actions")).json()
    assert actions["actions"] == []


async def test_in_sandbox_mode_a_click_signed_with_the_processes_keys_is_accepted(
    sandbox_client: TestClient[Any, Any],
) -> None:
    settings = sandbox_client.server.app[SERVICES].settings
    assert settings.feishu.encrypt_key is not None and settings.feishu.verification_token is not None
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
    created = await (await sandbox_client.post("/v1/tasks", json=body)).json()
    payload = card_action_payload(
        open_id=REQUESTER,
        message_id=created["message_id"],
        value={"v": 1, "action": "cancel", "session_id": created["session_id"]},
        verification_token=settings.feishu.verification_token.get_secret_value(),
        now=time.time(),
    )
    raw, headers = signed_request(
        payload, encrypt_key=settings.feishu.encrypt_key.get_secret_value(), now=time.time()
    )
    answer = await sandbox_client.post("/feishu/callback", data=raw, headers=headers)
    assert answer.status == 200
    assert (await answer.json())["toast"]["type"] == "success"


# -- 3: unsigned callbacks outside sandbox mode -------------------------------------------------------


def test_webhook_mode_without_callback_keys_refuses_to_start(tmp_path: Path) -> None:
    settings = _sandbox_settings(
        tmp_path, feishu=FeishuSettings(app_id="cli_x", app_secret="s"), api=ApiSettings(token="t")
    )
    with pytest.raises(ConfigError, match="FP_FEISHU__ENCRYPT_KEY"):
        create_app(settings, registry=CollectorRegistry())
    long_connection = settings.model_copy(
        update={"feishu": settings.feishu.model_copy(update={"mode": "ws"})}
    )
    assert long_connection.serving_problems() == []


async def test_the_signature_is_checked_before_anything_is_decrypted(
    sandbox_client: TestClient[Any, Any],
) -> None:
    # Garbage ciphertext with a wrong signature: a decrypt-first parser answers 400 "cannot be decrypted".
    raw = json.dumps({"encrypt": "not-base64-at-all"}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Lark-Request-Timestamp": str(int(time.time())),
        "X-Lark-Request-Nonce": "n",
        "X-Lark-Signature": "0" * 64,
    }
    response = await sandbox_client.post("/feishu/callback", data=raw, headers=headers)
    assert response.status == 401
    assert (await response.json())["message"] == "invalid signature"


# -- 7: ids that go into URLs ---------------------------------------------------------------------------


async def test_reply_to_message_id_must_be_a_message_id(sandbox_client: TestClient[Any, Any]) -> None:
    body = {
        "receive_id": "oc_1",
        "receive_id_type": "chat_id",
        "requester_open_id": REQUESTER,
        "reply_to_message_id": "../../chats",
    }
    response = await sandbox_client.post("/v1/tasks", json=body)
    assert response.status == 422
    assert (await response.json())["field"] == "reply_to_message_id"


async def test_the_client_never_puts_a_foreign_path_into_a_url() -> None:
    async with run_sandbox() as sandbox:
        settings = FeishuSettings(base_url=sandbox.base_url, app_id="a", app_secret="s")
        async with FeishuClient(settings) as client:
            with pytest.raises(FeishuAPIError, match="not a Feishu id"):
                await client.reply_card("../chats", {"schema": "2.0"}, uuid="u")
            with pytest.raises(FeishuAPIError, match="not a Feishu id"):
                await client.patch_card("om_1/../../chats", {"schema": "2.0"})
        assert sandbox.state.requests["reply"] == 0
        assert sandbox.state.requests["patch"] == 0


async def test_a_card_id_feishu_answers_must_be_an_id_before_it_reaches_a_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with run_sandbox() as sandbox:
        monkeypatch.setattr(sandbox.state.cardkit, "create", lambda body: success({"card_id": "../chats"}))
        settings = FeishuSettings(base_url=sandbox.base_url, app_id="a", app_secret="s")
        async with FeishuClient(settings) as client:
            with pytest.raises(FeishuAPIError, match="not a Feishu id"):
                await client.create_card_entity({"schema": "2.0"})


# -- 8: slow bodies -------------------------------------------------------------------------------------


async def test_a_slow_callback_body_is_cut_off(tmp_path: Path, aiohttp_client: Any) -> None:
    settings = _sandbox_settings(tmp_path, callback=CallbackSettings(body_timeout_seconds=0.3))
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(
            b"POST /feishu/callback HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(
            next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(
                b":"
            )[1]
        )
        body = json.loads(await reader.readexactly(length))
    finally:
        writer.close()
    assert status_line.split()[1] == b"408"
    assert body["error"] == "body_timeout"


# -- 11: a bearer token that is not UTF-8 ---------------------------------------------------------------


async def _raw_get(host: str, port: int, path: str, authorization: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + authorization + b"\r\n\r\n"
        )
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


async def test_a_bearer_token_that_is_not_utf8_is_401_not_5xx(tmp_path: Path, aiohttp_client: Any) -> None:
    settings = _sandbox_settings(tmp_path, api=ApiSettings(token="api-token"))
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    status = await _raw_get(client.host, client.port, "/v1/tasks/1", b"Bearer \xff\xfe\xc3")
    assert status.split()[1] == b"401"
    admin_url = client.server.app[ADMIN_URL]
    assert admin_url is not None
    host, port = admin_url.removeprefix("http://").rsplit(":", 1)
    admin_status = await _raw_get(host, int(port), "/admin/cards", b"Bearer \xff\xfe\xc3")
    assert admin_status.split()[1] == b"401"


# -- 10: runtime-supplied strings cannot forge log lines ---------------------------------------------


async def test_strings_from_runtimes_and_clicks_are_logged_quoted(
    sandbox_client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    forged = "x\n2026-12-01 00:00:00,000 ERROR   feishu_progress: FORGED"
    settings = sandbox_client.server.app[SERVICES].settings
    assert settings.feishu.encrypt_key is not None and settings.feishu.verification_token is not None
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
    created = await (await sandbox_client.post("/v1/tasks", json=body)).json()
    session_id = created["session_id"]

    async def click(open_id: str, value: dict[str, Any]) -> None:
        payload = card_action_payload(
            open_id=open_id,
            message_id=created["message_id"],
            value={"v": 1, "session_id": session_id, **value},
            verification_token=settings.feishu.verification_token.get_secret_value(),  # type: ignore[union-attr]
            now=time.time(),
        )
        raw, headers = signed_request(
            payload,
            encrypt_key=settings.feishu.encrypt_key.get_secret_value(),  # type: ignore[union-attr]
            now=time.time(),
        )
        answer = await sandbox_client.post("/feishu/callback", data=raw, headers=headers)
        assert answer.status == 200

    with caplog.at_level("INFO"):
        unknown_subagent = {"type": "subagent_round", "task_id": forged, "round": 2}
        await sandbox_client.post(f"/v1/tasks/{session_id}/events", json={"events": [unknown_subagent]})
        await click("ou_someone_else", {"action": "cancel"})  # not the requester: refused, logged
    logged = [record.getMessage() for record in caplog.records if record.name.startswith("feishu_progress")]
    assert any("not the requester" in line for line in logged), logged
    assert any("unknown task_id" in line for line in logged), logged
    assert not [line for line in logged if "\n" in line], logged


# -- issue 26 item 9: an unsigned body is no decryption oracle ---------------------------------------


async def test_every_unsigned_body_but_the_url_check_gets_one_answer(
    sandbox_client: TestClient[Any, Any],
) -> None:
    settings = sandbox_client.server.app[SERVICES].settings
    assert settings.feishu.encrypt_key is not None and settings.feishu.verification_token is not None
    key, token = (
        settings.feishu.encrypt_key.get_secret_value(),
        settings.feishu.verification_token.get_secret_value(),
    )
    click = card_action_payload(
        open_id=REQUESTER, message_id="om_x", value={"v": 1}, verification_token=token, now=time.time()
    )
    bodies = {
        "not base64": {"encrypt": "not-base64-at-all"},
        "short ciphertext": {"encrypt": base64.b64encode(b"x" * 16).decode()},
        "bad padding": {"encrypt": base64.b64encode(os.urandom(48)).decode()},
        "not JSON inside": {"encrypt": encrypt(key, b"\xff not json")},
        "a click, encrypted but unsigned": {"encrypt": encrypt(key, json.dumps(click).encode())},
        "a plain click": click,
    }
    answers = set()
    for label, body in bodies.items():
        response = await sandbox_client.post("/feishu/callback", json=body)
        answers.add((response.status, (await response.json())["message"]))
        assert response.status == 401, label
    assert answers == {(401, "missing signature headers")}
    url_check = {"type": "url_verification", "challenge": "c-1", "token": token}
    ok = await sandbox_client.post(
        "/feishu/callback", json={"encrypt": encrypt(key, json.dumps(url_check).encode())}
    )
    assert ok.status == 200 and (await ok.json()) == {"challenge": "c-1"}


# -- issue 26 item 8: sandbox mode without a token is no open door for a browser ------------------------


async def test_without_a_token_only_loopback_host_names_are_served(
    sandbox_client: TestClient[Any, Any],
) -> None:
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
    for host in ("attacker.example", "attacker.example:8000", "127.0.0.1.nip.io", "[::2]:80"):
        rebound = await sandbox_client.post("/v1/tasks", json=body, headers={"Host": host})
        assert rebound.status == 403, host
        assert (await rebound.json())["error"] == "forbidden_host"
        page = await sandbox_client.get("/sandbox/", headers={"Host": host})
        assert page.status == 403, host
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST."):
        assert (await sandbox_client.post("/v1/tasks", json=body, headers={"Host": host})).status == 201, host


async def test_without_a_token_cross_site_requests_are_refused(sandbox_client: TestClient[Any, Any]) -> None:
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
    cross_site = [
        {"Origin": "https://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://localhost:3000"},
    ]
    for headers in cross_site:
        refused = await sandbox_client.post("/v1/tasks", json=body, headers=headers)
        assert refused.status == 403, headers
        assert (await refused.json())["error"] == "cross_site"
    created = await sandbox_client.post(
        "/v1/tasks", json=body, headers={"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}
    )
    assert created.status == 201
    form = aiohttp.FormData()
    form.add_field("image", b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, filename="x.png", content_type="image/png")
    session_id = (await created.json())["session_id"]
    upload = await sandbox_client.post(
        f"/v1/tasks/{session_id}/images", data=form, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert upload.status == 403


async def test_the_in_process_sandbox_has_a_secret_of_its_own_and_no_test_endpoints(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    secrets_seen = set()
    for run in range(2):
        settings = _sandbox_settings(tmp_path / str(run))
        (tmp_path / str(run)).mkdir()
        client: TestClient[Any, Any] = await aiohttp_client(
            create_app(settings, registry=CollectorRegistry())
        )
        sandbox = client.server.app[SERVICES].sandbox
        assert sandbox is not None
        secrets_seen.add(sandbox.state.config.app_secret)
        for path in ("/_sandbox/messages", "/_sandbox/stats"):
            async with client.session.get(sandbox.base_url + path) as answer:
                assert answer.status == 404, path
        await client.close()
    assert len(secrets_seen) == 2 and "sandbox-secret" not in secrets_seen

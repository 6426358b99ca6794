"""The whole app in-process (SQLite + the sandbox over real HTTP): runtime API, callbacks, admin."""

from __future__ import annotations

import io
import json
import struct
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from sqlalchemy import text

from feishu_progress.app import ADMIN_URL, SERVICES
from feishu_progress.config import (
    CardSettings,
    Settings,
)
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox
from tests.conftest import sqlite_url
from tests.rigs import (
    ADMIN_TOKEN,
    APP_ID,
    AUTH,
    ENCRYPT_KEY,
    VERIFICATION_TOKEN,
    Client,
    app_settings_for,
    eventually,
    readyz,
)

REQUESTER = "ou_requester"


@pytest.fixture
def app_settings(sandbox: RunningSandbox, tmp_path: Path) -> Settings:
    # These tests read what a click's answer carries and count PATCHes: the PATCH transport. The CardKit
    # transport (the default) has its own end-to-end tests in test_cardkit_transport.py.
    return app_settings_for(
        sandbox,
        sqlite_url(tmp_path / "app.db"),
        admin_token=ADMIN_TOKEN,
        card=CardSettings(transport="patch"),
    )


async def _create(client: TestClient[Any, Any]) -> tuple[int, str]:
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER, "title": "t"}
    response = await client.post("/v1/tasks", json=body, headers=AUTH)
    assert response.status == 201, await response.text()
    data = await response.json()
    return data["session_id"], data["message_id"]


async def _events(
    client: TestClient[Any, Any], session_id: int, *events: Mapping[str, Any]
) -> aiohttp.ClientResponse:
    return await client.post(f"/v1/tasks/{session_id}/events", json={"events": list(events)}, headers=AUTH)


async def _task(client: Client, session_id: int) -> dict[str, Any]:
    task: dict[str, Any] = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    return task


async def _click(
    client: TestClient[Any, Any], message_id: str, operator: str, value: Mapping[str, Any], token: str = "t-1"
) -> dict[str, Any]:
    payload = card_action_payload(
        open_id=operator,
        message_id=message_id,
        chat_id="oc_1",
        value=value,
        verification_token=VERIFICATION_TOKEN,
        now=time.time(),
        click_token=token,
    )
    body, headers = signed_request(payload, encrypt_key=ENCRYPT_KEY, now=time.time())
    response = await client.post("/feishu/callback", data=body, headers=headers)
    assert response.status == 200
    reply: dict[str, Any] = await response.json()
    return reply


async def test_runtime_api_needs_the_bearer_token(client: TestClient[Any, Any]) -> None:
    response = await client.post("/v1/tasks", json={})
    assert response.status == 401
    assert (await response.json())["error"] == "unauthorized"
    wrong = await client.post("/v1/tasks", json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401
    assert "FP_API__TOKEN" in (await wrong.json())["message"]


async def test_create_task_sends_the_first_card(
    client: TestClient[Any, Any], sandbox: RunningSandbox
) -> None:
    session_id, message_id = await _create(client)
    card = sandbox.state.messages[message_id].card
    assert "任务已接收,正在准备执行。" in str(card)
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert task["status"] == "RUNNING"
    # The click re-attached the evicted task under a new live card: its states must still go out (its
    # versions once repeated the ones the scheduler had settled, and the revived card stayed stale).
    await eventually(
        lambda: "boom" not in str(sandbox.state.messages[message_id].card),  # the failed card's error
        timeout=5,
        what="the revived card's state to be delivered",
    )
    assert task["message_id"] == message_id


async def test_a_bad_event_is_refused_naming_the_field_and_nothing_is_applied(
    client: TestClient[Any, Any],
) -> None:
    session_id, _ = await _create(client)
    response = await _events(
        client,
        session_id,
        {"type": "content", "text": "should not land"},
        {"type": "status", "status": "RUNNING", "round": 3},
        {"type": "tool_started", "name": "shell"},
    )
    assert response.status == 422
    body = await response.json()
    assert body["field"] == "events[2].call_id"
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert task["round"] == 0
    assert "should not land" not in str(task["card"])


async def test_an_unknown_locale_and_events_after_finished_are_refused(client: TestClient[Any, Any]) -> None:
    body = {
        "receive_id": "oc_1",
        "receive_id_type": "chat_id",
        "requester_open_id": REQUESTER,
        "locale": "en",
    }
    response = await client.post("/v1/tasks", json=body, headers=AUTH)
    assert response.status == 422
    assert (await response.json())["field"] == "locale"
    session_id, _ = await _create(client)
    late = await _events(
        client, session_id, {"type": "finished", "status": "COMPLETED"}, {"type": "content", "text": "x"}
    )
    assert late.status == 422
    assert (await late.json())["field"] == "events[1]"
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert task["status"] == "RUNNING"  # the rejected batch changed nothing


async def test_unknown_event_type_and_unknown_task(client: TestClient[Any, Any]) -> None:
    session_id, _ = await _create(client)
    response = await _events(client, session_id, {"type": "explode"})
    assert response.status == 422
    assert (await response.json())["field"] == "events[0].type"
    assert (await _events(client, 999_999, {"type": "content", "text": "x"})).status == 404
    not_json = await client.post(
        f"/v1/tasks/{session_id}/events", data=b"{", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert not_json.status == 400


async def test_events_reach_the_card(client: TestClient[Any, Any], sandbox: RunningSandbox) -> None:
    session_id, message_id = await _create(client)
    response = await _events(
        client,
        session_id,
        {"type": "status", "status": "RUNNING", "round": 2},
        {"type": "content_delta", "text": "hello "},
        {"type": "content_delta", "text": "world"},
        {"type": "tool_started", "call_id": "1", "name": "web_search", "args": {"query": "q"}},
        {"type": "tool_finished", "call_id": "1", "result": {"error": "无可用搜索凭据"}},
    )
    assert response.status == 202
    await eventually(lambda: "hello world" in str(sandbox.state.messages[message_id].card), timeout=5)
    card = str(sandbox.state.messages[message_id].card)
    assert "第 2 轮" in card
    assert "失败: 无可用搜索凭据" in card


async def test_only_the_requester_cancels_and_a_redelivered_click_counts_once(
    client: TestClient[Any, Any],
) -> None:
    session_id, message_id = await _create(client)
    value = {"v": 1, "action": "cancel", "session_id": session_id}
    stranger = await _click(client, message_id, "ou_stranger", value, token="s-1")
    assert stranger["toast"]["type"] == "error"
    assert "正在取消" not in str(stranger.get("card", ""))
    replies = [await _click(client, message_id, REQUESTER, value, token="r-1") for _ in range(3)]
    assert replies[0]["toast"]["type"] == "success"
    assert "正在取消" in str(replies[0]["card"])
    log = await (await client.get(f"/v1/tasks/{session_id}/actions?after=0&wait=2", headers=AUTH)).json()
    assert [(a["kind"], a["operator_open_id"]) for a in log["actions"]] == [("cancel", REQUESTER)]
    again = await (
        await client.get(f"/v1/tasks/{session_id}/actions?after={log['cursor']}&wait=0", headers=AUTH)
    ).json()
    assert again["actions"] == []


async def test_clicks_on_unknown_or_finished_tasks_explain_themselves(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await _create(client)
    unknown = await _click(
        client, message_id, REQUESTER, {"v": 1, "action": "cancel", "session_id": 424242}, "u"
    )
    assert unknown["toast"]["type"] == "error"
    await _events(client, session_id, {"type": "finished", "status": "COMPLETED"})
    finished = await _click(
        client, message_id, REQUESTER, {"v": 1, "action": "cancel", "session_id": session_id}, "f"
    )
    assert finished["toast"]["type"] == "info"
    assert (await _events(client, session_id, {"type": "content", "text": "late"})).status == 409


async def test_retry_revives_a_failed_task(client: TestClient[Any, Any], sandbox: RunningSandbox) -> None:
    session_id, message_id = await _create(client)
    await _events(client, session_id, {"type": "finished", "status": "FAILED", "error": "boom"})
    assert (
        await _events(client, session_id, {"type": "status", "status": "RUNNING", "round": 1})
    ).status == 409
    reply = await _click(
        client, message_id, REQUESTER, {"v": 1, "action": "retry", "session_id": session_id}, "x"
    )
    assert reply["toast"]["type"] == "success"
    assert (
        await _events(client, session_id, {"type": "status", "status": "RUNNING", "round": 1})
    ).status == 202
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert task["status"] == "RUNNING"


async def test_the_bare_address_is_404_in_front_of_feishu(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/", allow_redirects=False)).status == 404  # the sandbox page's lead only


async def test_admin_endpoints(client: TestClient[Any, Any]) -> None:
    admin_url = client.app[ADMIN_URL]
    await _create(client)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{admin_url}/healthz") as response:
            assert response.status == 200
        async with http.get(f"{admin_url}/readyz") as response:
            assert response.status == 200, await response.text()
        async with http.get(f"{admin_url}/metrics") as response:
            text = await response.text()
            assert "fp_live_cards 1.0" in text
        async with http.get(f"{admin_url}/admin/cards") as response:
            assert response.status == 401
        async with http.get(
            f"{admin_url}/admin/cards", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as response:
            cards = (await response.json())["cards"]
            assert len(cards) == 1 and cards[0]["status"] == "RUNNING"


async def test_readyz_reports_a_broken_feishu_token(
    client: TestClient[Any, Any], sandbox: RunningSandbox
) -> None:
    admin_url = client.app[ADMIN_URL]
    feishu = client.app[SERVICES].client
    assert feishu is not None
    current = await feishu.tokens.get()
    sandbox.state.config = type(sandbox.state.config)(app_id=APP_ID, app_secret="rotated")  # secret rotated
    feishu.tokens.invalidate(current)
    async with aiohttp.ClientSession() as http, http.get(f"{admin_url}/readyz") as response:
        assert response.status == 503
        assert "feishu_token" in (await response.json())["reasons"]


async def test_a_recalled_card_stops_and_its_clicks_say_so(
    client: TestClient[Any, Any], sandbox: RunningSandbox
) -> None:
    session_id, message_id = await _create(client)
    sandbox.state.recall(message_id)
    await _events(client, session_id, {"type": "content", "text": "after the recall"})
    await eventually(
        lambda: _task(client, session_id),
        until=lambda task: task["stop_reason"] is not None,
        timeout=5,
        what="the scheduler to stop PATCHing a recalled message",
    )
    patches_before = sandbox.state.requests["patch"]
    await _events(client, session_id, {"type": "content", "text": "more"})
    scheduler = client.app[SERVICES].scheduler
    assert scheduler is not None
    assert message_id not in scheduler.pending_message_ids()  # nothing queued: no PATCH can follow
    assert sandbox.state.requests["patch"] == patches_before
    reply = await _click(
        client, message_id, REQUESTER, {"v": 1, "action": "cancel", "session_id": session_id}, "z"
    )
    assert reply["toast"]["content"] == "卡片已过期,请在会话详情中操作"


async def test_a_failing_database_answers_503_not_a_crash(client: TestClient[Any, Any]) -> None:
    session_id, _ = await _create(client)
    db = client.app[SERVICES].db
    assert db is not None
    async with db.engine.begin() as connection:  # the tables the next calls need are gone
        await connection.execute(text("DROP TABLE task_action"))
        await connection.execute(text("ALTER TABLE task_card RENAME TO task_card_gone"))
    response = await client.get(f"/v1/tasks/{session_id}/actions?after=0&wait=0", headers=AUTH)
    assert response.status == 503
    body = await response.json()
    assert body["error"] == "unavailable" and body["retry_after"] >= 1
    # Events still apply: the save fails and is retried later, the request does not fail.
    assert (await _events(client, session_id, {"type": "finished", "status": "COMPLETED"})).status == 202
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert task["status"] == "COMPLETED"


async def test_the_requester_approves_once_and_the_runtime_reads_it(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await _create(client)
    await _events(
        client,
        session_id,
        {"type": "status", "status": "RUNNING", "round": 1},
        {"type": "approval", "approval_id": "ap-1", "tool_name": "mcp:github", "summary": "create an issue"},
    )
    card = (await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json())["card"]
    assert "MCP github 待审批" in str(card)
    value = {"v": 1, "action": "approve", "session_id": session_id, "approval_id": "ap-1"}
    assert (await _click(client, message_id, "ou_stranger", value, "a0"))["toast"]["type"] == "error"
    first = await _click(client, message_id, REQUESTER, value, "a1")
    assert first["toast"]["type"] == "success"
    assert "MCP github 待审批" not in str(first["card"])
    again = await _click(client, message_id, REQUESTER, {**value, "action": "deny"}, "a2")
    assert again["toast"]["type"] == "info"  # already decided: explained, nothing recorded
    log = await (await client.get(f"/v1/tasks/{session_id}/actions?after=0&wait=2", headers=AUTH)).json()
    assert [(a["kind"], a["payload"]["approved"]) for a in log["actions"]] == [("approval", True)]


async def test_answers_are_validated_and_an_answered_ask_says_so(client: TestClient[Any, Any]) -> None:
    session_id, message_id = await _create(client)
    await _events(
        client,
        session_id,
        {"type": "ask", "ask_id": "q-1", "questions": [{"question": "继续吗?", "options": ["是", "否"]}]},
    )
    value = {"v": 1, "action": "answers", "session_id": session_id, "ask_id": "q-1"}

    async def submit(form: Mapping[str, Any], token: str) -> dict[str, Any]:
        payload = card_action_payload(
            open_id=REQUESTER,
            message_id=message_id,
            chat_id="oc_1",
            value=value,
            form_value=form,
            verification_token=VERIFICATION_TOKEN,
            now=time.time(),
            click_token=token,
        )
        body, headers = signed_request(payload, encrypt_key=ENCRYPT_KEY, now=time.time())
        reply: dict[str, Any] = await (
            await client.post("/feishu/callback", data=body, headers=headers)
        ).json()
        return reply

    bad = await submit({"q0_0": "7"}, "b-1")  # no option 7
    assert bad["toast"]["type"] == "error"
    good = await submit({"q0_0": "1"}, "b-2")
    assert good["toast"]["type"] == "success"
    late = await submit({"q0_0": "0"}, "b-3")  # a second submit of the same form, new click
    assert late["toast"]["type"] == "info"
    log = await (await client.get(f"/v1/tasks/{session_id}/actions?after=0&wait=2", headers=AUTH)).json()
    assert [a["payload"]["answers"][0]["selected_labels"] for a in log["actions"]] == [["否"]]


async def test_the_runtime_hands_over_image_bytes_and_a_tool_result_names_the_ref(
    client: TestClient[Any, Any], sandbox: RunningSandbox
) -> None:
    session_id, message_id = await _create(client)
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64

    async def upload(data: bytes, field: str = "image") -> aiohttp.ClientResponse:
        form = aiohttp.FormData()
        form.add_field(field, io.BytesIO(data), filename="x.png", content_type="application/octet-stream")
        return await client.post(f"/v1/tasks/{session_id}/images", data=form, headers=AUTH)

    created = await upload(png)
    assert created.status == 201
    uploaded = await created.json()
    assert uploaded["image_ref"].startswith("fpimg:") and uploaded["mime"] == "image/png"
    assert sandbox.state.images[uploaded["image_key"]] == png
    assert (await (await upload(png)).json())["image_ref"] == uploaded["image_ref"]  # same bytes, same ref

    refused = await upload(b"#!/bin/sh\nrm -rf /\n")
    assert refused.status == 422 and (await refused.json())["error"] == "invalid_image"
    assert (await upload(png, field="other")).status == 422
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 40_000, 40_000, 8, 6, 0, 0, 0)  # a 5 GiB RGBA decode
    bomb = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
    too_big = await upload(bomb)
    assert too_big.status == 422 and "too_many_pixels" in (await too_big.json())["message"]
    assert (await upload(b"\x89PNG\r\n\x1a\n" + b"\x00" * (10 * 1024 * 1024))).status == 413
    unauthenticated = await client.post(f"/v1/tasks/{session_id}/images", data=b"x")
    assert unauthenticated.status == 401

    result = {"images": [{"image_url": uploaded["image_ref"], "size_bytes": len(png), "mime": "image/png"}]}
    await _events(
        client,
        session_id,
        {"type": "tool_started", "call_id": "g1", "name": "generate_image", "args": {"prompt": "猫"}},
        {"type": "tool_finished", "call_id": "g1", "result": result},
    )
    card = (await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json())["card"]
    assert uploaded["image_key"] in json.dumps(card)
    assert message_id in sandbox.state.messages


async def test_readyz_says_degraded_but_stays_ready_while_feishu_is_down_for_every_card(
    client: TestClient[Any, Any], sandbox: RunningSandbox
) -> None:
    sessions = [(await _create(client))[0] for _ in range(6)]
    sandbox.state.faults.fail(1.0, status=503, endpoints=("patch",))
    for session_id in sessions:
        await _events(client, session_id, {"type": "content", "text": "working"})
    # The six failures land within a second.
    status, body = await eventually(
        lambda: readyz(client), until=lambda ready: ready[1]["status"] == "degraded", timeout=5
    )
    assert status == 200 and "outage breaker open" in body["degraded"]["feishu"]
    sandbox.state.faults.clear()
    # The next probe (2 s) closes it.
    await eventually(lambda: readyz(client), until=lambda ready: ready[1]["status"] == "ready", timeout=5)


async def test_a_lone_surrogate_escape_is_refused_and_a_paired_one_is_text(
    client: TestClient[Any, Any],
) -> None:
    session_id, _ = await _create(client)
    started = '{"type": "tool_started", "call_id": "c1", "name": "shell", "args": {"command": "%s"}}'
    for escaped, status in (("\\ud800", 400), ("\\ud83d\\ude00", 202)):  # the second is an emoji
        body = '{"events": [%s]}' % (started % escaped)
        response = await client.post(
            f"/v1/tasks/{session_id}/events",
            data=body,
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert response.status == status, await response.text()
    view = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert "\U0001f600" in json.dumps(view["card"], ensure_ascii=False)

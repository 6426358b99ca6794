"""The sandbox's update log (sandbox/updates.py) over real HTTP: who sent each update, when, what it was
answered, what overlapped; and ``feishu-progress sandbox`` as a process of its own."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from feishu_progress.config import FeishuSettings
from feishu_progress.errors import FeishuAPIError
from feishu_progress.feishu.client import INSTANCE_HEADER, FeishuClient
from feishu_progress.sandbox import RunningSandbox
from tests import cluster_harness as harness
from tests.cluster_harness import Cluster
from tests.fakes import FakeClock
from tests.rigs import eventually
from tests.test_sandbox_cardkit import Api, entity_card


def card(text: str) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "body": {"elements": [{"tag": "markdown", "content": text}]},
    }


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # arrival and answer times in the log are the test's fake time


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def log_of(http: aiohttp.ClientSession, sandbox: RunningSandbox, query: str = "") -> dict[str, Any]:
    async with http.get(f"{sandbox.base_url}/_sandbox/messages{query}") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def test_each_update_names_its_instance_its_times_its_answer_and_the_card_it_showed(
    sandbox: RunningSandbox,
    clock: FakeClock,
    http: aiohttp.ClientSession,
    feishu_settings: FeishuSettings,
) -> None:
    async with (
        FeishuClient(feishu_settings, clock=clock, instance_id="fp-a") as a,
        FeishuClient(feishu_settings, clock=clock) as anonymous,
    ):
        message_id = await a.send_card("oc_chat", "chat_id", card("v0"), "u-1")
        await a.patch_card(message_id, card("v1"))
        await anonymous.patch_card(message_id, card("v2"))

    log = await log_of(http, sandbox)
    (message,) = log["messages"]
    assert message["message_id"] == message_id
    assert [u["instance"] for u in message["updates"]] == ["fp-a", None]
    assert [u["code"] for u in message["updates"]] == [0, 0]
    assert [u["version"] for u in message["updates"]] == [1, 2]
    assert all(u["concurrent"] == 0 for u in message["updates"]) and message["overlaps"] == 0
    first = message["updates"][0]
    assert first["endpoint"] == "patch" and first["arrived"] == first["answered"] == clock.monotonic()
    # Every Open API request is counted by instance (token, send, PATCH for fp-a; token, PATCH without).
    assert log["instances"] == {"fp-a": 3, "": 2}
    assert log["rate_limited"] == 0 and log["now"] == clock.monotonic()
    assert message["card"] == card("v2") and "history" not in message

    with_history = await log_of(http, sandbox, "?history=1")
    assert [v["card"] for v in with_history["messages"][0]["history"]] == [card(f"v{i}") for i in range(3)]
    async with http.get(f"{sandbox.base_url}/_sandbox/messages/{message_id}") as response:
        single = await response.json()
    assert single["updates"] == message["updates"] and len(single["history"]) == 3
    async with http.get(f"{sandbox.base_url}/_sandbox/messages/om_nobody") as response:
        assert response.status == 404


async def test_an_update_arriving_while_another_is_in_flight_is_marked(
    sandbox: RunningSandbox,
    clock: FakeClock,
    http: aiohttp.ClientSession,
    feishu_settings: FeishuSettings,
) -> None:
    async with (
        FeishuClient(feishu_settings, clock=clock, instance_id="fp-a") as a,
        FeishuClient(feishu_settings, clock=clock, instance_id="fp-b") as b,
    ):
        message_id = await a.send_card("oc_chat", "chat_id", card("v0"), "u-1")
        other_id = await a.send_card("oc_chat", "chat_id", card("w0"), "u-2")
        sandbox.state.faults.hang(1)  # fp-a's PATCH is held inside the sandbox, unanswered
        held = asyncio.create_task(a.patch_card(message_id, card("v1")))
        await eventually(
            lambda: message_id in sandbox.state.updates.by_target,
            timeout=5,
            what="the held PATCH to arrive",
        )
        await b.patch_card(message_id, card("v2"))  # same message while fp-a's is in flight
        await b.patch_card(other_id, card("w1"))  # another message: no overlap
        sandbox.state.faults.release_hangs()
        with pytest.raises(FeishuAPIError) as released:
            await held  # a released hang ends in an HTML 504
    assert released.value.http_status == 504

    log = await log_of(http, sandbox)
    by_id = {m["message_id"]: m for m in log["messages"]}
    updates = by_id[message_id]["updates"]
    assert [(u["instance"], u["concurrent"]) for u in updates] == [("fp-a", 0), ("fp-b", 1)]
    assert [u["code"] for u in updates] == [504, 0]
    assert by_id[message_id]["overlaps"] == 1
    assert by_id[other_id]["overlaps"] == 0


async def test_an_update_whose_client_died_mid_body_is_abandoned_not_in_flight_forever(
    sandbox: RunningSandbox,
    clock: FakeClock,
    http: aiohttp.ClientSession,
    feishu_settings: FeishuSettings,
) -> None:
    async with FeishuClient(feishu_settings, clock=clock, instance_id="fp-a") as a:
        message_id = await a.send_card("oc_chat", "chat_id", card("v0"), "u-1")
        token = await a.tokens.get()
    host, port = sandbox.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(  # the headers and half the body, then the process is gone (kill -9)
        f"PATCH /open-apis/im/v1/messages/{message_id} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\n{INSTANCE_HEADER}: fp-dead\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        '{"content": "'.encode()
    )
    await writer.drain()
    await eventually(
        lambda: message_id in sandbox.state.updates.by_target,
        timeout=5,
        what="the update to arrive",
    )
    writer.transport.abort()
    (record,) = sandbox.state.updates.by_target[message_id]
    await eventually(
        lambda: record.abandoned is not None, timeout=5, interval=0.005, what="the update to be abandoned"
    )
    assert record.answered is None and record.code is None
    assert len(sandbox.state.messages[message_id].history) == 1  # it changed nothing
    del reader


async def test_rate_limit_answers_are_counted(
    sandbox: RunningSandbox,
    clock: FakeClock,
    http: aiohttp.ClientSession,
    feishu_settings: FeishuSettings,
) -> None:
    sandbox.state.config.per_message_qps = 1
    async with FeishuClient(feishu_settings, clock=clock, instance_id="fp-a") as a:
        message_id = await a.send_card("oc_chat", "chat_id", card("v0"), "u-1")
        await a.patch_card(message_id, card("v1"))
        with pytest.raises(FeishuAPIError) as refused:
            await a.patch_card(message_id, card("v2"))  # the same (fake) second: 230020
    assert refused.value.code == 230020
    log = await log_of(http, sandbox)
    assert log["rate_limited"] == 1
    assert [u["code"] for u in log["messages"][0]["updates"]] == [0, 230020]
    assert [u["version"] for u in log["messages"][0]["updates"]] == [1, None]
    async with http.get(f"{sandbox.base_url}/_sandbox/stats") as response:
        assert (await response.json())["rate_limited"] == 1


async def test_cardkit_updates_join_the_log_of_the_message_that_shows_the_card(
    sandbox: RunningSandbox, http: aiohttp.ClientSession
) -> None:
    sandbox.state.config.app_id = None  # the bare caller logs in without credentials
    api = Api(http, sandbox.base_url)
    await api.login()
    unsent = await api.create(entity_card())
    assert await api.content(unsent, "never shown", 1) == 0
    card_id = await api.create(entity_card())
    assert await api.content(card_id, "before", 1) == 0  # before the card is sent: its own entry
    message_id = await api.sent(card_id)
    assert await api.content(card_id, "before and after", 2) == 0
    assert await api.update(card_id, entity_card("whole"), 1) == 300317  # sequence went back

    log = await log_of(http, sandbox)
    (message,) = log["messages"]
    assert message["message_id"] == message_id and message["card_id"] == card_id
    assert [(u["endpoint"], u["code"]) for u in message["updates"]] == [
        ("card_content", 0),
        ("card_content", 0),
        ("card_update", 300317),
    ]
    # The first content went to the card before it was on a message: nothing shown, no version.
    assert [u["version"] for u in message["updates"]] == [None, 1, None]
    assert list(log["unsent_cards"]) == [unsent]


# --- the sandbox as its own process ----------------------------------------------------------------


@pytest.mark.slow
async def test_the_sandbox_command_serves_until_sigterm(tmp_path: Path) -> None:
    async with Cluster(tmp_path) as cluster:  # the harness kills it whatever happens
        base_url = await cluster.start_sandbox()
        settings = FeishuSettings(
            base_url=base_url, app_id=harness.APP_ID, app_secret=SecretStr(harness.APP_SECRET)
        )
        async with FeishuClient(settings, instance_id="fp-x") as client:
            message_id = await client.send_card("oc_chat", "chat_id", card("v0"), "u-1")
            await client.patch_card(message_id, card("v1"))
        log = await cluster.sandbox_log()
        assert [u["instance"] for u in log["messages"][0]["updates"]] == ["fp-x"]
        wrong = settings.model_copy(update={"app_secret": SecretStr("wrong")})
        async with FeishuClient(wrong) as stranger:
            assert not await stranger.token_ok()  # --app-secret is enforced

        assert cluster.sandbox is not None
        started = time.monotonic()
        cluster.sandbox.signal(signal.SIGTERM)
        assert await cluster.sandbox.wait_exit(10) == 0
        assert time.monotonic() - started < 5

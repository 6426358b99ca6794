"""FeishuClient and the port adapters against the sandbox, over real HTTP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import SecretStr

from feishu_progress.config import FeishuSettings
from feishu_progress.errors import FeishuAPIError, FeishuTransportError
from feishu_progress.feishu import FeishuClient
from feishu_progress.feishu.client import is_feishu_host
from feishu_progress.feishu.patch_writer import PatchWriter
from feishu_progress.ports import OutcomeKind
from feishu_progress.sandbox import RunningSandbox, SandboxConfig
from tests.fakes import FakeClock, write_once
from tests.rigs import APP_ID, APP_SECRET


def card(text: str = "hello") -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "body": {"elements": [{"tag": "markdown", "content": text}]},
    }


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # uuid windows and token expiry move only when a test advances


def settings_for(
    sandbox: RunningSandbox, *, secret: str = APP_SECRET, timeout: float = 5.0
) -> FeishuSettings:
    return FeishuSettings(
        base_url=sandbox.base_url + "/",
        app_id=APP_ID,
        app_secret=SecretStr(secret),
        timeout_seconds=timeout,
    )


@pytest.fixture
def feishu_settings(sandbox: RunningSandbox) -> FeishuSettings:
    return settings_for(sandbox)  # its base URL ends in "/": the client joins paths either way


@pytest.fixture
def feishu_clock(clock: FakeClock) -> FakeClock:
    return clock  # the client's token renewal on the same fake time as the sandbox


# --- round trips -----------------------------------------------------------------------------


async def test_send_reply_patch_round_trip(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    message_id = await feishu.send_card("oc_group", "chat_id", card("first"), "u-1")
    reply_id = await feishu.reply_card(message_id, card("reply"), "u-2", in_thread=True)
    await feishu.patch_card(message_id, card("second"))

    sent = sandbox.state.messages[message_id]
    assert sent.chat_id == "oc_group"
    assert [c for _, c in sent.history] == [card("first"), card("second")]
    reply = sandbox.state.messages[reply_id]
    assert (reply.parent_id, reply.in_thread, reply.card) == (message_id, True, card("reply"))


async def test_upload_image_round_trip(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    image_key = await feishu.upload_image(b"\x89PNG fake bytes")
    assert sandbox.state.images[image_key] == b"\x89PNG fake bytes"


async def test_same_uuid_within_an_hour_is_the_same_message(
    feishu: FeishuClient, sandbox: RunningSandbox, clock: FakeClock
) -> None:
    first = await feishu.send_card("ou_a", "open_id", card(), "same-uuid")
    assert await feishu.send_card("ou_a", "open_id", card(), "same-uuid") == first
    assert len(sandbox.state.messages) == 1
    await clock.advance(3601)
    assert await feishu.send_card("ou_a", "open_id", card(), "same-uuid") != first


async def test_errors_carry_code_status_and_log_id(feishu: FeishuClient) -> None:
    with pytest.raises(FeishuAPIError) as caught:
        await feishu.patch_card("om_missing", card())
    assert (caught.value.code, caught.value.http_status) == (230001, 400)
    assert caught.value.log_id.startswith("sandbox-")


async def test_connection_refused_is_transport_error(sandbox: RunningSandbox) -> None:
    settings = FeishuSettings(base_url="http://127.0.0.1:9", timeout_seconds=1.0)
    async with FeishuClient(settings) as feishu:
        with pytest.raises(FeishuTransportError):
            await feishu.patch_card("om_x", card())
        assert await feishu.token_ok() is False


async def test_calls_need_an_open_client(sandbox: RunningSandbox) -> None:
    with pytest.raises(RuntimeError, match="not open"):
        await FeishuClient(settings_for(sandbox)).patch_card("om_x", card())


# --- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sandbox_config", [SandboxConfig().unlimited()])
async def test_100_concurrent_calls_share_one_token_fetch(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    sandbox.state.faults.slow(50, endpoints=("token",))  # keep the fetch in flight while everyone asks
    ids = await asyncio.gather(*(feishu.send_card(f"ou_{i}", "open_id", card(), f"u{i}") for i in range(100)))
    assert len(set(ids)) == 100
    assert sandbox.state.token_fetches == 1
    assert feishu.tokens.fetches == 1


async def test_token_renewed_five_minutes_before_expiry(
    feishu: FeishuClient, sandbox: RunningSandbox, clock: FakeClock
) -> None:
    message_id = await feishu.send_card("ou_a", "open_id", card(), "")
    await clock.advance(7200 - 300 - 1)
    await feishu.patch_card(message_id, card("cached"))
    assert sandbox.state.token_fetches == 1
    await clock.advance(2)
    await feishu.patch_card(message_id, card("renewed"))
    assert sandbox.state.token_fetches == 2
    assert len(sandbox.state.tokens) == 2  # <30 min left: the sandbox issued a new one


async def test_rejected_token_is_refreshed_once_and_the_call_succeeds(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    message_id = await feishu.send_card("ou_a", "open_id", card(), "")
    sandbox.state.expire_tokens()
    await feishu.patch_card(message_id, card("after refresh"))
    assert sandbox.state.responses[99991663] == 1
    assert sandbox.state.token_fetches == 2
    assert sandbox.state.messages[message_id].card == card("after refresh")


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(token_ttl=0)])
async def test_token_rejected_after_refresh_raises(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    with pytest.raises(FeishuAPIError) as caught:
        await feishu.send_card("ou_a", "open_id", card(), "")
    assert caught.value.code == 99991663
    assert sandbox.state.requests["send"] == 2  # retried exactly once


async def test_wrong_secret_fails_token_ok(sandbox: RunningSandbox, feishu: FeishuClient) -> None:
    assert await feishu.token_ok() is True
    async with FeishuClient(settings_for(sandbox, secret="wrong")) as bad:
        assert await bad.token_ok() is False
        with pytest.raises(FeishuAPIError) as caught:
            await bad.patch_card("om_x", card())
        assert caught.value.code == 10014


async def test_missing_token_is_99991661(sandbox: RunningSandbox) -> None:
    async with FeishuClient(settings_for(sandbox)) as feishu:
        with pytest.raises(FeishuAPIError) as caught:
            await feishu._request("PATCH", "/open-apis/im/v1/messages/om_x", None, body={"content": "{}"})
    assert (caught.value.code, caught.value.http_status) == (99991661, 400)


async def test_logs_never_carry_tokens_or_cards(
    feishu: FeishuClient, sandbox: RunningSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    message_id = await feishu.send_card("ou_a", "open_id", card("SECRET-CARD-TEXT"), "")
    sandbox.state.expire_tokens()
    sandbox.state.recall(message_id)
    outcome = await write_once(PatchWriter(feishu, message_id, interval=0.25), card("SECRET-CARD-TEXT"))
    assert outcome.kind is OutcomeKind.STOP
    dumped = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "230011" in dumped
    assert "t-sandbox-" not in dumped
    assert APP_SECRET not in dumped
    assert "SECRET-CARD-TEXT" not in dumped


# --- adapters --------------------------------------------------------------------------------


async def test_patch_writer_delivers_and_classifies_without_raising(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    message_id = await feishu.send_card("ou_a", "open_id", card(), "")
    writer = PatchWriter(feishu, message_id, interval=0.5)
    assert (await write_once(writer, card("ok"))).kind is OutcomeKind.DELIVERED
    for _ in range(4):
        await write_once(writer, card("more"))
    limited = await write_once(writer, card("too fast"))
    assert (limited.kind, limited.retry_after, limited.code) == (OutcomeKind.RETRY_MESSAGE, 0.5, 230020)
    sandbox.state.delete(message_id)
    stopped = await write_once(writer, card())
    assert (stopped.kind, stopped.code) == (OutcomeKind.STOP, 230110)


async def test_patch_writer_backs_off_on_5xx_and_hangs(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    message_id = await feishu.send_card("ou_a", "open_id", card(), "")
    sandbox.state.faults.fail(1.0, status=502)
    assert (
        await write_once(PatchWriter(feishu, message_id, interval=0.25), card())
    ).kind is OutcomeKind.BACKOFF
    sandbox.state.faults.clear()
    sandbox.state.faults.hang(1)
    quick = FeishuClient(settings_for(sandbox, timeout=0.3))
    async with quick:
        outcome = await write_once(PatchWriter(quick, message_id, interval=0.25), card())
    assert outcome.kind is OutcomeKind.BACKOFF


async def test_patch_writer_never_raises_when_feishu_is_unreachable() -> None:
    async with FeishuClient(FeishuSettings(base_url="http://127.0.0.1:9", timeout_seconds=1.0)) as feishu:
        outcome = await write_once(PatchWriter(feishu, "om_x", interval=0.25), card())
    assert outcome.kind is OutcomeKind.BACKOFF


async def test_one_pooled_connection_carries_sequential_calls(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    message_id = await feishu.send_card("ou_a", "open_id", card(), "")
    for i in range(5):
        await asyncio.sleep(0)
        await feishu.patch_card(message_id, card(f"v{i}"))
    assert sandbox.state.requests["patch"] == 5
    assert sandbox.state.connections == 1  # token, send and PATCHes all reuse one keep-alive socket


@pytest.mark.parametrize(
    ("base_url", "official"),
    [
        ("https://open.feishu.cn", True),
        ("https://open.larksuite.com/", True),
        ("https://OPEN.FEISHU.CN.", True),
        ("http://127.0.0.1:9000", False),
        ("https://feishu.cn.example.com", False),
        ("https://proxy.internal/feishu.cn", False),
    ],
)
def test_only_feishus_own_hosts_count_as_feishu(base_url: str, official: bool) -> None:
    """Only these get no X-FP-Instance header (the sandbox and proxies do: the cluster tests read it)."""
    assert is_feishu_host(base_url) is official

"""POST /feishu/callback through aiohttp: statuses, dedupe, replies, latency hook, and a fuzz test."""

from __future__ import annotations

import asyncio
import io
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feishu_progress.background import BackgroundTasks
from feishu_progress.feishu.callback import MemoryDeduper
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.web.callbacks import CALLBACK_PATH, callback_routes
from tests.fakes import FakeClock
from tests.test_callback_support import (
    WALL_NOW,
    RecordingHandler,
    card_action_payload,
    encrypt,
    encrypted_body,
    make_settings,
    signed_headers,
    url_verification_payload,
)

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]
Client = TestClient[web.Request, web.Application]


def _clock() -> FakeClock:
    return FakeClock(wall_start=WALL_NOW)


async def _client(
    aiohttp_client: ClientFactory,
    handler: RecordingHandler,
    observed: list[float] | None = None,
    reply_timeout: float | None = None,
) -> Client:
    settings_ = make_settings()
    clock = _clock()
    deduper = MemoryDeduper(ttl_seconds=3600, now=clock.monotonic)
    pipeline = CallbackPipeline(
        handler, deduper, settings_.card.locales, BackgroundTasks(), reply_timeout=reply_timeout or 2.5
    )
    app = web.Application()
    app.add_routes(callback_routes(lambda: pipeline, settings_, clock, observe=_appender(observed)))
    return await aiohttp_client(app)


def _appender(observed: list[float] | None) -> Callable[[float], None] | None:
    return observed.append if observed is not None else None


async def _post_click(client: Client, event_id: str = "ev-1", callback_token: str = "c-1") -> Any:
    raw = encrypted_body(card_action_payload(event_id, callback_token))
    return await client.post(CALLBACK_PATH, data=raw, headers=signed_headers(raw))


async def test_click_calls_the_handler_once_and_renders_its_reply(aiohttp_client: ClientFactory) -> None:
    card = {"schema": "2.0", "body": {"elements": []}}
    handler = RecordingHandler(text="已取消", card=card)
    observed: list[float] = []
    client = await _client(aiohttp_client, handler, observed)
    response = await _post_click(client)
    assert response.status == 200
    assert await response.json() == {
        "toast": {"type": "success", "content": "已取消", "i18n": {"zh_cn": "已取消", "en_us": "已取消"}},
        "card": {"type": "raw", "data": card},
    }
    assert [e.value["action"] for e in handler.events] == ["cancel"]
    assert observed == [0.0]  # fake clock: no time passes, but every request is observed


async def test_replayed_click_gets_a_neutral_toast_and_no_second_action(
    aiohttp_client: ClientFactory,
) -> None:
    handler = RecordingHandler()
    client = await _client(aiohttp_client, handler)
    await _post_click(client, "ev-1", "c-1")
    replay = await _post_click(client, "ev-1", "c-1")
    same_click_new_event = await _post_click(client, "ev-2", "c-1")
    for response in (replay, same_click_new_event):
        body = await response.json()
        assert (response.status, body["toast"]["type"]) == (200, "info")
        assert "card" not in body
    assert len(handler.events) == 1


async def test_handler_failure_is_a_200_error_toast_with_a_logged_traceback(
    aiohttp_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await _client(aiohttp_client, RecordingHandler(error=RuntimeError("boom")))
    response = await _post_click(client)
    assert (response.status, (await response.json())["toast"]["type"]) == (200, "error")
    assert any(record.exc_info and "boom" in str(record.exc_info[1]) for record in caplog.records)


async def test_slow_handler_gets_an_error_toast_in_time_and_still_finishes(
    aiohttp_client: ClientFactory,
) -> None:
    gate = asyncio.Event()
    handler = RecordingHandler(gate=gate)
    client = await _client(aiohttp_client, handler, reply_timeout=0.01)
    response = await _post_click(client)
    assert (await response.json())["toast"]["type"] == "error"
    gate.set()  # the late handler was not cancelled: it completes quietly
    await FakeClock().settle()
    assert handler.finished == 1


@pytest.mark.parametrize("encrypted", [False, True])
async def test_url_verification_echoes_the_challenge(aiohttp_client: ClientFactory, encrypted: bool) -> None:
    handler = RecordingHandler()
    client = await _client(aiohttp_client, handler)
    payload = url_verification_payload("c-77")
    raw = encrypted_body(payload) if encrypted else json.dumps(payload).encode()
    response = await client.post(CALLBACK_PATH, data=raw, headers={"Content-Type": "application/json"})
    assert (response.status, await response.json()) == (200, {"challenge": "c-77"})
    assert handler.events == []


@pytest.mark.parametrize(
    ("raw", "headers", "status"),
    [
        (b"not json", {"Content-Type": "application/json"}, 401),  # unsigned: one answer for all
        (b"{}", {"Content-Type": "text/plain"}, 415),
        (b"{}", {}, 415),
        (b"{}", {"Content-Type": "application/json"}, 401),  # no signature headers
    ],
)
async def test_bad_requests_get_their_4xx_and_a_json_reason(
    aiohttp_client: ClientFactory, raw: bytes, headers: dict[str, str], status: int
) -> None:
    handler = RecordingHandler()
    client = await _client(aiohttp_client, handler)
    response = await client.post(CALLBACK_PATH, data=raw, headers=headers)
    assert response.status == status
    assert isinstance((await response.json())["message"], str)
    assert handler.events == []


async def test_wrong_signature_is_401(aiohttp_client: ClientFactory) -> None:
    raw = encrypted_body(card_action_payload())
    client = await _client(aiohttp_client, RecordingHandler())
    headers = signed_headers(raw) | {"X-Lark-Signature": "f" * 64}
    assert (await client.post(CALLBACK_PATH, data=raw, headers=headers)).status == 401


async def test_body_over_one_megabyte_is_413_by_content_length(aiohttp_client: ClientFactory) -> None:
    client = await _client(aiohttp_client, RecordingHandler())
    raw = io.BytesIO(b'{"a": "' + b"x" * (1024 * 1024) + b'"}')
    response = await client.post(CALLBACK_PATH, data=raw, headers={"Content-Type": "application/json"})
    assert response.status == 413


async def test_chunked_body_over_one_megabyte_is_413_while_streaming(aiohttp_client: ClientFactory) -> None:
    client = await _client(aiohttp_client, RecordingHandler())

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):  # 2.5 MB, no Content-Length
            yield b" " * 65536

    response = await client.post(CALLBACK_PATH, data=chunks(), headers={"Content-Type": "application/json"})
    assert response.status == 413


# ---- fuzz ---------------------------------------------------------------------------------------------

_header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _mutated_click(data: st.DataObject) -> dict[str, Any]:
    """A valid click with one field replaced or deleted: exercises parsing behind a valid signature."""
    payload = card_action_payload(event_id=data.draw(_header_text), callback_token=data.draw(_header_text))
    section = data.draw(st.sampled_from(["header", "event"]))
    key = data.draw(st.sampled_from(sorted(payload[section])))
    if data.draw(st.booleans()):
        payload[section][key] = data.draw(_json_values)
    else:
        del payload[section][key]
    return payload


@st.composite
def _requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    kind = draw(st.sampled_from(["bytes", "json", "signed", "encrypt-garbage"]))
    if kind == "bytes":
        raw = draw(st.binary(max_size=300))
    elif kind == "json":
        raw = json.dumps(draw(_json_values)).encode()
    elif kind == "encrypt-garbage":
        raw = json.dumps({"encrypt": draw(st.text(max_size=80) | st.just(encrypt("k", b"{}")))}).encode()
    else:
        payload = _mutated_click(draw(st.data()))
        raw = encrypted_body(payload)
        return raw, signed_headers(raw)
    headers = draw(
        st.dictionaries(
            st.sampled_from(
                ["X-Lark-Request-Timestamp", "X-Lark-Request-Nonce", "X-Lark-Signature", "x-lark-signature"]
            ),
            _header_text,
        )
    )
    headers["Content-Type"] = draw(
        st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", "", "a/b; x"])
    )
    return raw, headers


_fuzz_clients: weakref.WeakKeyDictionary[ClientFactory, Client] = weakref.WeakKeyDictionary()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_requests())
async def test_fuzzed_requests_never_get_a_5xx(
    aiohttp_client: ClientFactory, request: tuple[bytes, dict[str, str]]
) -> None:
    # One server for all examples (the fixture lives as long as the whole hypothesis run); the fixture's
    # teardown closes it.
    if aiohttp_client not in _fuzz_clients:
        _fuzz_clients[aiohttp_client] = await _client(aiohttp_client, RecordingHandler())
    raw, headers = request
    response = await _fuzz_clients[aiohttp_client].post(CALLBACK_PATH, data=raw, headers=headers)
    assert response.status < 500
    body = await response.json()  # every answer, even a refusal, is JSON
    assert isinstance(body, dict)

"""The sandbox's long-connection gateway, spoken to frame by frame (no SDK client, no threads).

The frame codec is checked against lark-oapi's own generated ``pbbp2.Frame``; the gateway through a
raw aiohttp websocket client playing lark-oapi's ``ws.Client`` (discovery, ping, answer frames).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lark_oapi.ws.client import _new_ping_frame
from lark_oapi.ws.pb.pbbp2_pb2 import Frame as SdkFrame

from feishu_progress.feishu.ws_frames import Frame, FrameError, Method, decode_frame, encode_frame
from feishu_progress.feishu.ws_protocol import ENDPOINT_PATH, ClientConfig
from feishu_progress.sandbox.clicks import card_action_payload
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from tests.rigs import APP_ID, APP_SECRET

CONFIG = ClientConfig(reconnect_count=-1, reconnect_interval=7, reconnect_nonce=0, ping_interval=9)
WAIT = 5.0  # every receive is bounded

# ---- the frame codec against the SDK's generated class ----------------------------------------------

_text = st.text(max_size=20)
_frames = st.builds(
    Frame,
    seq_id=st.integers(0, 2**64 - 1),
    log_id=st.integers(0, 2**64 - 1),
    service=st.integers(-(2**31), 2**31 - 1),
    method=st.integers(-(2**31), 2**31 - 1),
    headers=st.lists(st.tuples(_text, _text), max_size=5),
    payload_encoding=st.none() | _text,
    payload_type=st.none() | _text,
    payload=st.none() | st.binary(max_size=64),
    log_id_new=st.none() | _text,
)


def _sdk_fields(frame: SdkFrame) -> Frame:
    return Frame(
        seq_id=frame.SeqID,
        log_id=frame.LogID,
        service=frame.service,
        method=frame.method,
        headers=[(h.key, h.value) for h in frame.headers],
        payload_encoding=frame.payload_encoding if frame.HasField("payload_encoding") else None,
        payload_type=frame.payload_type if frame.HasField("payload_type") else None,
        payload=frame.payload if frame.HasField("payload") else None,
        log_id_new=frame.LogIDNew if frame.HasField("LogIDNew") else None,
    )


@given(_frames)
def test_our_frames_parse_in_the_sdk_and_the_sdks_parse_in_ours(frame: Frame) -> None:
    sdk = SdkFrame()
    sdk.ParseFromString(encode_frame(frame))
    assert _sdk_fields(sdk) == frame
    assert decode_frame(sdk.SerializeToString()) == frame


def test_the_sdks_ping_frame_decodes() -> None:
    frame = decode_frame(_new_ping_frame(33554678).SerializeToString())
    assert (frame.method, frame.service, frame.headers) == (Method.CONTROL, 33554678, [("type", "ping")])


@pytest.mark.parametrize(
    "data",
    [
        b"\x08",  # truncated varint
        b"\x08\x00\x10\x00\x18\x00",  # no method (required)
        b"\x08\x00\x10\x00\x18\x00\x20\x00\x2a\x05ab",  # header runs past the end
        b"\x08\x00\x10\x00\x18\x00\x20\x00\x2a\x02\x0a\x00",  # header without a value
        b"\x08\x00\x10\x00\x18\x00\x20\x00\x43\x00",  # wire type 3 (groups) unsupported
        b"\x08\x00\x10\x00\x18\x00\x20\x00\x42\x02\xff\xfe" + b"\x4a\x01\xff",  # LogIDNew not UTF-8
    ],
)
def test_malformed_frames_raise_frame_error(data: bytes) -> None:
    with pytest.raises(FrameError):
        decode_frame(data)


def test_unknown_fields_are_skipped() -> None:
    known = encode_frame(Frame(seq_id=1, method=Method.DATA, payload=b"x"))
    extra = b"\x50\x07" + b"\x59" + b"\x00" * 8 + b"\x62\x01z" + b"\x6d" + b"\x00" * 4  # fields 10-13
    assert decode_frame(known + extra) == decode_frame(known)


# ---- the gateway ----------------------------------------------------------------------------------


@pytest.fixture
def sandbox_ws_config() -> ClientConfig:
    return CONFIG  # not the gateway's defaults: the tests read these values back from discovery


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as session:
        yield session


async def _discover(http: aiohttp.ClientSession, sandbox: RunningSandbox, secret: str = APP_SECRET) -> Any:
    body = {"AppID": APP_ID, "AppSecret": secret}
    async with http.post(sandbox.base_url + ENDPOINT_PATH, json=body) as response:
        return response.status, await response.json()


async def _connect(http: aiohttp.ClientSession, sandbox: RunningSandbox) -> aiohttp.ClientWebSocketResponse:
    status, body = await _discover(http, sandbox)
    assert status == 200 and body["code"] == 0, body
    return await http.ws_connect(body["data"]["URL"])


async def _receive(ws: aiohttp.ClientWebSocketResponse) -> Frame:
    message = await ws.receive(timeout=WAIT)
    assert message.type is aiohttp.WSMsgType.BINARY, message
    return decode_frame(message.data)


def _answer(frame: Frame, body: dict[str, Any], code: int = 200) -> bytes:
    """What lark-oapi sends back: the same frame, payload {"code", "data": base64(handler JSON)}."""
    data = base64.b64encode(json.dumps(body).encode()).decode()
    answer = Frame(
        frame.seq_id,
        frame.log_id,
        frame.service,
        frame.method,
        [*frame.headers, ("biz_rt", "1")],
        payload=json.dumps({"code": code, "data": data}).encode(),
    )
    return encode_frame(answer)


def _click(value: int = 1) -> dict[str, Any]:
    return card_action_payload(
        open_id="ou_1", message_id="om_1", value={"n": value}, verification_token="vt", now=time.time()
    )


async def test_discovery_hands_out_a_ws_url_and_feishus_client_config(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    status, body = await _discover(http, sandbox)
    assert (status, body["code"]) == (200, 0)
    url = body["data"]["URL"]
    assert url.startswith(sandbox.base_url.replace("http://", "ws://") + "/ws/v2?")
    assert "device_id=" in url and "service_id=" in url
    assert body["data"]["ClientConfig"] == {
        "ReconnectCount": -1,
        "ReconnectInterval": 7,
        "ReconnectNonce": 0,
        "PingInterval": 9,
    }


async def test_discovery_refuses_a_wrong_secret_and_is_busy_while_unavailable(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    assert (await _discover(http, sandbox, secret="wrong"))[1]["code"] == 10014
    sandbox.gateway.available = False
    status, body = await _discover(http, sandbox)
    assert (status, body["code"]) == (503, 1)  # the SDK retries on this, and gives up on 10014
    assert sandbox.gateway.discoveries == 2


async def test_a_ticket_opens_one_connection_only(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    _, body = await _discover(http, sandbox)
    first = await http.ws_connect(body["data"]["URL"])
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(body["data"]["URL"])
    assert refused.value.status == 403
    assert refused.value.headers is not None and refused.value.headers["handshake-status"] == "403"
    assert sandbox.gateway.connection_count == 1
    await first.close()


async def test_a_ping_gets_a_pong_carrying_the_client_config(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    ws = await _connect(http, sandbox)
    await ws.send_bytes(_new_ping_frame(33554678).SerializeToString())
    pong = await _receive(ws)
    assert (pong.method, pong.header("type"), pong.service) == (Method.CONTROL, "pong", 33554678)
    assert json.loads(pong.payload or b"") == CONFIG.to_json()
    assert sandbox.gateway.pings == 1
    await ws.close()


async def test_a_silent_gateway_answers_no_ping(http: aiohttp.ClientSession, sandbox: RunningSandbox) -> None:
    ws = await _connect(http, sandbox)
    sandbox.gateway.answer_pings = False
    await ws.send_bytes(_new_ping_frame(1).SerializeToString())
    await sandbox.gateway.push(_click())
    assert (await _receive(ws)).method == Method.DATA  # the next frame is the push, not a pong
    assert sandbox.gateway.pings == 1
    await ws.close()


async def test_a_push_is_an_event_data_frame_and_its_answer_comes_back_decoded(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    ws = await _connect(http, sandbox)
    click = _click()
    delivery = await sandbox.gateway.push(click)
    frame = await _receive(ws)
    assert frame.method == Method.DATA
    assert frame.header("type") == "event"
    assert frame.header("message_id") == delivery.message_id
    assert (frame.header("sum"), frame.header("seq")) == ("1", "0")
    assert frame.header("trace_id")
    assert json.loads(frame.payload or b"") == click
    reply = {"toast": {"type": "success", "content": "ok"}}
    await ws.send_bytes(_answer(frame, reply))
    answer = await delivery.wait(WAIT)
    assert (answer.code, answer.body, answer.sends) == (200, reply, 1)
    assert 0 <= answer.seconds < WAIT
    await ws.close()


async def test_a_long_payload_is_split_into_sum_seq_parts(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    ws = await _connect(http, sandbox)
    sandbox.gateway.fragment_bytes = 100
    click = _click()
    await sandbox.gateway.push(click)
    first = await _receive(ws)
    parts = [first] + [await _receive(ws) for _ in range(int(first.header("sum") or 0) - 1)]
    assert len(parts) > 2
    assert [p.header("seq") for p in parts] == [str(i) for i in range(len(parts))]
    assert len({p.header("message_id") for p in parts}) == 1
    assert json.loads(b"".join(p.payload or b"" for p in parts)) == click
    await ws.close()


async def test_pushes_without_a_client_wait_for_the_next_connection_in_order(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    deliveries = [await sandbox.gateway.push(_click(n)) for n in (1, 2)]
    assert sandbox.gateway.queued == 2
    ws = await _connect(http, sandbox)
    frames = [await _receive(ws), await _receive(ws)]
    assert [f.header("message_id") for f in frames] == [d.message_id for d in deliveries]
    assert sandbox.gateway.queued == 0
    await ws.close()


async def test_a_frame_unanswered_when_the_connection_drops_is_sent_again_on_the_next(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    ws = await _connect(http, sandbox)
    delivery = await sandbox.gateway.push(_click())
    assert (await _receive(ws)).header("message_id") == delivery.message_id
    assert await sandbox.gateway.drop_all() == 1
    closing = await ws.receive(timeout=WAIT)
    assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 1001
    again = await _connect(http, sandbox)
    frame = await _receive(again)
    assert frame.header("message_id") == delivery.message_id
    await again.send_bytes(_answer(frame, {"toast": {"type": "info", "content": "dup"}}))
    assert (await delivery.wait(WAIT)).sends == 2
    assert sandbox.gateway.connects == 2
    await again.close()


async def test_each_push_goes_to_one_connection_taking_turns(
    http: aiohttp.ClientSession, sandbox: RunningSandbox
) -> None:
    first, second = await _connect(http, sandbox), await _connect(http, sandbox)
    deliveries = [await sandbox.gateway.push(_click(n)) for n in range(4)]
    received = [await _receive(ws) for ws in (first, second, first, second)]
    assert sorted(f.header("message_id") or "" for f in received) == sorted(d.message_id for d in deliveries)
    assert {received[0].header("message_id"), received[2].header("message_id")}.isdisjoint(
        {received[1].header("message_id"), received[3].header("message_id")}
    )
    await first.close()
    await second.close()


async def test_stopping_the_sandbox_closes_clients_and_cancels_unanswered_pushes(
    http: aiohttp.ClientSession,
) -> None:
    async with run_sandbox(SandboxConfig(), ws_client_config=CONFIG) as running:
        ws = await _connect(http, running)
        delivery = await running.gateway.push(_click())
        await _receive(ws)
    assert (await ws.receive(timeout=WAIT)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert delivery.answer.cancelled()

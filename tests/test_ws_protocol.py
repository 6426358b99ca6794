"""The long-connection protocol of our client (feishu/ws_protocol.py), checked against lark-oapi's own code.

lark-oapi is the oracle: its ping frame, its answer frame (``_handle_data_frame``), its endpoint host for
Lark. Imported once for this module (~5 s).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from lark_oapi.core.const import FEISHU_DOMAIN, LARK_DOMAIN
from lark_oapi.core.json import JSON
from lark_oapi.ws.client import _new_ping_frame
from lark_oapi.ws.const import GEN_ENDPOINT_URI
from lark_oapi.ws.model import Response as SdkResponse
from lark_oapi.ws.pb.pbbp2_pb2 import Frame as SdkFrame

from feishu_progress.apps_file import DOMAINS
from feishu_progress.feishu.ws_frames import Frame, Method, decode_frame
from feishu_progress.feishu.ws_protocol import (
    MAX_INTERVAL,
    MAX_PARTS,
    PART_TTL_SECONDS,
    ClientConfig,
    DiscoveryRefused,
    FragmentAssembler,
    ProtocolError,
    answer_frame,
    endpoint_url,
    parse_endpoint,
    ping_frame,
    pong_config,
)

URL = "wss://msg-frontier.feishu.cn/ws/v2?fpid=493&aid=552564&device_id=7401&access_key=k&service_id=33554678&ticket=t"


def test_our_ping_is_byte_for_byte_the_sdks() -> None:
    assert ping_frame(33554678) == _new_ping_frame(33554678).SerializeToString()


def _data_frame(message_id: str = "m1", seq: int = 0, total: int = 1, payload: bytes = b"{}") -> Frame:
    headers = [("type", "event"), ("message_id", message_id), ("trace_id", "t1")]
    headers += [("sum", str(total)), ("seq", str(seq))]
    return Frame(seq_id=seq, log_id=7, service=33554678, method=Method.DATA, headers=headers, payload=payload)


def _sdk_answer(frame: Frame, result: dict[str, Any], elapsed_ms: int) -> SdkFrame:
    """What lark-oapi 1.7.5's ``_handle_data_frame`` sends back for a handler that returned ``result``."""
    sdk = SdkFrame()
    sdk.ParseFromString(answer_frame(frame, 200, None, 0))  # any answer: only its untouched fields are used
    del sdk.headers[-1]  # our biz_rt
    header = sdk.headers.add()
    header.key, header.value = "biz_rt", str(elapsed_ms)
    response = SdkResponse(code=200)
    response.data = base64.b64encode(JSON.marshal(result).encode("utf-8"))
    sdk.payload = JSON.marshal(response).encode("utf-8")
    return sdk


def test_our_answer_frame_is_the_sdks() -> None:
    reply = {"toast": {"type": "success", "content": "已取消"}, "card": {"type": "raw", "data": {"a": 1}}}
    frame = _data_frame(payload=b'{"schema": "2.0"}')
    ours = SdkFrame()
    ours.ParseFromString(answer_frame(frame, 200, reply, 12))
    theirs = _sdk_answer(frame, reply, 12)
    assert [(h.key, h.value) for h in ours.headers] == [(h.key, h.value) for h in theirs.headers]
    assert (ours.SeqID, ours.LogID, ours.service, ours.method) == (0, 7, 33554678, 1)
    assert (ours.SeqID, ours.LogID, ours.service, ours.method) == (
        theirs.SeqID,
        theirs.LogID,
        theirs.service,
        theirs.method,
    )
    ours_payload, theirs_payload = json.loads(ours.payload), json.loads(theirs.payload)
    assert ours_payload.keys() == theirs_payload.keys() == {"code", "data"}
    assert json.loads(base64.b64decode(ours_payload["data"])) == reply
    assert json.loads(base64.b64decode(theirs_payload["data"])) == reply


def test_a_failed_handler_is_answered_500_without_data() -> None:
    answer = decode_frame(answer_frame(_data_frame(), 500, None, 3))
    assert json.loads(answer.payload or b"") == {"code": 500}


def test_discovery_goes_to_the_apps_own_host_lark_included() -> None:
    assert endpoint_url(DOMAINS["lark"]) == LARK_DOMAIN + GEN_ENDPOINT_URI
    assert endpoint_url(DOMAINS["feishu"]) == FEISHU_DOMAIN + GEN_ENDPOINT_URI
    assert endpoint_url("http://127.0.0.1:9/") == "http://127.0.0.1:9/callback/ws/endpoint"


def test_an_endpoint_is_parsed_with_its_client_config() -> None:
    config = {"ReconnectCount": -1, "ReconnectInterval": 5, "ReconnectNonce": 2, "PingInterval": 9}
    answer = {"code": 0, "msg": "ok", "data": {"URL": URL, "ClientConfig": config}}
    endpoint = parse_endpoint(200, answer, ClientConfig())
    assert (endpoint.url, endpoint.device_id, endpoint.service_id) == (URL, "7401", 33554678)
    assert endpoint.config == ClientConfig(-1, 5, 2, 9)


@pytest.mark.parametrize(
    ("status", "answer", "trouble"),
    [
        (200, {"code": 10014, "msg": "app secret invalid"}, False),  # the app's fault: said so
        (200, {"code": 1, "msg": "system busy"}, True),
        (200, {"code": 1000040343, "msg": "internal"}, True),
        (503, {"code": 1, "msg": "busy"}, True),
        (502, None, True),  # a proxy's HTML page
        (200, {"code": 0, "data": {"URL": "https://not-a-websocket"}}, True),
        (200, {"code": 0, "data": {"URL": "wss://x/ws?device_id=1"}}, True),  # no service_id
    ],
)
def test_a_refused_or_broken_discovery_says_whose_fault(status: int, answer: Any, trouble: bool) -> None:
    with pytest.raises(DiscoveryRefused) as refused:
        parse_endpoint(status, answer, ClientConfig())
    assert refused.value.feishu_trouble is trouble


def test_a_gateway_cannot_make_the_client_spin_or_sleep_for_ever() -> None:
    wild = {"ReconnectInterval": 0, "ReconnectNonce": -5, "PingInterval": 10**9, "ReconnectCount": True}
    assert ClientConfig().updated(wild) == ClientConfig(-1, 1, 0, MAX_INTERVAL)
    assert ClientConfig().updated("garbage") == ClientConfig()


def test_a_pong_reconfigures_and_a_pong_without_config_keeps_it() -> None:
    pong = Frame(method=Method.CONTROL, headers=[("type", "pong")], payload=b'{"PingInterval": 7}')
    assert pong_config(pong, ClientConfig()).ping_interval == 7
    assert (
        pong_config(Frame(method=Method.CONTROL, headers=[("type", "pong")]), ClientConfig())
        == ClientConfig()
    )
    bad = Frame(method=Method.CONTROL, headers=[("type", "pong")], payload=b"{not json")
    assert pong_config(bad, ClientConfig()) == ClientConfig()


def test_parts_are_joined_in_seq_order_whatever_their_arrival() -> None:
    assembler = FragmentAssembler(1000)
    assert assembler.add(_data_frame("m", 2, 3, b"c")) is None
    assert assembler.add(_data_frame("m", 0, 3, b"a")) is None
    assert assembler.add(_data_frame("m", 1, 3, b"b")) == b"abc"
    assert assembler.add(_data_frame("single", payload=b"x")) == b"x"


def test_parts_are_bounded_in_size_count_and_time() -> None:
    now = [0.0]
    assembler = FragmentAssembler(10, clock=lambda: now[0])
    with pytest.raises(ProtocolError):
        assembler.add(_data_frame("big", 0, 2, b"x" * 11))
    with pytest.raises(ProtocolError):
        assembler.add(_data_frame("many", 0, MAX_PARTS + 1, b"x"))
    with pytest.raises(ProtocolError):
        assembler.add(_data_frame("seq", 3, 2, b"x"))
    assert assembler.add(_data_frame("late", 0, 2, b"a")) is None
    now[0] = PART_TTL_SECONDS + 1  # its other part never came in time: forgotten
    assert assembler.add(_data_frame("other", 0, 2, b"z")) is None
    assert assembler.add(_data_frame("late", 1, 2, b"b")) is None  # a fresh start, not "ab"

"""The long connection's wire format: protobuf ``pbbp2.Frame``, encoded and decoded by hand.

Both sides use it: our long-connection client (``feishu/ws.py``) and the sandbox's gateway
(``sandbox/ws_gateway.py``). lark-oapi ships the generated class (``lark_oapi.ws.pb.pbbp2_pb2.Frame``),
but importing anything under ``lark_oapi`` costs ~5 s and ~170 MB, and the message is small (proto2)::

    message Header { required string key = 1; required string value = 2; }
    message Frame {
      required uint64 SeqID = 1;  required uint64 LogID = 2;
      required int32 service = 3; required int32 method = 4;
      repeated Header headers = 5;
      optional string payload_encoding = 6; optional string payload_type = 7;
      optional bytes payload = 8;           optional string LogIDNew = 9;
    }

The four required fields are always written (the SDK's parser refuses a frame without them); unknown
fields are skipped when decoding. ``tests/test_sandbox_ws_gateway.py`` checks both directions against
the SDK's own class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_UINT64 = (1 << 64) - 1


class FrameError(ValueError):
    """Bytes that are not a well-formed ``Frame``."""


class Method(IntEnum):
    """``Frame.method``: control frames (ping/pong) and data frames (events, their answers)."""

    CONTROL = 0
    DATA = 1


@dataclass(slots=True)
class Frame:
    seq_id: int = 0
    log_id: int = 0
    service: int = 0
    method: int = Method.CONTROL
    headers: list[tuple[str, str]] = field(default_factory=list)
    payload_encoding: str | None = None
    payload_type: str | None = None
    payload: bytes | None = None
    log_id_new: str | None = None

    def header(self, key: str) -> str | None:
        """The first header named ``key``, if any."""
        return next((value for name, value in self.headers if name == key), None)


def encode_frame(frame: Frame) -> bytes:
    """The protobuf bytes of ``frame``."""
    out = bytearray()
    _varint_field(out, 1, frame.seq_id & _UINT64)
    _varint_field(out, 2, frame.log_id & _UINT64)
    _varint_field(out, 3, frame.service & _UINT64)  # int32: negatives as 10-byte two's complement
    _varint_field(out, 4, frame.method & _UINT64)
    for key, value in frame.headers:
        header = bytearray()
        _bytes_field(header, 1, key.encode("utf-8"))
        _bytes_field(header, 2, value.encode("utf-8"))
        _bytes_field(out, 5, bytes(header))
    for number, text in ((6, frame.payload_encoding), (7, frame.payload_type)):
        if text is not None:
            _bytes_field(out, number, text.encode("utf-8"))
    if frame.payload is not None:
        _bytes_field(out, 8, frame.payload)
    if frame.log_id_new is not None:
        _bytes_field(out, 9, frame.log_id_new.encode("utf-8"))
    return bytes(out)


def decode_frame(data: bytes) -> Frame:
    """Parse protobuf bytes into a ``Frame``; raises ``FrameError`` when they are malformed."""
    frame = Frame()
    seen: set[int] = set()
    for number, value in _fields(data):
        seen.add(number)
        _apply(frame, number, value)
    missing = {1, 2, 3, 4} - seen
    if missing:
        raise FrameError(f"frame lacks required field(s) {sorted(missing)}")
    return frame


def _apply(frame: Frame, number: int, value: int | bytes) -> None:
    if number in (1, 2, 3, 4):
        if not isinstance(value, int):
            raise FrameError(f"field {number} is not a varint")
        if number == 1:
            frame.seq_id = value
        elif number == 2:
            frame.log_id = value
        elif number == 3:
            frame.service = _int32(value)
        else:
            frame.method = _int32(value)
        return
    if number not in (5, 6, 7, 8, 9):
        return  # unknown field: skipped, as protobuf does
    if not isinstance(value, bytes):
        raise FrameError(f"field {number} is not length-delimited")
    if number == 5:
        frame.headers.append(_header(value))
    elif number == 8:
        frame.payload = value
    else:
        setattr(frame, {6: "payload_encoding", 7: "payload_type", 9: "log_id_new"}[number], _text(value))


def _header(data: bytes) -> tuple[str, str]:
    parts: dict[int, str] = {}
    for number, value in _fields(data):
        if number in (1, 2):
            if not isinstance(value, bytes):
                raise FrameError("header key/value is not a string")
            parts[number] = _text(value)
    if 1 not in parts or 2 not in parts:
        raise FrameError("header lacks its key or value")
    return parts[1], parts[2]


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs; varints as ints, length-delimited fields as bytes."""
    fields: list[tuple[int, int | bytes]] = []
    position = 0
    while position < len(data):
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise FrameError("field number 0")
        if wire_type == _VARINT:
            value, position = _read_varint(data, position)
            fields.append((number, value))
        elif wire_type == _LENGTH:
            length, position = _read_varint(data, position)
            if position + length > len(data):
                raise FrameError("length-delimited field runs past the end")
            fields.append((number, data[position : position + length]))
            position += length
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
            if position > len(data):
                raise FrameError("fixed-width field runs past the end")
        else:
            raise FrameError(f"unsupported wire type {wire_type}")
    return fields


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 70, 7):
        if position >= len(data):
            raise FrameError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _UINT64, position
    raise FrameError("varint longer than 10 bytes")


def _varint_field(out: bytearray, number: int, value: int) -> None:
    _write_varint(out, number << 3 | _VARINT)
    _write_varint(out, value)


def _bytes_field(out: bytearray, number: int, value: bytes) -> None:
    _write_varint(out, number << 3 | _LENGTH)
    _write_varint(out, len(value))
    out += value


def _write_varint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError("string field is not UTF-8") from exc

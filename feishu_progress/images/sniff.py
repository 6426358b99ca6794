"""Which image format some bytes are, from their magic bytes alone (never the name or Content-Type), and
how many pixels they claim, from the header alone (a small file can claim 40000×40000: a decompression
bomb for whoever renders it)."""

from __future__ import annotations

import struct

from feishu_progress.errors import ImageRefused

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_GIFS = (b"GIF87a", b"GIF89a")
MAX_IMAGE_SIDE = 12_000  # pixels per side; a card shows a thumbnail, nothing needs more
# JPEG markers that start a frame and carry its size (SOF0-SOF15 but DHT, JPG and DAC).
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})


def sniff_image_type(data: bytes) -> str | None:
    """The MIME type of ``data`` if it starts like a PNG, JPEG, GIF or WEBP file, else None."""
    if data.startswith(_PNG):
        return "image/png"
    if data.startswith(_JPEG):
        return "image/jpeg"
    if data.startswith(_GIFS):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_size(data: bytes, mime: str) -> tuple[int, int] | None:
    """(width, height) as the header of a ``mime`` image says, or None when the header does not say."""
    try:
        if mime == "image/png":
            return _png_size(data)
        if mime == "image/gif":
            return struct.unpack("<HH", data[6:10]) if len(data) >= 10 else None
        if mime == "image/webp":
            return _webp_size(data)
        return _jpeg_size(data)
    except struct.error:
        return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":  # extended: the canvas, 24-bit sizes minus one
        width = int.from_bytes(data[24:27], "little") + 1
        return width, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8L" and data[20:21] == b"\x2f":  # lossless: 14-bit sizes minus one, packed
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy: 14-bit sizes after the start code
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the segments up to the first frame header (bounded: each step moves forward)."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_STANDALONE:
            at += 2
            continue
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None


def require_image(data: bytes) -> str:
    """The MIME type of ``data``; raises ImageRefused: "not_an_image" for anything else,
    "too_many_pixels" when its header claims more than ``MAX_IMAGE_SIDE`` on a side.

    A header too short to say its size passes: we never decode the pixels, and Feishu refuses a broken
    image itself; a header that does say is believed (it is what a decoder would allocate for).
    """
    mime = sniff_image_type(data)
    if mime is None:
        raise ImageRefused("not_an_image")
    size = image_size(data, mime)
    if size is not None and max(size) > MAX_IMAGE_SIDE:
        raise ImageRefused("too_many_pixels")
    return mime

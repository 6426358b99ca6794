"""Image type sniffing: only the magic bytes of PNG, JPEG, GIF and WEBP pass."""

from __future__ import annotations

import struct
import zlib

import pytest

from feishu_progress.errors import ImageRefused
from feishu_progress.images import require_image, sniff_image_type
from feishu_progress.images.sniff import MAX_IMAGE_SIDE, image_size


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg"),
        (b"\xff\xd8\xff\xdb", "image/jpeg"),
        (b"GIF87a\x01\x00", "image/gif"),
        (b"GIF89a\x01\x00", "image/gif"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp"),
    ],
)
def test_known_formats_are_recognised(data: bytes, mime: str) -> None:
    assert sniff_image_type(data) == mime
    assert require_image(data) == mime


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x89PNG\r\n",  # a truncated signature
        b"\x89PNX\r\n\x1a\n",
        b"\xff\xd8",
        b"GIF88a",
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # RIFF, but audio
        b"RIFF\x24\x00\x00\x00WEB",
        b"FP_FEISHU__APP_SECRET=s3cret\n",  # a .env file
        b"root:$6$salt$hash:19000:0:99999:7:::\n",  # /etc/shadow
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",  # SVG can carry script: not accepted
        b"\x1f\x8b\x08\x00",  # gzip
    ],
)
def test_anything_else_is_refused(data: bytes) -> None:
    assert sniff_image_type(data) is None
    with pytest.raises(ImageRefused) as refused:
        require_image(data)
    assert refused.value.reason == "not_an_image"


# -- issue 26 item 11: pixel dimensions, read from the header ------------------------------------------


def png(width: int, height: int) -> bytes:
    """A real PNG (one grey pixel row repeated is not needed: the header is what is read)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return PNG_SIGNATURE + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def webp(kind: bytes, width: int, height: int) -> bytes:
    if kind == b"VP8X":
        body = b"\x00" * 4 + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    elif kind == b"VP8L":
        body = b"\x2f" + ((width - 1) | (height - 1) << 14).to_bytes(4, "little")
    else:
        body = b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", width, height)
    return (
        b"RIFF" + struct.pack("<I", 4 + 8 + len(body)) + b"WEBP" + kind + struct.pack("<I", len(body)) + body
    )


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAKERS = {
    "png": png,
    "jpeg": jpeg,
    "gif": gif,
    "webp-vp8x": lambda w, h: webp(b"VP8X", w, h),
    "webp-vp8l": lambda w, h: webp(b"VP8L", w, h),
    "webp-vp8": lambda w, h: webp(b"VP8 ", w, h),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_the_header_tells_the_size_and_past_the_cap_is_refused(kind: str) -> None:
    make = MAKERS[kind]
    small = make(640, 480)
    mime = sniff_image_type(small)
    assert mime is not None
    assert image_size(small, mime) == (640, 480)
    assert require_image(small) == mime
    side = 16_000 if kind.startswith("webp-vp8") and kind != "webp-vp8x" else 40_000  # VP8/VP8L: 14 bits
    huge = make(side, 100)
    assert image_size(huge, mime) == (side, 100)
    with pytest.raises(ImageRefused) as refused:
        require_image(huge)
    assert refused.value.reason == "too_many_pixels"
    assert require_image(make(MAX_IMAGE_SIDE, MAX_IMAGE_SIDE)) == mime

"""Image type sniffing: only the magic bytes of PNG, JPEG, GIF and WEBP pass."""

from __future__ import annotations

import pytest

from feishu_progress.errors import ImageRefused
from feishu_progress.images import require_image, sniff_image_type


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

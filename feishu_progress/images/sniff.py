"""Which image format some bytes are, from their magic bytes alone (never the name or Content-Type)."""

from __future__ import annotations

from feishu_progress.errors import ImageRefused

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_GIFS = (b"GIF87a", b"GIF89a")


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


def require_image(data: bytes) -> str:
    """The MIME type of ``data``; raises ImageRefused("not_an_image") for anything else."""
    mime = sniff_image_type(data)
    if mime is None:
        raise ImageRefused("not_an_image")
    return mime

"""Uploads the images a tool produced so the card's image grid can show them.

A Feishu card cannot show an image by URL, only by an uploaded ``image_key``. When a generate_image or
edit_image call finishes, its files are read and uploaded in the background (at most the 9 the card
shows); the card updates when the keys arrive. An image that cannot be read or uploaded simply gets no
key, and the card shows 图片不可达 with its path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from feishu_progress.background import BackgroundTasks
from feishu_progress.domain import ToolCall
from feishu_progress.ports import ImageUploader
from feishu_progress.tools.view_parsers import parse_image_gen

log = logging.getLogger(__name__)

MAX_IMAGES = 9
MAX_IMAGE_BYTES = 10 * 1024 * 1024  # Feishu refuses larger uploads (234006)


class ImageKeys:
    def __init__(self, uploader: ImageUploader | None, background: BackgroundTasks) -> None:
        self.uploader = uploader
        self.background = background

    def collect(self, call: ToolCall, ready: Callable[[dict[str, str]], None]) -> None:
        """Start uploading ``call``'s images, if it produced any; ``ready`` gets {path or url: image_key}."""
        if self.uploader is None or call.name not in ("generate_image", "edit_image") or not call.finished:
            return
        view = parse_image_gen(call.result)
        if view is None:
            return
        sources = [item.path or item.url for item in view.items[:MAX_IMAGES]]
        paths = [source for source in sources if source and not source.startswith(("http://", "https://"))]
        if paths:
            self.background.spawn(self._upload_all(paths, ready), name=f"images-{call.call_id}")

    async def _upload_all(self, paths: list[str], ready: Callable[[dict[str, str]], None]) -> None:
        keys: dict[str, str] = {}
        for path in paths:
            key = await self._upload_one(path)
            if key is not None:
                keys[path] = key
        if keys:
            ready(keys)

    async def _upload_one(self, path: str) -> str | None:
        assert self.uploader is not None
        try:
            data = await asyncio.to_thread(_read_image, path)
            return await self.uploader.upload_image(data)
        except Exception as exc:  # the card shows 图片不可达 instead
            log.warning("image %s could not be uploaded: %s", path, type(exc).__name__)
            return None


def _read_image(path: str) -> bytes:
    file = Path(path)
    size = file.stat().st_size
    if size == 0 or size > MAX_IMAGE_BYTES:
        raise ValueError(f"image size {size} outside 1..{MAX_IMAGE_BYTES}")
    return file.read_bytes()

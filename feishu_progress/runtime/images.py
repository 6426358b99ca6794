"""Uploads the images a tool produced so the card's image grid can show them.

A Feishu card cannot show an image by URL, only by an uploaded ``image_key``. When a generate_image or
edit_image call finishes, each image it names is loaded and uploaded in the background; the card
updates when the keys arrive. An item's sources are tried in order: its ``image_path`` (only beneath
FP_IMAGES__ROOT), then its http(s) ``image_url`` (SSRF-guarded; fetched under one of the fetcher's own
slots, shared fairly between tasks, then uploaded under an upload slot). ``fpimg:<ref>`` sources were handed
over through the runtime API and are resolved there, not here. Each source is tried at most once per
task, at most ``max_per_call`` items per call and ``max_per_task`` per task are loaded; an image that
cannot be loaded or uploaded simply gets no key, and its path or URL never reaches a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from feishu_progress.background import BackgroundTasks
from feishu_progress.config import ImagesSettings
from feishu_progress.domain import ToolCall
from feishu_progress.errors import ImageRefused
from feishu_progress.images import ImageClient, ImageFetcher, ImageUploads, LocalImages
from feishu_progress.images.uploads import UploadBudget
from feishu_progress.tools.specs import IMAGE_TOOLS
from feishu_progress.tools.view_models import ImageItem
from feishu_progress.tools.view_parsers import parse_image_gen

log = logging.getLogger(__name__)

HANDED_OVER_PREFIX = "fpimg:"  # a reference from POST /v1/tasks/{id}/images
MAX_IMAGES = 9  # the card's grid shows at most 9 per call


@dataclass(frozen=True, slots=True)
class ImageSource:
    kind: Literal["path", "url"]
    text: str  # the image_path / image_url exactly as the result names it: the card looks keys up by it


@dataclass
class _TaskImages:
    """What one task has already spent: the sources tried and the number of images loaded."""

    tried: set[str] = field(default_factory=set)
    images: int = 0


def sources_of(item: ImageItem) -> list[ImageSource]:
    """The sources to try for one image, in order; handed-over ``fpimg:`` references are not ours to load."""
    sources = []
    if item.path and not item.path.startswith(HANDED_OVER_PREFIX):
        sources.append(ImageSource("path", item.path))
    # Only http(s) can be fetched; a relative "/uploads/cat.png" or "oss://..." names nothing we can reach.
    if item.url and item.url[:8].lower().startswith(("http://", "https://")):
        sources.append(ImageSource("url", item.url))
    return sources


class ImageKeys:
    """Turns the images of finished image tool calls into Feishu image_keys, within per-task limits."""

    def __init__(
        self,
        uploads: ImageUploads | None,
        background: BackgroundTasks,
        *,
        local: LocalImages | None = None,
        fetcher: ImageFetcher | None = None,
        max_per_call: int = MAX_IMAGES,
        max_per_task: int = 50,
    ) -> None:
        self.uploads = uploads
        self.background = background
        self.local = local or LocalImages(None)
        self.fetcher = fetcher
        self.max_per_call = max_per_call
        self.max_per_task = max_per_task
        self._tasks: dict[int, _TaskImages] = {}

    @classmethod
    def from_settings(
        cls,
        settings: ImagesSettings,
        client: ImageClient,
        background: BackgroundTasks,
        fetcher: ImageFetcher | None,
        budget: UploadBudget | None = None,
    ) -> ImageKeys:
        """The production wiring: one upload gate over ``client``, the root and the limits of ``settings``."""
        return cls(
            ImageUploads(client, concurrency=settings.concurrency, budget=budget),
            background,
            local=LocalImages(settings.root, max_bytes=settings.max_bytes),
            fetcher=fetcher,
            max_per_call=settings.max_per_call,
            max_per_task=settings.max_per_task,
        )

    def collect(
        self,
        call: ToolCall,
        ready: Callable[[dict[str, str]], Awaitable[None]],
        task_id: int | None = None,
        *,
        settled: Callable[[], Awaitable[None]] | None = None,
    ) -> frozenset[str]:
        """Start uploading ``call``'s images; ``ready`` gets {image_path or image_url: image_key}.

        Returns the refs (paths and URLs) now being tried, so the card can say those images are on their
        way; ``settled`` is called once every one of them has a key or has failed (``ready`` first).
        ``task_id`` scopes "each source once" and the per-task cap; without it both apply to this call only.
        """
        if self.uploads is None or call.name not in IMAGE_TOOLS or not call.finished:
            return frozenset()
        view = parse_image_gen(call.result)
        if view is None:
            return frozenset()
        spent = self._tasks.setdefault(task_id, _TaskImages()) if task_id is not None else _TaskImages()
        plans = self._plan(view.items[: self.max_per_call], spent, task_id)
        if not plans:
            return frozenset()
        context = {"session_id": task_id, "call_id": call.call_id}
        owner = task_id if task_id is not None else call.call_id  # whose share of the fetch slots
        work = self._upload_all(plans, ready, _Context(owner, context), settled)
        self.background.spawn(work, name=f"images-{call.call_id}")
        return frozenset(source.text for sources in plans for source in sources)

    def _plan(
        self, items: tuple[ImageItem, ...], spent: _TaskImages, task_id: int | None
    ) -> list[list[ImageSource]]:
        # Decided synchronously, in the result's order, so the cap and "once" never depend on timing.
        plans = []
        for item in items:
            sources = [source for source in sources_of(item) if source.text not in spent.tried]
            if not sources:
                continue
            if spent.images >= self.max_per_task:
                log.warning(
                    "image cap of %d per task reached", self.max_per_task, extra={"session_id": task_id}
                )
                break
            spent.images += 1
            spent.tried.update(source.text for source in sources)
            plans.append(sources)
        return plans

    async def _upload_all(
        self,
        plans: list[list[ImageSource]],
        ready: Callable[[dict[str, str]], Awaitable[None]],
        context: _Context,
        settled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        try:
            # Concurrent per image: the uploads' semaphore, not this loop, bounds what is in memory.
            found = await asyncio.gather(*(self._first_key(sources, context) for sources in plans))
            keys = dict(pair for pair in found if pair is not None)
            if keys:
                await ready(keys)
        finally:  # cancelled or not: no image stays "on its way" forever
            if settled is not None:
                await settled()

    async def _first_key(self, sources: list[ImageSource], context: _Context) -> tuple[str, str] | None:
        for source in sources:
            image_key = await self._key_for(source, context)
            if image_key is not None:
                return source.text, image_key
        return None

    async def _key_for(self, source: ImageSource, context: _Context) -> str | None:
        assert self.uploads is not None
        try:
            if source.kind == "path":
                return await self.uploads.upload_from(partial(self.local.read, source.text))
            return await self._fetched_key(source.text, context.owner)
        except Exception as exc:  # the card shows 图片不可达 instead
            # Only the kind of failure: the path or URL would tell a log reader what exists where.
            reason = exc.reason if isinstance(exc, ImageRefused) else type(exc).__name__
            log.warning(
                "image %s not used: %s",
                source.kind,
                reason,
                extra={**context.log, "image_source": source.kind, "reason": reason},
            )
            return None

    async def _fetched_key(self, url: str, owner: Hashable) -> str:
        """Fetch under a fetch slot (the task's fair share), then upload under an upload slot.

        The fetch slot is held until an upload slot takes the body over, so the bodies in memory stay
        bounded by the two gates; a slow server holds only a fetch slot, never one a local image needs.
        """
        assert self.uploads is not None
        if self.fetcher is None:
            raise ImageRefused("fetch_disabled")
        async with self.fetcher.slots.hold(owner) as slot:
            data = await self.fetcher.fetch(url)

            async def handed_over() -> bytes:
                slot.release()
                return data

            return await self.uploads.upload_from(handed_over)


@dataclass(frozen=True, slots=True)
class _Context:
    owner: Hashable  # the task (or, without one, the call) whose fair share of fetch slots is used
    log: Mapping[str, object]

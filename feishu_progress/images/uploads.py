"""Image uploads to Feishu with bounded memory: one gate, one upload per content, a cache of keys.

500 tool results naming 9 copies of a 10 MB file once held 5.3 GiB. Now a semaphore covers reading
(or fetching) a body *and* uploading it, so at most ``concurrency`` bodies are alive at once; identical
content is uploaded once, whether it arrives later (an LRU cache of sha256 -> image_key) or at the same
moment (single-flight: the second caller drops its copy and waits for the first upload's key).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Protocol

from feishu_progress.bounded import BoundedCache
from feishu_progress.errors import FeishuProgressError, UploadsBusy
from feishu_progress.images.sniff import require_image
from feishu_progress.shared_result import fail_all, shared_future, wait_shared

# sha256 -> image_key, a few hundred bytes an entry: 1024 keys stay under 0.5 MB and cover every image
# of the last ~110 calls at the card's 9 a call, so a result repeated across rounds or tasks is found.
IMAGE_KEY_CACHE_ENTRIES = 1024
DEFAULT_CONCURRENCY = 4

Load = Callable[[], Awaitable[bytes]]
Check = Callable[[bytes], None]  # raises to refuse the bytes before they are uploaded


class ImageClient(Protocol):
    """The part of FeishuClient the uploads need."""

    async def upload_image(self, data: bytes) -> str: ...


class UploadBudget(Protocol):
    """The image upload API's app budget (the app's ``Admission``): waits for room."""

    def admit(self, api: str) -> AbstractAsyncContextManager[None]: ...


class UploadAbandoned(FeishuProgressError):
    """The upload another caller was waiting for was cancelled before it finished."""


class ImageUploads:
    """ports.ImageUploader (and ``upload_from`` for bodies not read yet) over an ImageClient."""

    def __init__(
        self,
        client: ImageClient,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_entries: int = IMAGE_KEY_CACHE_ENTRIES,
        budget: UploadBudget | None = None,
    ) -> None:
        self._client = client
        self._budget = budget  # every upload within the image API's budget (FP_RATE__API__IMAGE__*)
        self._slots = asyncio.Semaphore(concurrency)
        self._keys: BoundedCache[str, str] = BoundedCache(max_entries)  # least recently used leaves first
        self._flights: dict[str, asyncio.Future[str]] = {}

    async def upload_image(self, data: bytes) -> str:
        """The image_key for ``data`` (already in memory), uploading only content not uploaded before."""

        async def given() -> bytes:
            return data

        return await self.upload_from(given)

    async def upload_from(
        self, load: Load, *, max_wait: float | None = None, check: Check | None = None
    ) -> str:
        """Load a body and upload it, holding one of the ``concurrency`` slots for both.

        ``max_wait``: give up (UploadsBusy) when no slot frees within it, before ``load`` reads a byte —
        a request body waiting for a slot stays in the socket, not in memory. ``check`` runs on the
        loaded bytes before any upload (the task's image cap and status: refused images cost Feishu
        nothing).
        """
        try:
            async with asyncio.timeout(max_wait):
                await self._slots.acquire()
        except TimeoutError:
            raise UploadsBusy(f"no upload slot within {max_wait} s") from None
        try:
            outcome = await self._load_and_upload(load, check)
        finally:
            self._slots.release()
        if isinstance(outcome, str):
            return outcome
        return await wait_shared(outcome)

    async def _load_and_upload(self, load: Load, check: Check | None) -> str | asyncio.Future[str]:
        """The key, or the flight of the same bytes' upload to wait for once the slot is given back."""
        data = await load()
        require_image(data)
        if check is not None:
            check(data)
        # On the loop (~18 ms for 10 MB, under one slot): no await between hashing and the lookup,
        # so a second caller with the same bytes always finds the first one's flight or key.
        digest = hashlib.sha256(data).hexdigest()
        cached = self._keys.get(digest)
        if cached is not None:
            return cached
        flight = self._flights.get(digest)
        if flight is None:
            return await self._upload_once(digest, data)
        return flight  # the leader holds the body; waiting for its key needs no slot and no copy

    async def _upload_once(self, digest: str, data: bytes) -> str:
        flight: asyncio.Future[str] = shared_future()
        self._flights[digest] = flight
        try:
            async with nullcontext() if self._budget is None else self._budget.admit("image"):
                image_key = await self._client.upload_image(data)
        except BaseException as exc:
            fail_all([flight], exc if isinstance(exc, Exception) else UploadAbandoned())
            raise
        finally:
            del self._flights[digest]
        self._keys.put(digest, image_key)
        flight.set_result(image_key)
        return image_key

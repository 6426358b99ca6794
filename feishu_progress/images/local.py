"""Local image files, read only beneath FP_IMAGES__ROOT.

A tool result names an ``image_path``; before this module existed any readable file (``/etc/shadow``,
the service's own ``.env``) could be uploaded to Feishu. Now a path is taken relative to the root (an
absolute one must already lie beneath it), resolved with every symlink followed, and refused unless the
result is still beneath the root's own real path. The file is then opened component by component from
the root with ``O_NOFOLLOW``, so a directory swapped for a symlink between the check and the open is
refused too, and with ``O_NONBLOCK`` so a FIFO can never park a worker thread. Without a root, every
local path is refused.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from feishu_progress.config import MAX_IMAGE_BYTES
from feishu_progress.errors import ImageRefused
from feishu_progress.images.sniff import require_image

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LocalImages:
    """Reads image files beneath one root directory; everything else is ImageRefused."""

    def __init__(self, root: Path | None, *, max_bytes: int = MAX_IMAGE_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes

    async def read(self, path: str) -> bytes:
        """The image at ``path`` (relative to the root, or absolute beneath it), read off the event loop."""
        if self.root is None:
            raise ImageRefused("no_root")
        return await asyncio.to_thread(self._read, self.root, path)

    def _read(self, root: Path, path: str) -> bytes:
        real_root = os.path.realpath(root)
        fd = open_beneath(real_root, parts_beneath(real_root, path))
        try:
            data = read_regular(fd, self.max_bytes)
        finally:
            os.close(fd)
        require_image(data)
        return data


def parts_beneath(real_root: str, path: str) -> list[str]:
    """The components of ``path``'s real location below ``real_root``; refused if it resolves elsewhere."""
    if not path or "\x00" in path:
        raise ImageRefused("bad_path")
    # os.path.join drops the root for an absolute path, which must then resolve beneath it by itself.
    real = os.path.realpath(os.path.join(real_root, path))
    relative = os.path.relpath(real, real_root)
    if relative in (os.curdir, os.pardir) or relative.startswith(os.pardir + os.sep):
        raise ImageRefused("outside_root")
    return relative.split(os.sep)


def open_beneath(real_root: str, parts: list[str]) -> int:
    """Open ``parts`` below ``real_root`` without following any symlink; the fd of a regular file."""
    try:
        dir_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageRefused("no_root") from exc
    try:
        for name in parts[:-1]:
            parent, dir_fd = dir_fd, -1
            try:
                dir_fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            finally:
                os.close(parent)
        # Look before opening: opening a device can have side effects, a FIFO would wait for a writer.
        if not stat.S_ISREG(os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise ImageRefused("not_a_file")
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise ImageRefused("not_found") from exc
    except OSError as exc:  # ELOOP: a component became a symlink; EACCES; ENOTDIR...
        raise ImageRefused("unreadable") from exc
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)


def read_regular(fd: int, max_bytes: int) -> bytes:
    """The content of the regular file ``fd``, 1..``max_bytes`` bytes."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # swapped after the look in open_beneath
        raise ImageRefused("not_a_file")
    if info.st_size == 0:
        raise ImageRefused("empty")
    if info.st_size > max_bytes:
        raise ImageRefused("too_large")
    return read_bounded(fd, max_bytes)


def read_bounded(fd: int, max_bytes: int) -> bytes:
    """Read ``fd`` to its end, refusing more than ``max_bytes`` (the file may have grown since fstat)."""
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        chunk = os.read(fd, max_bytes + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > max_bytes:
        raise ImageRefused("too_large")
    if total == 0:
        raise ImageRefused("empty")
    # One chunk is the usual case for a regular file; join then returns it without a copy.
    return b"".join(chunks)

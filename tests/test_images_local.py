"""Local image files: only regular image files beneath FP_IMAGES__ROOT, on real files and symlinks."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from feishu_progress.errors import ImageRefused
from feishu_progress.images import LocalImages
from feishu_progress.images.local import open_beneath, parts_beneath, read_bounded

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 10
FIFO_GUARD_SECONDS = 5.0  # a regression would park the read forever; fail instead of hanging the suite


@pytest.fixture
def root(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    (images / "cat.png").write_bytes(PNG)
    (images / "sub" / "dog.png").write_bytes(PNG + b"dog")
    return images


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """An image-looking secret next to the root, not beneath it."""
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG + b"secret")
    return secret


async def refused(images: LocalImages, path: str) -> str:
    with pytest.raises(ImageRefused) as caught:
        await asyncio.wait_for(images.read(path), FIFO_GUARD_SECONDS)
    assert not path or path not in str(caught.value)  # the error never names the path
    return caught.value.reason


async def test_relative_and_absolute_paths_beneath_the_root_are_read(root: Path) -> None:
    images = LocalImages(root)
    assert await images.read("cat.png") == PNG
    assert await images.read("sub/dog.png") == PNG + b"dog"
    assert await images.read(str(root / "sub" / "dog.png")) == PNG + b"dog"
    assert await images.read("sub/../cat.png") == PNG  # ".." that stays inside is fine


async def test_without_a_root_every_path_is_refused(root: Path) -> None:
    assert await refused(LocalImages(None), str(root / "cat.png")) == "no_root"
    assert await refused(LocalImages(None), "cat.png") == "no_root"


async def test_paths_leaving_the_root_are_refused(root: Path, outside: Path) -> None:
    images = LocalImages(root)
    assert await refused(images, str(outside)) == "outside_root"
    assert await refused(images, "../secret.png") == "outside_root"
    assert await refused(images, "sub/../../secret.png") == "outside_root"
    assert await refused(images, "/etc/passwd") == "outside_root"
    assert await refused(images, ".") == "outside_root"
    assert await refused(images, str(root)) == "outside_root"


async def test_relative_paths_are_relative_to_the_root_not_the_working_directory(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The issue: ".env" named the service's own secrets file in its working directory.
    workdir = tmp_path / "service"
    workdir.mkdir()
    (workdir / "env.png").write_bytes(PNG + b"FP_FEISHU__APP_SECRET=s3cret")
    monkeypatch.chdir(workdir)
    assert await refused(LocalImages(root), "env.png") == "not_found"


async def test_symlinks_out_of_the_root_are_refused(root: Path, outside: Path) -> None:
    (root / "link.png").symlink_to(outside)
    (root / "linkdir").symlink_to(outside.parent)
    (root / "relative.png").symlink_to(Path("..") / outside.name)
    images = LocalImages(root)
    assert await refused(images, "link.png") == "outside_root"
    assert await refused(images, "linkdir/secret.png") == "outside_root"
    assert await refused(images, "relative.png") == "outside_root"


async def test_symlinks_inside_the_root_are_followed(root: Path) -> None:
    (root / "alias.png").symlink_to(root / "sub" / "dog.png")
    (root / "subalias").symlink_to("sub")
    images = LocalImages(root)
    assert await images.read("alias.png") == PNG + b"dog"
    assert await images.read("subalias/dog.png") == PNG + b"dog"


async def test_a_root_that_is_itself_a_symlink_works(root: Path, tmp_path: Path) -> None:
    linked_root = tmp_path / "linked-root"
    linked_root.symlink_to(root)
    images = LocalImages(linked_root)
    assert await images.read("cat.png") == PNG
    assert await images.read(str(linked_root / "cat.png")) == PNG
    assert await images.read(str(root / "cat.png")) == PNG


async def test_a_fifo_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "pipe.png")
    assert await refused(LocalImages(root), "pipe.png") == "not_a_file"


async def test_directories_and_sockets_are_refused(root: Path) -> None:
    images = LocalImages(root)
    assert await refused(images, "sub") == "not_a_file"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(root / "sock.png"))
        assert await refused(images, "sock.png") == "not_a_file"


async def test_empty_oversized_and_non_image_files_are_refused(root: Path) -> None:
    (root / "empty.png").write_bytes(b"")
    (root / "big.png").write_bytes(PNG + b"x" * 100)
    (root / "text.png").write_bytes(b"FP_FEISHU__APP_SECRET=s3cret\n")
    images = LocalImages(root, max_bytes=len(PNG) + 50)
    assert await refused(images, "empty.png") == "empty"
    assert await refused(images, "big.png") == "too_large"
    assert await refused(images, "text.png") == "not_an_image"
    assert await refused(images, "missing.png") == "not_found"
    assert await images.read("cat.png") == PNG  # exactly at the limit is fine


async def test_a_bad_path_is_refused(root: Path) -> None:
    images = LocalImages(root)
    assert await refused(images, "cat\x00.png") == "bad_path"
    assert await refused(images, "") == "bad_path"


async def test_a_missing_root_refuses(tmp_path: Path) -> None:
    assert await refused(LocalImages(tmp_path / "nowhere"), "cat.png") == "no_root"


def test_the_bytes_read_are_capped_even_if_the_file_grew_after_the_size_check(root: Path) -> None:
    # read_regular checks st_size first; read_bounded is the second check, on what is actually read.
    fd = os.open(root / "cat.png", os.O_RDONLY)
    try:
        with pytest.raises(ImageRefused) as caught:
            read_bounded(fd, len(PNG) - 1)
    finally:
        os.close(fd)
    assert caught.value.reason == "too_large"


@pytest.fixture
def swapped(root: Path, outside: Path) -> Iterator[list[str]]:
    """The components of sub/dog.png, checked; then "sub" is swapped for a symlink out of the root."""
    parts = parts_beneath(os.path.realpath(root), "sub/dog.png")
    (root / "sub").rename(root / "old-sub")
    (outside.parent / "dog.png").write_bytes(PNG + b"outside dog")
    (root / "sub").symlink_to(outside.parent)
    yield parts


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    root: Path, swapped: list[str]
) -> None:
    with pytest.raises(ImageRefused) as caught:
        open_beneath(os.path.realpath(root), swapped)
    assert caught.value.reason == "unreadable"

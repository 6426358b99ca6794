"""``feishu-progress serve`` in sandbox mode, as a user runs it, for the agent adapters' tests.

One process per test module (starting it takes seconds on a shared machine): a free port, a temporary
working directory, an API token, no other FP_ setting. Tests create their own tasks on it and click
through the sandbox preview's signed-click endpoint (``feishu_progress.adapters.sandbox_user``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from feishu_progress.cards.plaintext import card_as_text
from tests.service_process import free_port

REPO = Path(__file__).resolve().parent.parent
TOKEN = "adapter-token"
CHAT = "oc_adapter_chat"
REQUESTER = "ou_adapter_user"
START_SECONDS = 60


@dataclass(frozen=True)
class SandboxService:
    url: str
    token: str


def _env(**settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("FP_", "FEISHU_PROGRESS_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(settings)
    return env


def _until_serving(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v1/openapi.json", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"serve did not answer within {START_SECONDS} s")


@pytest.fixture(scope="module")
def sandbox_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxService]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workdir = tmp_path_factory.mktemp("serve")
    env = _env(FP_HTTP__HOST="127.0.0.1", FP_HTTP__PORT=str(port), FP_ADMIN__PORT="0",
               FP_LOG_LEVEL="WARNING", FP_API__TOKEN=TOKEN)  # fmt: skip
    errors = (workdir / "stderr.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "feishu_progress", "serve"],
        env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=errors,
    )  # fmt: skip
    try:
        _until_serving(process, url)
        yield SandboxService(url, TOKEN)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        errors.close()
    logged = (workdir / "stderr.log").read_text(errors="replace")
    assert "Traceback" not in logged, logged[-3000:]


def text_of(card: dict[str, object]) -> str:
    return card_as_text(card)


def state_of(card: dict[str, object]) -> str:
    header = card.get("header")
    assert isinstance(header, dict)
    return str(header["text_tag_list"][0]["text"]["content"])

"""The service as a user runs it — a subprocess — over HTTP, against the sandbox and MariaDB.

``Harness`` starts ``python -m feishu_progress serve`` with its settings in the environment, waits until
``/readyz`` answers, and plays runtime (tasks, events, actions) and user (signed clicks) against it.
Used by the end-to-end and the fault tests; every process it starts is stopped by ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox
from tests.rigs import API_TOKEN, APP_ID, APP_SECRET, ENCRYPT_KEY, VERIFICATION_TOKEN, answers_200, eventually

REQUESTER, CHAT = "ou_requester", "oc_e2e"
STDERR_LINES_KEPT = 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Service:
    process: asyncio.subprocess.Process
    base_url: str
    admin_url: str
    # The last lines the service wrote to stderr: read all along, so a chatty service never blocks on a
    # full pipe, and kept for the failure message of a test.
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES_KEPT))
    drain: asyncio.Task[None] | None = None

    def stderr(self) -> str:
        return "".join(self.stderr_tail)

    async def read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        while line := await stream.readline():
            self.stderr_tail.append(line.decode(errors="replace"))


class Harness:
    """Starts the service process, and plays runtime and user against it."""

    def __init__(self, database_url: str, sandbox: RunningSandbox, http: aiohttp.ClientSession) -> None:
        self.database_url = database_url
        self.sandbox = sandbox
        self.http = http
        self.started: list[Service] = []
        self.port = free_port()
        self.admin_port = free_port()

    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
        env.update(
            FP_DATABASE_URL=self.database_url,
            FP_FEISHU__BASE_URL=self.sandbox.base_url,
            FP_FEISHU__APP_ID=APP_ID,
            FP_FEISHU__APP_SECRET=APP_SECRET,
            FP_FEISHU__ENCRYPT_KEY=ENCRYPT_KEY,
            FP_FEISHU__VERIFICATION_TOKEN=VERIFICATION_TOKEN,
            FP_API__TOKEN=API_TOKEN,
            FP_HTTP__HOST="127.0.0.1",
            FP_HTTP__PORT=str(self.port),
            FP_ADMIN__PORT=str(self.admin_port),
            FP_LOG_LEVEL="WARNING",
        )
        env.update(extra)
        return env

    async def migrate(self) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "feishu_progress",
            "migrate",
            env=self.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, output.decode()

    async def start(self, **extra: str) -> Service:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "feishu_progress",
            "serve",
            env=self.env(**extra),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        service = Service(process, f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.admin_port}")
        self.started.append(service)
        service.drain = asyncio.create_task(service.read_stderr())
        try:
            await eventually(
                lambda: self._ready(service), timeout=30, interval=0.1, what="the service to be ready"
            )
        except AssertionError as failed:
            if process.returncode is not None:
                raise  # it exited: _ready said so, with its output
            await self.stop(service, signal.SIGKILL)
            raise AssertionError(f"{failed}: {service.stderr()[-2000:]}") from None
        return service

    async def _ready(self, service: Service) -> bool:
        """Whether ``/readyz`` answers 200; fails at once when the process has exited."""
        if service.process.returncode is not None:
            assert service.drain is not None
            await service.drain
            raise AssertionError(f"service exited {service.process.returncode}: {service.stderr()[-2000:]}")
        return await answers_200(self.http, f"{service.admin_url}/readyz")

    async def stop_all(self) -> None:
        """Kill every service this harness started that is still running (a failed test's leftovers)."""
        for service in self.started:
            await self.stop(service, signal.SIGKILL)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_TOKEN}"}

    async def create_task(self, service: Service, title: str) -> tuple[int, str]:
        body = {
            "receive_id": CHAT,
            "receive_id_type": "chat_id",
            "requester_open_id": REQUESTER,
            "title": title,
        }
        async with self.http.post(
            f"{service.base_url}/v1/tasks", json=body, headers=self.headers()
        ) as response:
            assert response.status == 201, await response.text()
            data = await response.json()
        return data["session_id"], data["message_id"]

    async def events(self, service: Service, session_id: int, *events: Mapping[str, Any]) -> int:
        url = f"{service.base_url}/v1/tasks/{session_id}/events"
        async with self.http.post(url, json={"events": list(events)}, headers=self.headers()) as response:
            return response.status

    async def click(
        self,
        service: Service,
        message_id: str,
        operator: str,
        value: Mapping[str, Any],
        *,
        form: Mapping[str, Any] | None = None,
        click_token: str | None = None,
    ) -> dict[str, Any]:
        payload = card_action_payload(
            open_id=operator,
            message_id=message_id,
            chat_id=CHAT,
            value=value,
            form_value=form,
            verification_token=VERIFICATION_TOKEN,
            now=time.time(),
            click_token=click_token,
        )
        body, headers = signed_request(payload, encrypt_key=ENCRYPT_KEY, now=time.time())
        async with self.http.post(
            f"{service.base_url}/feishu/callback", data=body, headers=headers
        ) as response:
            assert response.status == 200, await response.text()
            reply: dict[str, Any] = await response.json()
            return reply

    async def actions(
        self, service: Service, session_id: int, after: int = 0, wait: float = 5
    ) -> dict[str, Any]:
        url = f"{service.base_url}/v1/tasks/{session_id}/actions"
        params = {"after": str(after), "wait": str(wait)}
        async with self.http.get(url, params=params, headers=self.headers()) as response:
            assert response.status == 200
            data: dict[str, Any] = await response.json()
            return data

    async def card_status(self, message_id: str, expected: str, timeout: float = 10) -> dict[str, Any]:
        """Wait until the sandbox's latest card for ``message_id`` carries the state word ``expected``."""
        card: dict[str, Any] = await eventually(
            lambda: self.sandbox.state.messages[message_id].card,
            until=lambda card: state_word(card) == expected,
            timeout=timeout,
            what=f"the card's state to be {expected!r}",
        )
        return card

    @staticmethod
    async def stop(service: Service, sig: int = signal.SIGTERM) -> int:
        if service.process.returncode is None:
            service.process.send_signal(sig)
        try:
            return await asyncio.wait_for(service.process.wait(), 40)
        finally:
            if service.process.returncode is None:
                service.process.kill()  # SIGTERM did not end it in time: never leave it behind
                await service.process.wait()
            if service.drain is not None:
                with contextlib.suppress(Exception):
                    await service.drain


def state_word(card: Mapping[str, Any]) -> str:
    tags = card.get("header", {}).get("text_tag_list", [])
    return str(tags[0]["text"]["content"]) if tags else ""


def card_text(card: Mapping[str, Any]) -> str:
    from feishu_progress.cards.plaintext import card_as_text

    return card_as_text(card)

"""A redis-server of one test alone, on a free port, always stopped (shared by the cluster tests)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass
class OwnRedis:
    """A redis-server of this test alone, on a free port; ``close`` always kills it."""

    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._wait_until_ready(self.process)

    @staticmethod
    def _wait_until_ready(process: subprocess.Popen[bytes]) -> None:
        """Read the server's log until it says it accepts connections (no polling, no sleeping)."""
        assert process.stdout is not None
        deadline = time.monotonic() + 10
        seen = b""
        while b"Ready to accept connections" not in seen:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([process.stdout], [], [], max(remaining, 0))
            if not ready or process.poll() is not None:
                raise RuntimeError(f"redis-server did not start: {seen.decode(errors='replace')[-500:]}")
            seen += os.read(process.stdout.fileno(), 65536)

    def restart(self) -> None:
        """Stop the server and start a new, empty one on the same port (what a Redis restart looks like)."""
        self.stop()
        self.start()

    def suspend(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def require_redis_server_binary() -> None:
    """Skip the test, with the reason, where no ``redis-server`` is installed; under CI=true, fail.

    Only the tests that restart or pause Redis need their own server; the others use the machine's.
    """
    if shutil.which("redis-server") is not None:
        return
    message = "redis-server is not installed (the Debian package redis-server provides it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI=true requires it", pytrace=False)
    pytest.skip(message)


@contextmanager
def own_redis_server() -> Iterator[OwnRedis]:
    """A started ``OwnRedis`` on a free port, stopped when the block ends (also when it fails).

    Skips the test where the ``redis-server`` binary is missing (``require_redis_server_binary``).
    """
    require_redis_server_binary()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = OwnRedis(port)
    try:
        server.start()
        yield server
    finally:
        server.stop()

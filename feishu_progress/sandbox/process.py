"""``feishu-progress sandbox``: the sandbox as a process of its own, which several service instances share.

Point every instance at it with ``FP_FEISHU__BASE_URL`` and the same ``FP_FEISHU__APP_ID`` /
``FP_FEISHU__APP_SECRET``. Its first line on stdout is its base URL (so a script or test that asked for
port 0 learns the port); it runs until SIGINT or SIGTERM, then exits 0.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass

from feishu_progress.sandbox.faults import API_ENDPOINTS
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig


@dataclass(frozen=True, slots=True)
class SandboxOptions:
    """What the command line sets; every Feishu limit keeps the sandbox's default."""

    host: str = "127.0.0.1"
    port: int = 0
    app_id: str | None = None  # None: the token endpoint accepts any credentials
    app_secret: str | None = None
    time_scale: float = 1.0
    latency_ms: float = 0.0  # added to every Open API answer: Feishu is not instant, and overlaps show
    # The app budget per API (Feishu: 50/s, 1000/min). Lower, a test can outrun it with a few cards.
    app_per_second: float = 50
    app_per_minute: float = 1000
    cardkit_scope: bool = True  # False: the app lacks cardkit:card:write (every CardKit call: 99991672)
    clock_offset_seconds: float = 0.0  # answers' Date header runs this far ahead (negative: behind)
    id_prefix: str = "sandbox"  # message ids om_<prefix>_...: distinct across sandboxes playing two apps

    def config(self) -> SandboxConfig:
        return SandboxConfig(
            app_id=self.app_id,
            app_secret=self.app_secret,
            time_scale=self.time_scale,
            app_per_second=self.app_per_second,
            app_per_minute=self.app_per_minute,
            cardkit_scope=self.cardkit_scope,
            clock_offset_seconds=self.clock_offset_seconds,
            id_prefix=self.id_prefix,
        )


async def serve_sandbox(options: SandboxOptions, announce: Callable[[str], None]) -> None:
    """Serve the sandbox until SIGINT/SIGTERM; ``announce`` gets its base URL once it listens."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        async with run_sandbox(options.config(), host=options.host, port=options.port) as running:
            if options.latency_ms > 0:
                running.state.faults.slow(options.latency_ms, endpoints=API_ENDPOINTS)
            announce(running.base_url)
            await stop.wait()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def run(options: SandboxOptions, announce: Callable[[str], None]) -> int:
    """The command's body: serve, and exit 0 on a signal."""
    asyncio.run(serve_sandbox(options, announce))
    return 0

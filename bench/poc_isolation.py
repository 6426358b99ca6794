"""Issue 26 items 4 and 5: do large event batches or image uploads starve card clicks or images?

One ``feishu-progress serve`` process (sandbox mode, SQLite, its own callback keys so this script can
sign clicks) and this script as the client, in another process. A signed click (dislike, toggled) is
sent every 100 ms to one task while ``--flood`` concurrent senders post the largest event batches the
API takes (``--batch-mb``) to other tasks, or upload ``--image-mb`` images. Prints the clicks' latency
(p50, p99, max, how many missed Feishu's 3 s) and the server's peak RSS.

``--urls N``: one task's image tool results name N image URLs on a local server that never sends a
byte; then another task's result names a local image (and a third task's a URL that answers at once).
Prints how long each of those two waited for its image key, and how long the slow task's images took
to give up. One round per ``--rounds``, each with fresh tasks.

    python -m bench.poc_isolation --flood 30 --batch-mb 7.5 --seconds 20
    python -m bench.poc_isolation --flood 0 --seconds 10             # the baseline
    python -m bench.poc_isolation --flood 150 --uploads --seconds 15 # item 5: uploads in flight
    python -m bench.poc_isolation --urls 18 --rounds 3               # item 5: slow image URLs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import aiohttp
from aiohttp import web

from feishu_progress.sandbox.clicks import card_action_payload, signed_request

TOKEN, KEY, VTOKEN = "poc-token", "poc-encrypt-key", "poc-verification-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TASK = {"receive_id": "oc_poc", "receive_id_type": "chat_id", "requester_open_id": "ou_poc"}
PNG = b"\x89PNG\r\n\x1a\n" + b"poc-pixels" * 100


def start_server(workdir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FP_")}
    (workdir / "images").mkdir()
    (workdir / "images" / "local.png").write_bytes(PNG)
    env.update(
        FP_IMAGES__ROOT=str(workdir / "images"),
        FP_IMAGES__ALLOWED_NETWORKS="127.0.0.1/32",  # the slow and the fast image server
        FP_DATABASE_URL=f"sqlite+aiosqlite:///{workdir / 'poc.db'}",
        FP_HTTP__PORT=str(port),
        FP_ADMIN__PORT=str(port + 1),
        FP_API__TOKEN=TOKEN,
        FP_FEISHU__ENCRYPT_KEY=KEY,
        FP_FEISHU__VERIFICATION_TOKEN=VTOKEN,
        FP_LOG_LEVEL="WARNING",
    )
    argv = [sys.executable, "-m", "feishu_progress", "serve"]
    return subprocess.Popen(argv, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_ready(http: aiohttp.ClientSession, base: str) -> None:
    for _ in range(300):
        try:
            async with http.get(base + "/v1/openapi.json") as answer:
                if answer.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not come up")


async def new_task(http: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with http.post(base + "/v1/tasks", json=TASK, headers=AUTH) as answer:
        created = await answer.json()
    return created["session_id"], created["message_id"]


async def clicker(http: aiohttp.ClientSession, base: str, task: tuple[int, str], until: float) -> list[float]:
    session_id, message_id = task
    latencies: list[float] = []
    while time.monotonic() < until:
        payload = card_action_payload(
            open_id="ou_poc",
            message_id=message_id,
            value={"v": 1, "action": "dislike", "session_id": session_id},
            verification_token=VTOKEN,
            now=time.time(),
        )
        raw, headers = signed_request(payload, encrypt_key=KEY, now=time.time())
        started = time.monotonic()
        async with http.post(base + "/feishu/callback", data=raw, headers=headers) as answer:
            await answer.read()
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.1)
    return latencies


def click_process(base: str, task: tuple[int, str], seconds: float) -> list[float]:
    """The clicker in a process of its own: the flood's client work must not delay the clicks' client."""

    async def clicks() -> list[float]:
        async with aiohttp.ClientSession() as http:
            return await clicker(http, base, task, time.monotonic() + seconds)

    return asyncio.run(clicks())


def big_batch(megabytes: float) -> bytes:
    text = "x" * 15_000  # under the 16 KiB value cap: kept whole, as a chatty tool result would be
    count = min(int(megabytes * 1024 * 1024 / 15_100), 1000)
    events = [{"type": "content", "text": text} for _ in range(count)]
    return json.dumps({"events": events}).encode()


async def flooder(
    http: aiohttp.ClientSession, base: str, session_id: int, body: bytes, *, uploads: bool, until: float
) -> dict[int, int]:
    statuses: dict[int, int] = {}
    while time.monotonic() < until:
        if uploads:
            form = aiohttp.FormData()
            form.add_field("image", body, filename="x.png", content_type="image/png")
            request = http.post(f"{base}/v1/tasks/{session_id}/images", data=form, headers=AUTH)
        else:
            headers = AUTH | {"Content-Type": "application/json"}
            request = http.post(f"{base}/v1/tasks/{session_id}/events", data=body, headers=headers)
        try:
            async with request as answer:
                await answer.read()
                statuses[answer.status] = statuses.get(answer.status, 0) + 1
                if answer.status in (429, 503):
                    await asyncio.sleep(float(answer.headers.get("Retry-After", "1")))
        except aiohttp.ClientError:
            statuses[0] = statuses.get(0, 0) + 1
    return statuses


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        server = start_server(Path(workdir), args.port)
        try:
            await (measure_urls(args) if args.urls else measure(args, server.pid))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


async def measure(args: argparse.Namespace, pid: int) -> None:
    base = f"http://127.0.0.1:{args.port}"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await wait_ready(http, base)
        target = await new_task(http, base)
        others = [await new_task(http, base) for _ in range(max(1, min(args.flood, 10)))]
        image = b"\x89PNG\r\n\x1a\n" + os.urandom(int(args.image_mb * 1024 * 1024))
        body = image if args.uploads else big_batch(args.batch_mb)
        until = time.monotonic() + args.seconds
        floods = [
            flooder(http, base, others[i % len(others)][0], body, uploads=args.uploads, until=until)
            for i in range(args.flood)
        ]
        with ProcessPoolExecutor(1) as pool:
            clicking = asyncio.get_running_loop().run_in_executor(
                pool, click_process, base, target, args.seconds
            )
            results = await asyncio.gather(clicking, *floods)
    clicks: list[float] = results[0]
    statuses: dict[int, int] = {}
    for flood in results[1:]:
        for status, count in flood.items():
            statuses[status] = statuses.get(status, 0) + count
    clicks.sort()
    p99 = clicks[min(len(clicks) - 1, int(len(clicks) * 0.99))]
    print(
        f"flood={args.flood} {'uploads' if args.uploads else 'batches'} of {len(body) / 1e6:.1f} MB: "
        f"clicks n={len(clicks)} p50={statistics.median(clicks) * 1000:.0f} ms p99={p99 * 1000:.0f} ms "
        f"max={clicks[-1] * 1000:.0f} ms over3s={sum(c > 3 for c in clicks)}; "
        f"flood answers {dict(sorted(statuses.items()))}; server peak RSS {peak_rss_mib(pid):.0f} MiB"
    )


# -- --urls: slow image URLs of one task against another task's images ---------------------------------


async def image_server(port: int) -> web.AppRunner:
    """``/never/*`` accepts the request and never answers; ``/fast/*`` answers a PNG at once."""
    stop = asyncio.Event()

    async def never(request: web.Request) -> web.StreamResponse:
        await stop.wait()
        return web.Response(status=503)

    async def fast(request: web.Request) -> web.StreamResponse:
        return web.Response(body=PNG + request.path.encode(), content_type="image/png")

    app = web.Application()
    app.router.add_get("/never/{name}", never)
    app.router.add_get("/fast/{name}", fast)
    app.on_shutdown.append(lambda _: _set(stop))
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def _set(event: asyncio.Event) -> None:
    event.set()


def image_events(call_id: str, images: list[dict[str, str]]) -> dict[str, object]:
    return {
        "events": [
            {"type": "tool_started", "call_id": call_id, "name": "generate_image", "args": {"prompt": "p"}},
            {"type": "tool_finished", "call_id": call_id, "result": {"images": images}},
        ]
    }


async def post_images(
    http: aiohttp.ClientSession, base: str, session_id: int, call_id: str, images: list[dict[str, str]]
) -> None:
    url = f"{base}/v1/tasks/{session_id}/events"
    async with http.post(url, json=image_events(call_id, images), headers=AUTH) as answer:
        assert answer.status == 202, await answer.text()


async def seconds_until_settled(
    http: aiohttp.ClientSession, base: str, session_id: int, started: float, *, keys: int
) -> float:
    """Until the card holds ``keys`` image keys and nothing on its way (图片上传中), polled every 50 ms."""
    while True:
        async with http.get(f"{base}/v1/tasks/{session_id}", headers=AUTH) as answer:
            card = json.dumps((await answer.json())["card"], ensure_ascii=False)
        if card.count('"img_key"') >= keys and "图片上传中" not in card:
            return time.monotonic() - started
        await asyncio.sleep(0.05)


async def url_round(http: aiohttp.ClientSession, base: str, images: str, n: int, r: int) -> list[float]:
    slow, local, fast = [await new_task(http, base) for _ in range(3)]
    slow_started = time.monotonic()
    for call in range(0, n, 9):  # the card takes 9 images a call
        urls = [{"image_url": f"{images}/never/{r}-{i}.png"} for i in range(call, min(n, call + 9))]
        await post_images(http, base, slow[0], f"slow-{call}", urls)
    await asyncio.sleep(0.2)  # the slow fetches have started
    started = time.monotonic()
    # Seed 000: the first item names a string image_url (the backend's own, here relative: not fetched).
    local_image = {"image_url": "/uploads/local.png", "image_path": "local.png"}
    await post_images(http, base, local[0], "local", [local_image])
    await post_images(http, base, fast[0], "fast", [{"image_url": f"{images}/fast/{r}.png"}])
    waits = await asyncio.gather(
        seconds_until_settled(http, base, local[0], started, keys=1),
        seconds_until_settled(http, base, fast[0], started, keys=1),
        seconds_until_settled(http, base, slow[0], slow_started, keys=0),
    )
    return list(waits)


async def measure_urls(args: argparse.Namespace) -> None:
    base = f"http://127.0.0.1:{args.port}"
    images = await image_server(args.port + 2)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            await wait_ready(http, base)
            rounds = [
                await url_round(http, base, f"http://127.0.0.1:{args.port + 2}", args.urls, r)
                for r in range(args.rounds)
            ]
    finally:
        await images.cleanup()
    local, fast, slow = (statistics.median(column) for column in zip(*rounds, strict=True))
    print(
        f"urls={args.urls} never answering, medians of {args.rounds}: another task's local image keyed after "
        f"{local:.2f} s, another task's fast URL after {fast:.2f} s; the slow task's images settled "
        f"(unreachable) after {slow:.1f} s; rounds {[[round(x, 2) for x in row] for row in rounds]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flood", type=int, default=30)
    parser.add_argument("--batch-mb", type=float, default=7.5)
    parser.add_argument("--uploads", action="store_true")
    parser.add_argument("--image-mb", type=float, default=9.5)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--port", type=int, default=18_700)
    parser.add_argument("--urls", type=int, default=0, help="slow image URLs of one task (item 5)")
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

"""Benchmark: card PATCH cost through lark-oapi vs our FeishuClient (one shared aiohttp session).

The sandbox runs in a SEPARATE PROCESS with every rate limit lifted (lark-oapi's token path is
blocking `requests`, and the client process's CPU time must be the client's alone). Both clients
PATCH the same ~2 KB card; lark-oapi gets an injected token (enable_set_token + RequestOption)
and its domain is set after build() because the builder refuses loopback URLs with ports.

    python bench/lark_oapi_vs_aiohttp.py --patches 2000 --concurrency 16 --runs 3

Prints a markdown table of medians: PATCHes/s (wall), CPU ms per PATCH (time.process_time of
this process) and sockets opened (client connections the sandbox saw during the PATCH phase).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from feishu_progress.cards.validate import card_bytes
from feishu_progress.config import FeishuSettings
from feishu_progress.feishu.client import FeishuClient

PatchFn = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class RunResult:
    patches_per_second: float
    cpu_ms_per_patch: float
    sockets: int
    failures: int


def bench_card(target_bytes: int) -> dict[str, Any]:
    """A valid JSON 2.0 card of about ``target_bytes`` (a progress card's typical size)."""
    line = "- 搜索 飞书卡片限流 (完成) · 读取 README.md · 运行 pytest -q\n"
    body = ""
    while len((body + line).encode()) < target_bytes - 200:  # leave room for the card's frame
        body += line
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": "正在处理 · 第 3 轮"}},
        "header": {"title": {"tag": "plain_text", "content": "benchmark"}, "template": "blue"},
        "body": {"elements": [{"tag": "markdown", "content": body}]},
    }


# --- the sandbox process -------------------------------------------------------------------------


def _serve_sandbox(queue: multiprocessing.Queue[str]) -> None:
    async def serve() -> None:
        from feishu_progress.sandbox import SandboxConfig, run_sandbox

        async with run_sandbox(SandboxConfig().unlimited(), port=0) as sandbox:
            queue.put(sandbox.base_url)
            await asyncio.Event().wait()

    asyncio.run(serve())


async def _sandbox_call(base_url: str, method: str, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.request(method, base_url + path) as response:
        result: dict[str, Any] = await response.json()
        return result


# --- the measured loop ---------------------------------------------------------------------------


async def measure(base_url: str, message_ids: list[str], patches: int, patch: PatchFn) -> RunResult:
    """PATCH ``patches`` times spread over one worker per message; time and count it."""
    await _sandbox_call(base_url, "POST", "/_sandbox/reset")
    per_worker = [
        patches // len(message_ids) + (i < patches % len(message_ids)) for i in range(len(message_ids))
    ]
    failures = 0

    async def worker(message_id: str, count: int) -> None:
        nonlocal failures
        for _ in range(count):
            try:
                await patch(message_id)
            except Exception:  # a benchmark counts failures instead of stopping
                failures += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(mid, n) for mid, n in zip(message_ids, per_worker, strict=True)))
    cpu1, wall1 = time.process_time(), time.perf_counter()
    stats = await _sandbox_call(base_url, "GET", "/_sandbox/stats")
    return RunResult(
        patches / (wall1 - wall0), (cpu1 - cpu0) * 1000 / patches, int(stats["connections"]), failures
    )


async def run_ours(
    client: FeishuClient, base_url: str, ids: list[str], patches: int, card: dict[str, Any]
) -> RunResult:
    async def patch(message_id: str) -> None:
        await client.patch_card(message_id, card)

    return await measure(base_url, ids, patches, patch)


async def run_lark(
    lark_client: Any, *, token: str, base_url: str, ids: list[str], patches: int, card: dict[str, Any]
) -> RunResult:
    import lark_oapi as lark
    from lark_oapi.api.im.v1 import PatchMessageRequest, PatchMessageRequestBody

    option = lark.RequestOption.builder().tenant_access_token(token).build()
    content = json.dumps(card, ensure_ascii=False, separators=(",", ":"))

    async def patch(message_id: str) -> None:
        body = PatchMessageRequestBody.builder().content(content).build()
        request = PatchMessageRequest.builder().message_id(message_id).request_body(body).build()
        response = await lark_client.im.v1.message.apatch(request, option)
        if not response.success():
            raise RuntimeError(f"lark-oapi PATCH failed: {response.code} {response.msg}")

    return await measure(base_url, ids, patches, patch)


def build_lark_client(base_url: str) -> Any:
    import lark_oapi as lark

    client = (
        lark.Client.builder()
        .app_id("cli_bench")
        .app_secret("bench")
        .enable_set_token(True)
        .timeout(30)
        .log_level(lark.LogLevel.ERROR)
        .build()
    )
    client.config.domain = base_url  # the builder refuses http://127.0.0.1:<port>; the shared Config does not
    return client


async def main_async(args: argparse.Namespace, base_url: str) -> None:
    card = bench_card(args.card_bytes)
    settings = FeishuSettings(base_url=base_url, timeout_seconds=30)
    print("importing lark_oapi (slow)...", flush=True)
    t0 = time.perf_counter()
    lark_client = build_lark_client(base_url)
    print(f"import + build took {time.perf_counter() - t0:.1f} s", flush=True)
    results: dict[str, list[RunResult]] = {"ours": [], "lark": []}
    async with FeishuClient(settings, pool_limit=args.concurrency) as client:
        ids = [
            await client.send_card(f"ou_bench_{i}", "open_id", card, f"bench-{i}")
            for i in range(args.concurrency)
        ]
        token = await client.tokens.get()
        for run in range(args.runs):
            results["ours"].append(await run_ours(client, base_url, ids, args.patches, card))
            print(f"run {run + 1} aiohttp: {results['ours'][-1]}", flush=True)
            results["lark"].append(
                await run_lark(
                    lark_client, token=token, base_url=base_url, ids=ids, patches=args.patches, card=card
                )
            )
            print(f"run {run + 1} lark-oapi: {results['lark'][-1]}", flush=True)
    print_table(args, results)


def print_table(args: argparse.Namespace, results: dict[str, list[RunResult]]) -> None:
    names = {
        "lark": "lark-oapi `client.im.v1.message.apatch`",
        "ours": "FeishuClient (one shared aiohttp session)",
    }
    print(
        f"\n{args.patches} PATCHes × {args.runs} runs, concurrency {args.concurrency}, "
        f"{card_bytes(bench_card(args.card_bytes))} B card, medians\n"
    )
    print("| client | PATCHes/s | CPU ms / PATCH | sockets opened | failures |")
    print("|---|---:|---:|---:|---:|")
    for key in ("lark", "ours"):
        runs = results[key]
        print(
            f"| {names[key]} | {statistics.median(r.patches_per_second for r in runs):,.0f} | "
            f"{statistics.median(r.cpu_ms_per_patch for r in runs):.2f} | "
            f"{statistics.median(r.sockets for r in runs):.0f} | {sum(r.failures for r in runs)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--card-bytes", type=int, default=2048)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[str] = context.Queue()
    sandbox = context.Process(target=_serve_sandbox, args=(queue,), daemon=True)
    sandbox.start()
    try:
        asyncio.run(main_async(args, queue.get(timeout=60)))
    finally:
        sandbox.terminate()
        sandbox.join(5)


if __name__ == "__main__":
    main()

"""Command line: ``feishu-progress serve | migrate | demo | sandbox | openapi``."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence

from pydantic import ValidationError

from feishu_progress.config import Settings
from feishu_progress.logs import configure_logging

log = logging.getLogger("feishu_progress")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="feishu-progress", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the bot: callbacks + runtime API + admin listener")
    migrate = sub.add_parser("migrate", help="apply the database migrations (alembic upgrade head)")
    migrate.add_argument(
        "--revision", default=None, help="target revision (default: head, or base with --down)"
    )
    migrate.add_argument("--down", action="store_true", help="downgrade to --revision instead")
    demo = sub.add_parser("demo", help="play a scripted task against the embedded sandbox and show the card")
    demo.add_argument(
        "--serve",
        action="store_true",
        help="afterwards keep the sandbox and its preview page (/sandbox/) running until Ctrl-C",
    )
    sub.add_parser(
        "openapi",
        help="print the runtime API's OpenAPI 3.1 document (the committed copy: > docs/openapi.json)",
    )
    _add_sandbox_parser(sub)
    return parser


def _add_sandbox_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = sub.add_parser(
        "sandbox",
        help="run the local Feishu sandbox as its own process (several instances can share it); "
        "prints its base URL, stops on SIGINT/SIGTERM",
    )
    sandbox.add_argument("--host", default="127.0.0.1")
    sandbox.add_argument("--port", type=int, default=0, help="0 (default): a free port")
    sandbox.add_argument("--app-id", default=None, help="when set, tokens are issued only for this app")
    sandbox.add_argument("--app-secret", default=None)
    sandbox.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="sandbox seconds per real second",
    )
    sandbox.add_argument(
        "--latency-ms", type=float, default=0.0, help="delay every Open API answer by this many milliseconds"
    )
    sandbox.add_argument("--app-per-second", type=float, default=50, help="app budget per API and second")
    sandbox.add_argument("--app-per-minute", type=float, default=1000, help="app budget per API and minute")


def _sandbox(args: argparse.Namespace) -> int:
    from feishu_progress.sandbox.process import SandboxOptions, run

    options = SandboxOptions(
        host=args.host,
        port=args.port,
        app_id=args.app_id,
        app_secret=args.app_secret,
        time_scale=args.time_scale,
        latency_ms=args.latency_ms,
        app_per_second=args.app_per_second,
        app_per_minute=args.app_per_minute,
    )
    return run(options, lambda base_url: print(base_url, flush=True))  # noqa: T201


def _openapi() -> int:
    import sys

    from feishu_progress.web.openapi import openapi_json

    sys.stdout.write(openapi_json())
    return 0


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"FP_{'__'.join(str(p).upper() for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise SystemExit(f"feishu-progress: bad configuration: {problems}") from None


def _serve(settings: Settings) -> int:
    from aiohttp import web

    from feishu_progress.app import create_app
    from feishu_progress.gc_policy import settle_after_startup

    problems = settings.serving_problems()
    if problems:  # create_app refuses too; saying it here keeps the traceback out of the operator's way
        raise SystemExit("feishu-progress: will not serve: " + "; ".join(problems))
    for note in settings.deprecations():
        log.warning("%s", note)
    app = create_app(settings)
    settle_after_startup(app)  # a process setting: the serving process owns it, not every app a test builds
    web.run_app(
        app,
        host=settings.bind_host,
        port=settings.http.port,
        access_log=None,
        print=lambda message: log.info("%s", message),
        shutdown_timeout=30.0,
    )
    return 0


def _migrate(settings: Settings, revision: str | None, down: bool) -> int:
    from feishu_progress.db.migrate import downgrade, migration_state, upgrade

    async def run() -> tuple[str | None, str]:
        if down:
            await downgrade(settings.database_url, revision or "base")
        else:
            await upgrade(settings.database_url, revision or "head")
        return await migration_state(settings.database_url)

    current, head = asyncio.run(run())
    log.info("database at revision %s (head %s)", current, head)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "sandbox":  # Feishu's stand-in: none of the service's FP_ settings apply to it
        configure_logging("WARNING")
        return _sandbox(args)
    if args.command == "openapi":  # needs no configuration: the contract is the same everywhere
        return _openapi()
    settings = _settings()
    configure_logging(settings.log_level, json_lines=settings.log_json)
    if args.command == "serve":
        return _serve(settings)
    if args.command == "migrate":
        return _migrate(settings, args.revision, args.down)
    logging.getLogger().setLevel(logging.WARNING)  # the demo's own output is the story
    from feishu_progress.demo import main as demo_main

    return demo_main(lambda line: print(line, flush=True), serve=args.serve)  # noqa: T201

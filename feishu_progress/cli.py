"""Command line: ``feishu-progress serve | migrate | doctor | demo | sandbox | openapi``."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from feishu_progress.config import Settings
from feishu_progress.errors import StartupRefused
from feishu_progress.logs import configure_logging

log = logging.getLogger("feishu_progress")

# Why a listener cannot bind: in use, not an address of this host, a privileged port.
PORT_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


SERVE_SETTINGS = """the settings that matter first (all: .env.example; meanings: README "Configuration"):
  FP_DATABASE_URL                          mysql+aiomysql://... (run 'feishu-progress migrate' first)
                                           or sqlite+aiosqlite:///... (migrates itself)
  FP_FEISHU__APP_ID, FP_FEISHU__APP_SECRET the app's credentials; unset: the local sandbox, whose
                                           preview page serve prints once it listens
  FP_FEISHU__ENCRYPT_KEY, FP_FEISHU__VERIFICATION_TOKEN
                                           the console's callback keys (webhook mode)
  FP_FEISHU__MODE                          webhook (POST /feishu/callback) or ws (long connection)
  FP_PUBLIC_URL                            where Feishu reaches this service
  FP_API__TOKEN                            bearer token runtimes present on /v1/* (required with Feishu)
  FP_HTTP__HOST, FP_HTTP__PORT             public listener (default 0.0.0.0:8000; 127.0.0.1 in sandbox)
  FP_ADMIN__HOST, FP_ADMIN__PORT           admin listener (default 127.0.0.1:8001)
  FP_REDIS_URL                             cluster mode (several instances on one MySQL)
check them all with 'feishu-progress doctor' before the first serve."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="feishu-progress", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "serve",
        help="run the bot: callbacks + runtime API + admin listener",
        description="Run the bot: Feishu callbacks and the runtime API on FP_HTTP__PORT; health,\n"
        "readiness and metrics on FP_ADMIN__PORT. Settings come from the environment (and ./.env).",
        epilog=SERVE_SETTINGS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    migrate = sub.add_parser("migrate", help="apply the database migrations (alembic upgrade head)")
    migrate.add_argument(
        "--revision", default=None, help="target revision (default: head, or base with --down)"
    )
    migrate.add_argument("--down", action="store_true", help="downgrade to --revision instead")
    doctor = sub.add_parser(
        "doctor",
        help="check configuration, database, Redis, the Feishu app (token, scopes, clock) and callbacks; "
        "exit 0 only when nothing fails (safe beside a running serve)",
    )
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    _add_smoke_parser(sub)
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


def _add_smoke_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    smoke = sub.add_parser(
        "smoke",
        help="five-step live run through a running serve into one chat: a card, streamed text, a subagent "
        "and a failing tool, a question, your click; each step prints its call, answer and time",
    )
    smoke.add_argument("--chat", required=True, help="chat_id (oc_...) of a chat the bot is in")
    smoke.add_argument(
        "--requester", default="ou_smoke", help="open_id (ou_...) of the person who may click (you)"
    )
    smoke.add_argument(
        "--url", default=None, help="the service's base URL (default: FP_PUBLIC_URL, else local)"
    )
    smoke.add_argument(
        "--app", default=None, help="the app of FP_APPS_FILE that sends the card (default: the default app)"
    )
    smoke.add_argument("--wait-minutes", type=float, default=5.0, help="how long to wait for your click")
    smoke.add_argument(
        "--auto-answer", action="store_true", help="click as Feishu would (sandbox, CI): no human needed"
    )


def _smoke(settings: Settings, args: argparse.Namespace) -> int:
    from feishu_progress.smoke import SmokeOptions, default_base_url, run_smoke

    options = SmokeOptions(
        chat_id=args.chat,
        requester_open_id=args.requester,
        base_url=(args.url or default_base_url(settings)).rstrip("/"),
        wait_minutes=args.wait_minutes,
        auto_answer=args.auto_answer,
        app=args.app,
    )
    return asyncio.run(run_smoke(settings, options, lambda line: print(line, flush=True)))  # noqa: T201


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
        "--id-prefix",
        default="sandbox",
        help="message ids are om_<prefix>_...: two sandboxes playing two apps give distinct ids",
    )
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
    sandbox.add_argument(
        "--no-cardkit-scope", action="store_true", help="play an app without cardkit:card:write (99991672)"
    )
    sandbox.add_argument(
        "--clock-offset",
        type=float,
        default=0.0,
        help="seconds the answers' Date header runs ahead of this host",
    )


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
        cardkit_scope=not args.no_cardkit_scope,
        clock_offset_seconds=args.clock_offset,
        id_prefix=args.id_prefix,
    )
    return run(options, lambda base_url: print(base_url, flush=True))  # noqa: T201


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("feishu-progress")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _doctor(as_json: bool) -> int:
    import os

    from feishu_progress.doctor import checks as found

    try:
        settings = Settings()
    except ValidationError as exc:
        results = [found.fail("config.parsed", _problems(exc), "fix the setting named (see .env.example)")]
    else:
        from feishu_progress.doctor import run_doctor

        results = asyncio.run(run_doctor(settings, os.environ))
    print(found.render_json(results) if as_json else found.render_text(results), flush=True)  # noqa: T201
    return found.exit_code(results)


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"FP_{'__'.join(str(p).upper() for p in error['loc'])}: {error['msg']}" for error in exc.errors()
    )


def _openapi() -> int:
    import sys

    from feishu_progress.web.openapi import openapi_json

    sys.stdout.write(openapi_json())
    return 0


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        raise SystemExit(f"feishu-progress: bad configuration: {_problems(exc)}") from None


def _serve(settings: Settings) -> int:
    import os

    from aiohttp import web

    from feishu_progress.app import create_app
    from feishu_progress.gc_policy import settle_after_startup
    from feishu_progress.tracing import provider_from_env

    problems = settings.serving_problems()
    if problems:  # create_app refuses too; saying it here keeps the traceback out of the operator's way
        raise SystemExit("feishu-progress: will not serve: " + "; ".join(problems))
    _refuse_unready_database(settings)
    for note in settings.deprecations():
        log.warning("%s", note)
    provider = provider_from_env(os.environ, instance_id=settings.instance_id)
    app = create_app(settings, tracer_provider=provider)
    settle_after_startup(app)  # a process setting: the serving process owns it, not every app a test builds
    try:
        web.run_app(
            app,
            host=settings.bind_host,
            port=settings.http.port,
            access_log=None,
            print=_listening(settings),
            shutdown_timeout=30.0,
        )
    except StartupRefused as exc:
        raise SystemExit(f"feishu-progress: will not serve: {exc}") from None
    except OSError as exc:  # the admin port is named where it is bound (app.py): this is the public one
        if exc.errno not in PORT_ERRORS:
            raise
        raise SystemExit(
            f"feishu-progress: will not serve: cannot listen on {settings.bind_host}:{settings.http.port} "
            f"({exc.strerror or exc}): set FP_HTTP__PORT to a free port (or FP_HTTP__HOST)"
        ) from None
    finally:
        if provider is not None:  # the spans still queued go out before the process ends
            provider.shutdown()
    return 0


def _listening(settings: Settings) -> Callable[[str], None]:
    """What ``serve`` says once its port listens: in sandbox mode, first of all where the preview is."""

    def announce(message: str) -> None:
        if settings.feishu.sandbox:
            from feishu_progress.sandbox.preview import page_url

            url = page_url(settings.bind_host, settings.http.port, token_set=settings.api.token is not None)
            print(f"sandbox preview (live cards, clickable): {url}", flush=True)  # noqa: T201
        log.info("%s", message)

    return announce


def _refuse_unready_database(settings: Settings) -> None:
    """MySQL down or behind the migrations: one line naming the setting and the fix, not a traceback.

    SQLite migrates itself at start, so only the server databases are asked here.
    """
    import os

    from feishu_progress.apps_file import referenced_variables
    from feishu_progress.config import unknown_variables
    from feishu_progress.doctor.checks import Status
    from feishu_progress.doctor.local import database_checks

    for name in unknown_variables(os.environ, referenced_variables(settings)):
        log.warning("%s is not a setting and is ignored (groups take two underscores: FP_API__TOKEN)", name)
    if not settings.database_url.startswith(("mysql", "mariadb")):
        return
    for check in asyncio.run(database_checks(settings)):
        if check.status is Status.FAIL:
            raise SystemExit(f"feishu-progress: will not serve: {check.detail}: {check.fix}")


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
    if args.command == "doctor":  # a bad setting is one of its findings, not a reason to stop
        configure_logging("ERROR")
        return _doctor(args.json)
    settings = _settings()
    configure_logging(settings.log_level, json_lines=settings.log_json)
    if args.command == "serve":
        return _serve(settings)
    if args.command == "migrate":
        return _migrate(settings, args.revision, args.down)
    if args.command == "smoke":
        return _smoke(settings, args)
    logging.getLogger().setLevel(logging.WARNING)  # the demo's own output is the story
    from feishu_progress.demo import main as demo_main

    return demo_main(lambda line: print(line, flush=True), serve=args.serve)  # noqa: T201

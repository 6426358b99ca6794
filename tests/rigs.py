"""The suite's shared rigs: one ``eventually``, one ``sandbox``, one app ``client``, one ``feishu``.

conftest.py registers the fixtures below (``pytest_plugins``); a test module imports the helpers and
constants (``from tests.rigs import API_TOKEN, eventually``).

A module changes a rig by overriding one of its small knob fixtures (a fixture of the same name in the
module, or ``@pytest.mark.parametrize`` on it), never by copying the rig:

- ``sandbox``: the sandbox Open API served in-process over real HTTP. Knobs: ``sandbox_config``
  (default: it plays the rigs' app, checking its id and secret), ``sandbox_clock`` (default: real time;
  ``clock.monotonic`` puts its windows and token expiry on the test's ``FakeClock``) and
  ``sandbox_ws_config`` (the long-connection gateway's client config).
- ``client``: the app (``create_app``) under aiohttp's test client. Knob: ``app_settings`` (default:
  ``app_settings_for(sandbox, <SQLite in tmp_path>)``).
- ``feishu``: a ``FeishuClient`` calling ``sandbox``. Knobs: ``feishu_settings`` and ``feishu_clock``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, overload

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import ADMIN_URL, create_app
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.ports import Clock
from feishu_progress.sandbox import RunningSandbox, SandboxConfig, run_sandbox
from feishu_progress.sandbox.ws_gateway import ClientConfig
from tests.conftest import sqlite_url
from tests.fakes import FakeClock

T = TypeVar("T")
Client = TestClient[Any, Any]

# The app the sandbox plays and the app's keys. Feishu's app ids start "cli_".
APP_ID, APP_SECRET = "cli_test", "s3cret"
ENCRYPT_KEY, VERIFICATION_TOKEN = "rigs-encrypt-key", "rigs-verification-token"
API_TOKEN, ADMIN_TOKEN = "rigs-api-token", "rigs-admin-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}

# What most waits in the suite allow: background work over loopback settles well within it.
WAIT_SECONDS = 10.0
POLL_SECONDS = 0.05
FEISHU_TIMEOUT_SECONDS = 5.0  # per Feishu call: a loopback sandbox answers in milliseconds
_SHOWN_CHARS = 500  # of the last value, in a timeout's message


# --- eventually ---------------------------------------------------------------------------------------


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    what: str | None = ...,
    *,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None], timeout: float = ..., what: str | None = ..., *, interval: float = ...
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    timeout: float = ...,
    what: str | None = ...,
    *,
    interval: float = ...,
    until: Callable[[T], object],
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T],
    timeout: float = ...,
    what: str | None = ...,
    *,
    interval: float = ...,
    until: Callable[[T], object],
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    timeout: float = WAIT_SECONDS,
    what: str | None = None,
    *,
    interval: float = POLL_SECONDS,
    until: Callable[[Any], object] = bool,
) -> Any:
    """Call ``probe`` (plain or async) every ``interval`` s until ``until(value)`` holds; that value.

    For what another task, a server or a process does in the background. After ``timeout`` seconds it
    fails (AssertionError) naming ``what`` (by default the probe's source) and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        if time.monotonic() >= deadline:
            waited = what or _described(probe)
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {waited}; last value: {_shown(value)}"
            )
        await asyncio.sleep(interval)


def _described(probe: Callable[[], object]) -> str:
    """A lambda's source line, else the function's name."""
    name = getattr(probe, "__qualname__", repr(probe))
    if name.endswith("<lambda>"):
        try:
            return " ".join(inspect.getsource(probe).split())[:_SHOWN_CHARS]
        except (OSError, TypeError):
            pass
    return str(name)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text)} chars)"


async def answers_200(http: aiohttp.ClientSession, url: str) -> bool:
    """Whether a GET of ``url`` answers 200; False while nothing listens there yet (a starting server)."""
    try:
        async with http.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


# --- clock -----------------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    """Fake time: it moves only when the test calls ``clock.advance``."""
    return FakeClock()


# --- sandbox -------------------------------------------------------------------------------------------


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    """The sandbox's limits; by default it plays the rigs' app (its token endpoint checks the secret)."""
    return SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)


@pytest.fixture
def sandbox_clock() -> Callable[[], float]:
    """The sandbox's time (rate windows, token expiry, update windows): real by default."""
    return time.monotonic


@pytest.fixture
def sandbox_ws_config() -> ClientConfig | None:
    """The ClientConfig the long-connection gateway hands out; None: the gateway's own."""
    return None


@pytest.fixture
async def sandbox(
    sandbox_config: SandboxConfig,
    sandbox_clock: Callable[[], float],
    sandbox_ws_config: ClientConfig | None,
) -> AsyncIterator[RunningSandbox]:
    """The sandbox Open API on a free loopback port."""
    async with run_sandbox(
        sandbox_config, clock=sandbox_clock, ws_client_config=sandbox_ws_config
    ) as running:
        yield running


# --- the app ---------------------------------------------------------------------------------------------


def app_settings_for(
    sandbox: RunningSandbox,
    database_url: str,
    *,
    encrypt_key: str | None = ENCRYPT_KEY,
    verification_token: str | None = VERIFICATION_TOKEN,
    admin_token: str | None = None,
    **fields: Any,
) -> Settings:
    """The app as the rigs' app against ``sandbox``, both servers on free loopback ports.

    ``encrypt_key`` / ``verification_token`` are the callback keys (None: callbacks come unencrypted,
    or with no token); ``fields`` are any other ``Settings`` fields.
    """
    return Settings(
        database_url=database_url,
        feishu=FeishuSettings(
            base_url=sandbox.base_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            encrypt_key=encrypt_key,
            verification_token=verification_token,
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0, token=admin_token),
        api=ApiSettings(token=API_TOKEN),
        **fields,
    )


@pytest.fixture
def app_settings(sandbox: RunningSandbox, tmp_path: Path) -> Settings:
    """The ``client`` app's settings: against ``sandbox``, on SQLite in ``tmp_path``."""
    return app_settings_for(sandbox, sqlite_url(tmp_path / "app.db"))


@pytest.fixture
async def client(app_settings: Settings, aiohttp_client: Any) -> Client:
    """The app under aiohttp's test client (its runtime API; the admin server runs on its own port)."""
    test_client: Client = await aiohttp_client(create_app(app_settings, registry=CollectorRegistry()))
    return test_client


async def readyz(client: Client) -> tuple[int, dict[str, Any]]:
    """The app's ``/readyz`` (on its admin server): status code and body."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_SECONDS)) as http,
        http.get(f"{client.app[ADMIN_URL]}/readyz") as response,
    ):
        body: dict[str, Any] = await response.json()
        return response.status, body


# --- the Feishu client -----------------------------------------------------------------------------------


@pytest.fixture
def feishu_settings(sandbox: RunningSandbox, sandbox_config: SandboxConfig) -> FeishuSettings:
    """``feishu``'s settings: the app the sandbox plays."""
    return FeishuSettings(
        base_url=sandbox.base_url,
        app_id=sandbox_config.app_id,
        app_secret=sandbox_config.app_secret,
        timeout_seconds=FEISHU_TIMEOUT_SECONDS,
    )


@pytest.fixture
def feishu_clock() -> Clock | None:
    """``feishu``'s clock (token renewal, retry waits); None: real time."""
    return None


@pytest.fixture
async def feishu(feishu_settings: FeishuSettings, feishu_clock: Clock | None) -> AsyncIterator[FeishuClient]:
    """A ``FeishuClient`` calling ``sandbox``."""
    async with FeishuClient(feishu_settings, clock=feishu_clock) as opened:
        yield opened

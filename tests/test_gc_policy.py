"""The serving process's garbage-collector settings (feishu_progress/gc_policy.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress import cli
from feishu_progress.app import create_app
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.gc_policy import SERVICE_THRESHOLDS, settle_after_startup
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """The settings are process-wide: put CPython's back for the tests that follow."""
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def _settings(tmp_path: Path, base_url: str) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gc.db'}",
        feishu=FeishuSettings(
            base_url=base_url, app_id="cli_gc", app_secret="secret", encrypt_key="gc-encrypt-key"
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token="api-token"),
    )


@pytest.mark.usefixtures("restored_collector")
async def test_a_started_service_freezes_what_startup_built_and_uses_a_large_young_generation(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    async with run_sandbox(SandboxConfig(app_id="cli_gc", app_secret="secret")) as sandbox:
        app = create_app(_settings(tmp_path, sandbox.base_url), registry=CollectorRegistry())
        settle_after_startup(app)
        assert gc.get_threshold() != SERVICE_THRESHOLDS  # nothing changes before the app starts
        client: TestClient[Any, Any] = await aiohttp_client(app)
        assert gc.get_threshold() == SERVICE_THRESHOLDS
        assert gc.get_freeze_count() > 0
        response = await client.get("/v1/openapi.json")
        assert response.status == 200  # the service still serves


def test_feishu_progress_serve_applies_the_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    served: list[web.Application] = []
    monkeypatch.setattr(web, "run_app", lambda app, **_: served.append(app))
    cli._serve(_settings(tmp_path, "http://127.0.0.1:9"))
    (app,) = served
    assert any(getattr(hook, "__module__", "") == "feishu_progress.gc_policy" for hook in app.on_startup)

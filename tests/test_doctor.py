"""``feishu-progress doctor`` against the sandbox over real HTTP, the real app serving callbacks beside it.

Each fault an operator meets in the first hour is played by the sandbox or the setup (wrong secret, no
CardKit scope, a skewed clock, an unmigrated database, Redis down, an unreachable callback URL): each
must give its fail line, its fix, and exit code 1; a healthy setup exits 0.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from feishu_progress.app import create_app
from feishu_progress.cli import main
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import upgrade
from feishu_progress.doctor import Check, Status, exit_code, render_text, run_doctor
from feishu_progress.doctor.local import database_checks
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.web.http import serving
from tests.conftest import fresh_mysql_database
from tests.rigs import API_TOKEN, APP_ID, APP_SECRET, ENCRYPT_KEY, VERIFICATION_TOKEN


def _settings(sandbox: RunningSandbox, tmp_path: Path, **overrides: Any) -> Settings:
    feishu = FeishuSettings(
        base_url=sandbox.base_url,
        app_id=APP_ID,
        app_secret=overrides.pop("app_secret", APP_SECRET),
        encrypt_key=ENCRYPT_KEY,
        verification_token=VERIFICATION_TOKEN,
    )
    values: dict[str, Any] = {
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'doctor.db'}",
        "feishu": feishu,
        "http": HttpSettings(host="127.0.0.1", port=0),
        "admin": AdminSettings(host="127.0.0.1", port=0),
        "api": ApiSettings(token=API_TOKEN),
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
async def serving_url(sandbox: RunningSandbox, tmp_path: Path) -> AsyncIterator[str]:
    """The real service, serving callbacks on the migrated database doctor checks."""
    settings = _settings(sandbox, tmp_path)
    await upgrade(settings.database_url)
    async with serving(create_app(settings, registry=CollectorRegistry())) as url:
        yield url


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def _failed(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks if check.status is Status.FAIL}


async def test_a_healthy_setup_passes_every_check_beside_a_running_serve(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url), {})
    assert _failed(checks) == {}, render_text(checks)
    named = _by_name(checks)
    for name in (
        "config.serving",
        "database.reachable",
        "database.migrations",
        "feishu.token",
        "feishu.clock",
        "feishu.scope.im:message:send_as_bot",
        "feishu.scope.im:resource",
        "feishu.scope.cardkit:card:write",
        "feishu.rate_limit",
        "callbacks.webhook",
    ):
        assert named[name].status is Status.OK, render_text(checks)
    assert "answered the challenge" in named["callbacks.webhook"].detail
    assert exit_code(checks) == 0
    # Doctor sends no message and shows no card: nothing a chat member could see.
    assert sandbox.state.messages == {}


async def test_a_wrong_secret_names_the_code_and_the_console_page(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url, app_secret="typo"), {})
    token = _failed(checks)["feishu.token"]
    assert "10014" in token.detail and "app secret invalid" in token.detail
    assert "FP_FEISHU__APP_SECRET" in token.fix and "凭证与基础信息" in token.fix
    assert exit_code(checks) == 1


async def test_a_missing_cardkit_scope_fails_with_the_scope_and_the_patch_alternative(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    sandbox.state.config.cardkit_scope = False
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url), {})
    assert set(_failed(checks)) == {"feishu.scope.cardkit:card:write"}, render_text(checks)
    scope = _failed(checks)["feishu.scope.cardkit:card:write"]
    assert "99991672" in scope.detail
    assert (
        "权限管理" in scope.fix
        and "cardkit:card:write" in scope.fix
        and "FP_CARD__TRANSPORT=patch" in scope.fix
    )
    assert exit_code(checks) == 1


async def test_a_skewed_clock_fails_past_the_callback_window(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    sandbox.state.config.clock_offset_seconds = 600
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url), {})
    clock = _failed(checks)["feishu.clock"]
    assert "behind Feishu's" in clock.detail and "TIMESTAMP_WINDOW" in clock.detail
    assert "timedatectl" in clock.fix
    sandbox.state.config.clock_offset_seconds = -60  # inside the window: a warning, not a failure
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url), {})
    assert _by_name(checks)["feishu.clock"].status is Status.WARN
    assert "ahead of" in _by_name(checks)["feishu.clock"].detail


async def test_an_unmigrated_database_names_migrate(sandbox: RunningSandbox, tmp_path: Path) -> None:
    settings = _settings(sandbox, tmp_path)
    checks = await run_doctor(settings, {})
    assert _failed(checks)["database.reachable"].fix.startswith("run feishu-progress migrate")
    assert not (tmp_path / "doctor.db").exists()  # doctor created no empty file
    (tmp_path / "doctor.db").touch()  # a file without tables: reachable, not migrated
    checks = await run_doctor(settings, {})
    migrations = _failed(checks)["database.migrations"]
    assert "schema at nothing" in migrations.detail
    assert migrations.fix.startswith("run feishu-progress migrate")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_redis_down_fails_naming_fp_redis_url(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    redis_url = f"redis://127.0.0.1:{_closed_port()}/0"
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url, redis_url=redis_url), {})
    failed = _failed(checks)
    assert "FP_REDIS_URL" in failed["redis"].detail and "FP_REDIS_URL" in failed["redis"].fix
    serving = [check.detail for check in checks if check.name == "config.serving"]
    assert any("MySQL" in detail for detail in serving)  # cluster mode on SQLite is named too
    assert any("FP_CLUSTER__SECRET" in detail for detail in serving)  # and its missing secret
    assert exit_code(checks) == 1


async def test_an_unreachable_callback_url_fails_with_the_console_field(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=dead), {})
    webhook = _failed(checks)["callbacks.webhook"]
    assert f"{dead}/feishu/callback is not reachable" in webhook.detail
    assert "请求地址" in webhook.fix and "FP_PUBLIC_URL" in webhook.fix
    assert set(_failed(checks)) == {"callbacks.webhook"}


async def test_other_callback_keys_in_the_serving_process_are_named(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    other = FeishuSettings(
        base_url=sandbox.base_url,
        app_id=APP_ID,
        app_secret=APP_SECRET,
        encrypt_key="other",
        verification_token="x",
    )
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url, feishu=other), {})
    webhook = _failed(checks)["callbacks.webhook"]
    assert "401" in webhook.detail and "FP_FEISHU__ENCRYPT_KEY" in webhook.fix


async def test_a_mistyped_variable_is_named(
    sandbox: RunningSandbox, tmp_path: Path, serving_url: str
) -> None:
    checks = await run_doctor(_settings(sandbox, tmp_path, public_url=serving_url), {"FP_API_TOKEN": "x"})
    unknown = _by_name(checks)["config.unknown"]
    assert (
        unknown.status is Status.WARN and "FP_API_TOKEN" in unknown.detail and "FP_API__TOKEN" in unknown.fix
    )
    assert exit_code(checks) == 0


@pytest.fixture
def doctor_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.chdir(tmp_path)  # no .env of the checkout leaks in
    yield monkeypatch


def test_the_command_prints_lines_and_json_and_exits_1_on_a_failure(
    doctor_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doctor_env.setenv("FP_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'none.db'}")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "fail  database.reachable" in out and "fix: run feishu-progress migrate" in out
    assert main(["doctor", "--json"]) == 1
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["ok"] is False
    assert {"name": "database.reachable", "status": "fail"}.items() <= parsed["checks"][1].items()


def test_a_setting_that_does_not_parse_is_a_fail_line(
    doctor_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doctor_env.setenv("FP_CARD__TRANSPORT", "carrier-pigeon")
    assert main(["doctor"]) == 1
    assert "fail  config.parsed  FP_CARD__TRANSPORT" in capsys.readouterr().out


@pytest.fixture
def empty_mysql_url() -> str:
    return fresh_mysql_database("doctor")


@pytest.mark.mysql
async def test_mysql_column_types_are_checked_against_the_models(empty_mysql_url: str) -> None:
    url = empty_mysql_url
    await upgrade(url)
    settings = Settings(database_url=url)
    assert _by_name(await database_checks(settings))["database.columns"].status is Status.OK
    db = Database.open(url, poolclass=NullPool)
    try:
        async with db.session() as session:  # what a hand edit or another tool leaves behind
            await session.execute(text("ALTER TABLE session MODIFY title VARCHAR(20)"))
    finally:
        await db.close()
    columns = _failed(await database_checks(settings))["database.columns"]
    assert "session.title is VARCHAR(20)" in columns.detail and "feishu-progress migrate" in columns.fix


async def test_ws_mode_opens_the_long_connection_once(sandbox: RunningSandbox, tmp_path: Path) -> None:
    await upgrade(_settings(sandbox, tmp_path).database_url)
    ws = FeishuSettings(base_url=sandbox.base_url, app_id=APP_ID, app_secret=APP_SECRET, mode="ws")
    checks = await run_doctor(_settings(sandbox, tmp_path, feishu=ws), {})
    assert _by_name(checks)["callbacks.long_connection"].status is Status.OK, render_text(checks)
    assert sandbox.gateway.discoveries == 1
    wrong = FeishuSettings(base_url=sandbox.base_url, app_id=APP_ID, app_secret="typo", mode="ws")
    checks = await run_doctor(_settings(sandbox, tmp_path, feishu=wrong), {})
    assert "10014" in _failed(checks)["callbacks.long_connection"].detail


@pytest.mark.mysql
def test_serve_refuses_an_unmigrated_mysql_in_one_line(empty_mysql_url: str, tmp_path: Path) -> None:
    from feishu_progress.cli import _refuse_unready_database

    with pytest.raises(SystemExit) as refused:
        _refuse_unready_database(Settings(database_url=empty_mysql_url))
    assert "schema at nothing" in str(refused.value) and "run feishu-progress migrate" in str(refused.value)
    _refuse_unready_database(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    )  # migrates itself


async def test_every_app_of_an_apps_file_is_checked_and_a_bad_file_is_a_finding(
    sandbox: RunningSandbox, tmp_path: Path
) -> None:
    apps = tmp_path / "apps.toml"
    apps.write_text(
        f'[apps.research]\napp_id = "{APP_ID}"\napp_secret_env = "RESEARCH_SECRET"\n'
        f'verification_token_env = "RESEARCH_VTOKEN"\nencrypt_key_env = "RESEARCH_KEY"\n'
        f'domain = "{sandbox.base_url}"\n'
    )
    env = {
        "RESEARCH_SECRET": APP_SECRET,
        "RESEARCH_VTOKEN": VERIFICATION_TOKEN,
        "RESEARCH_KEY": "another-key",
    }
    # FP_FEISHU__* left empty: the file's apps are the deployment's (and no sandbox is used).
    settings = _settings(sandbox, tmp_path, apps_file=str(apps)).model_copy(
        update={"feishu": FeishuSettings()}
    )
    named = _by_name(await run_doctor(settings, env))
    assert "config.apps_file" not in named and "feishu" not in named
    assert named["feishu.research.token"].status is Status.OK, render_text(list(named.values()))
    assert named["feishu.research.scope.im:resource"].status is Status.OK
    missing = _by_name(await run_doctor(settings, {}))  # its secret's variable is not set
    assert missing["config.apps_file"].status is Status.FAIL
    assert "RESEARCH_SECRET" in missing["config.apps_file"].detail


RESEARCH_ID, RESEARCH_SECRET = "cli_doctor_research", "research-secret"
RESEARCH_ENV = {
    "DOCTOR_RESEARCH_SECRET": RESEARCH_SECRET,
    "DOCTOR_RESEARCH_KEY": "research-key",
    "DOCTOR_RESEARCH_VTOKEN": "research-vt",
}


@pytest.fixture
async def research(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningSandbox]:
    """A second app's sandbox ([apps.research] of an apps file), its keys where serve reads them."""
    for name, value in RESEARCH_ENV.items():
        monkeypatch.setenv(name, value)
    config = SandboxConfig(app_id=RESEARCH_ID, app_secret=RESEARCH_SECRET, id_prefix="research")
    async with run_sandbox(config) as running:
        yield running


def _research_file(tmp_path: Path, base_url: str) -> Path:
    apps = tmp_path / "research.toml"
    apps.write_text(
        f'[apps.research]\napp_id = "{RESEARCH_ID}"\napp_secret_env = "DOCTOR_RESEARCH_SECRET"\n'
        'encrypt_key_env = "DOCTOR_RESEARCH_KEY"\nverification_token_env = "DOCTOR_RESEARCH_VTOKEN"\n'
        f'domain = "{base_url}"\n'
    )
    return apps


async def test_every_webhook_app_is_challenged_on_its_own_route_with_its_own_keys(
    sandbox: RunningSandbox, research: RunningSandbox, tmp_path: Path
) -> None:
    """Two apps on two sandboxes: the default app (FP_FEISHU__*) and [apps.research] of FP_APPS_FILE."""
    both = _settings(sandbox, tmp_path, apps_file=str(_research_file(tmp_path, research.base_url)))
    await upgrade(both.database_url)
    async with serving(create_app(both, registry=CollectorRegistry())) as url:
        checks = await run_doctor(both.model_copy(update={"public_url": url}), RESEARCH_ENV)
        named = _by_name(checks)
        assert _failed(checks) == {}, render_text(checks)
        assert f"{url}/feishu/callback answered the challenge" in named["callbacks.webhook"].detail
        assert f"{url}/feishu/callback/research answered" in named["callbacks.research.webhook"].detail
        assert named["feishu.research.token"].status is Status.OK
        # Doctor holds another key for research than serve does: only research's check fails.
        other = {**RESEARCH_ENV, "DOCTOR_RESEARCH_KEY": "not-the-key"}
        checks = await run_doctor(both.model_copy(update={"public_url": url}), other)
        refused = _failed(checks)
        assert set(refused) == {"callbacks.research.webhook"}, render_text(checks)
        assert "401" in refused["callbacks.research.webhook"].detail
        assert "[apps.research] encrypt_key_env" in refused["callbacks.research.webhook"].fix
    # A serve started without the apps file has no research route: named, with the fix.
    async with serving(create_app(_settings(sandbox, tmp_path), registry=CollectorRegistry())) as url:
        checks = await run_doctor(both.model_copy(update={"public_url": url}), RESEARCH_ENV)
    missing = _failed(checks)
    assert set(missing) == {"callbacks.research.webhook"}, render_text(checks)
    assert "404" in missing["callbacks.research.webhook"].detail
    assert "FP_APPS_FILE" in missing["callbacks.research.webhook"].fix
    assert sandbox.state.messages == {} and research.state.messages == {}  # doctor sent nothing


async def test_a_ws_app_of_the_file_opens_its_long_connection_and_webhook_apps_are_warned_without_a_url(
    sandbox: RunningSandbox, tmp_path: Path
) -> None:
    apps = _research_file(tmp_path, sandbox.base_url)
    apps.write_text(apps.read_text().replace(RESEARCH_ID, APP_ID) + 'mode = "ws"\n')
    env = {**RESEARCH_ENV, "DOCTOR_RESEARCH_SECRET": APP_SECRET}
    settings = _settings(sandbox, tmp_path, apps_file=str(apps)).model_copy(
        update={"feishu": FeishuSettings()}
    )
    await upgrade(settings.database_url)
    named = _by_name(await run_doctor(settings, env))
    assert named["callbacks.research.long_connection"].status is Status.OK, render_text(list(named.values()))
    assert "callbacks.webhook" not in named  # no FP_FEISHU__* app: nothing on /feishu/callback to check
    webhook = _settings(sandbox, tmp_path, apps_file=str(_research_file(tmp_path, sandbox.base_url)))
    named = _by_name(await run_doctor(webhook, env))
    assert named["callbacks.webhook"].status is Status.WARN
    research = named["callbacks.research.webhook"]
    assert research.status is Status.WARN and "/feishu/callback/research" in research.fix

"""Several Feishu/Lark apps in one service: two apps on two sandboxes (two base URLs), over real HTTP.

The apps file names its secrets only by env reference; each app has its own client, scheduler (budgets,
breaker), callback keys and route. What is checked is what each sandbox holds, not what the service
believes it did.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.apps_file import app_specs, referenced_variables
from feishu_progress.client import FeishuProgressClient
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    CardSettings,
    HttpSettings,
    Settings,
    unknown_variables,
)
from feishu_progress.embedded import EmbeddedService
from feishu_progress.errors import ConfigError
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from tests.rigs import ADMIN_TOKEN, API_TOKEN, AUTH, Client, eventually

REQUESTER = "ou_requester"
# name -> (app_id, secret, encrypt key, verification token); the secrets reach the service only by env.
APPS = {
    "research": ("cli_research", "research-secret", "research-encrypt-key", "research-vtoken"),
    "sales": ("cli_sales", "sales-secret", "sales-encrypt-key", "sales-vtoken"),
}


def apps_toml(base_urls: Mapping[str, str], extra: str = "") -> str:
    tables = []
    for name, (app_id, *_) in APPS.items():
        upper = name.upper()
        tables.append(
            f'[apps.{name}]\napp_id = "{app_id}"\napp_secret_env = "FP_APP_{upper}_SECRET"\n'
            f'encrypt_key_env = "FP_APP_{upper}_ENCRYPT_KEY"\n'
            f'verification_token_env = "FP_APP_{upper}_VERIFICATION_TOKEN"\n'
            f'domain = "{base_urls[name]}"\nmode = "webhook"\n'
        )
    return "\n".join(tables) + extra


def set_app_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each app's secrets in the env vars its table in the apps file names."""
    for name, (_, secret, key, vtoken) in APPS.items():
        monkeypatch.setenv(f"FP_APP_{name.upper()}_SECRET", secret)
        monkeypatch.setenv(f"FP_APP_{name.upper()}_ENCRYPT_KEY", key)
        monkeypatch.setenv(f"FP_APP_{name.upper()}_VERIFICATION_TOKEN", vtoken)


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch) -> None:
    set_app_env(monkeypatch)


@pytest.fixture
async def sandboxes() -> AsyncIterator[dict[str, RunningSandbox]]:
    research, sales = APPS["research"], APPS["sales"]
    async with (
        run_sandbox(SandboxConfig(app_id=research[0], app_secret=research[1], id_prefix="research")) as first,
        run_sandbox(SandboxConfig(app_id=sales[0], app_secret=sales[1], id_prefix="sales")) as second,
    ):
        yield {"research": first, "sales": second}


def settings_for(tmp_path: Path, sandboxes: Mapping[str, RunningSandbox]) -> Settings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    apps_file = tmp_path / "apps.toml"
    apps_file.write_text(apps_toml({name: sb.base_url for name, sb in sandboxes.items()}), encoding="utf-8")
    return Settings(
        _env_file=None,
        apps_file=str(apps_file),
        card=CardSettings(transport="patch"),  # the tests read each message's card in its sandbox
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'app.db'}",
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0, token=ADMIN_TOKEN),
        api=ApiSettings(token=API_TOKEN),
    )


@pytest.fixture
def app_settings(app_env: None, sandboxes: dict[str, RunningSandbox], tmp_path: Path) -> Settings:
    return settings_for(tmp_path, sandboxes)


async def _create(client: Client, app: str | None) -> tuple[int, str]:
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER, "app": app}
    response = await client.post("/v1/tasks", json=body, headers=AUTH)
    assert response.status == 201, await response.text()
    data = await response.json()
    return data["session_id"], data["message_id"]


async def _events(client: Client, session_id: int, *events: Mapping[str, Any]) -> None:
    response = await client.post(
        f"/v1/tasks/{session_id}/events", json={"events": list(events)}, headers=AUTH
    )
    assert response.status == 202, await response.text()


async def _click(
    client: Client, route: str, signer: str, task: tuple[int, str], *, token: str
) -> aiohttp.ClientResponse:
    """A cancel click on ``task``'s card, signed with app ``signer``'s keys, POSTed to ``route``."""
    session_id, message_id = task
    _, _, key, vtoken = APPS[signer]
    payload = card_action_payload(
        open_id=REQUESTER,
        message_id=message_id,
        chat_id="oc_1",
        value={"v": 1, "action": "cancel", "session_id": session_id},
        verification_token=vtoken,
        now=time.time(),
        click_token=token,
        event_id=f"ev-{token}",
    )
    body, headers = signed_request(payload, encrypt_key=key, now=time.time())
    return await client.post(route, data=body, headers=headers)


def _text(sandbox: RunningSandbox, message_id: str) -> str:
    return str(sandbox.state.messages[message_id].card)


async def test_each_apps_cards_land_on_its_own_sandbox(
    client: Client, sandboxes: dict[str, RunningSandbox]
) -> None:
    research_id, research_message = await _create(client, "research")
    sales_id, sales_message = await _create(client, "sales")
    assert research_message in sandboxes["research"].state.messages
    assert research_message not in sandboxes["sales"].state.messages
    assert sales_message in sandboxes["sales"].state.messages
    assert sales_message not in sandboxes["research"].state.messages
    for session_id in (research_id, sales_id):
        await _events(client, session_id, {"type": "finished", "status": "COMPLETED", "content": "done"})
    await eventually(lambda: "done" in _text(sandboxes["research"], research_message))
    await eventually(lambda: "done" in _text(sandboxes["sales"], sales_message))
    view = await (await client.get(f"/v1/tasks/{sales_id}", headers=AUTH)).json()
    assert view["app"] == "sales"


async def test_an_unknown_or_missing_app_is_422_naming_the_known_ones(client: Client) -> None:
    for app in ("nope", None):  # two apps and none is named default: a task must say which
        body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
        response = await client.post("/v1/tasks", json={**body, "app": app}, headers=AUTH)
        assert response.status == 422
        error = await response.json()
        assert error["field"] == "app" and "research" in error["message"] and "sales" in error["message"]


async def test_readyz_and_admin_cards_show_each_app(client: Client) -> None:
    session_id, _ = await _create(client, "sales")
    admin_url = client.server.app[ADMIN_URL]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{admin_url}/readyz") as response:
            ready = await response.json()
        cards_url = f"{admin_url}/admin/cards"
        async with http.get(cards_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as response:
            cards = (await response.json())["cards"]
    assert response.status == 200 and ready["status"] == "ready", ready
    assert set(ready["apps"]) == {"research", "sales"}
    assert all(entry["token"] == "ok" and entry["mode"] == "webhook" for entry in ready["apps"].values())
    assert [(card["session_id"], card["app"]) for card in cards] == [(session_id, "sales")]


async def test_one_apps_outage_leaves_the_others_cards_moving(
    client: Client, sandboxes: dict[str, RunningSandbox]
) -> None:
    tasks = {name: [await _create(client, name) for _ in range(3)] for name in APPS}
    sandboxes["research"].state.faults.outage(endpoints=("patch",))
    for name, created in tasks.items():
        for session_id, _ in created:
            await _events(client, session_id, {"type": "content", "text": f"{name} working"})
            await _events(client, session_id, {"type": "finished", "status": "COMPLETED", "content": "fin"})
    # While research's Open API is down, sales delivers every final.
    await eventually(lambda: all("fin" in _text(sandboxes["sales"], m) for _, m in tasks["sales"]))
    assert not any("fin" in _text(sandboxes["research"], m) for _, m in tasks["research"])
    scheduler = {app.name: app.scheduler for app in client.server.app[SERVICES].apps or ()}
    assert scheduler["research"].breaker.opened_at is not None  # research's breaker, and only research's
    assert scheduler["sales"].breaker.opened_at is None
    metrics = client.server.app[SERVICES].metrics
    assert metrics.value("fp_patches_total", {"app": "research", "outcome": "backoff"}) > 0
    assert metrics.value("fp_patches_total", {"app": "sales", "outcome": "backoff"}) == 0
    # At least each final (content and final may go out as one write: newest state wins).
    assert metrics.value("fp_patches_total", {"app": "sales", "outcome": "delivered"}) >= 3
    assert metrics.value("fp_breaker_open", {"app": "research"}) == 1
    assert metrics.value("fp_breaker_open", {"app": "sales"}) == 0
    sandboxes["research"].state.faults.clear()
    await eventually(
        lambda: all("fin" in _text(sandboxes["research"], m) for _, m in tasks["research"]), timeout=15
    )
    for sandbox in sandboxes.values():  # each app kept within its own budget: no rate-limit answer
        assert sandbox.state.responses.get(99991400, 0) == 0 and sandbox.state.responses.get(230020, 0) == 0


async def test_a_click_counts_only_on_its_apps_route_and_once(
    client: Client, sandboxes: dict[str, RunningSandbox]
) -> None:
    session_id, message_id = await _create(client, "research")
    # Signed with sales' keys on research's route: research's keys refuse it.
    wrong_key = await _click(
        client, "/feishu/callback/research", "sales", (session_id, message_id), token="k1"
    )
    assert wrong_key.status == 401
    # Signed with research's keys on sales' route: refused the same way.
    wrong_route = await _click(
        client, "/feishu/callback/sales", "research", (session_id, message_id), token="k1"
    )
    assert wrong_route.status == 401
    # Properly signed by sales, for a card of research: verified, but not sales' card to act on.
    cross = await _click(client, "/feishu/callback/sales", "sales", (session_id, message_id), token="k1")
    assert cross.status == 200 and (await cross.json())["toast"]["type"] == "error"
    # The same click on the right route is taken, once (a redelivery is deduped).
    for _ in range(2):
        right = await _click(
            client, "/feishu/callback/research", "research", (session_id, message_id), token="k1"
        )
        assert right.status == 200
    actions = await (await client.get(f"/v1/tasks/{session_id}/actions", headers=AUTH)).json()
    assert [action["kind"] for action in actions["actions"]] == ["cancel"]
    unknown = await _click(
        client, "/feishu/callback/nobody", "research", (session_id, message_id), token="k2"
    )
    assert unknown.status == 404


async def test_a_task_keeps_its_app_across_a_restart(
    app_env: None, sandboxes: dict[str, RunningSandbox], tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = settings_for(tmp_path, sandboxes)
    first: Client = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    session_id, message_id = await _create(first, "sales")
    await _events(first, session_id, {"type": "content", "text": "before"})
    await first.close()  # a restart: the task is unfinished
    second: Client = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    await _events(second, session_id, {"type": "finished", "status": "COMPLETED", "content": "after"})
    await eventually(lambda: "after" in _text(sandboxes["sales"], message_id))
    view = await (await second.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert view["app"] == "sales"
    assert not sandboxes["research"].state.messages  # nothing went to the other app


# -- the apps file ------------------------------------------------------------------------------------


def _specs(tmp_path: Path, text: str, environ: Mapping[str, str]) -> list[Any]:
    path = tmp_path / "apps.toml"
    path.write_text(text, encoding="utf-8")
    return app_specs(Settings(_env_file=None, apps_file=str(path)), environ)


ENV = {"S": "s3cr3t-value", "K": "key", "S2": "secret2"}
GOOD = '[apps.a]\napp_id = "cli_a"\napp_secret_env = "S"\nencrypt_key_env = "K"\n'


def test_an_apps_file_takes_its_secrets_only_by_env_reference(tmp_path: Path) -> None:
    text = GOOD + 'domain = "lark"\n[apps.a.rate]\napp_per_second = 20\napp_per_minute = 600\n'
    [spec] = _specs(tmp_path, text, ENV)
    assert spec.name == "a" and spec.feishu.app_id == "cli_a"
    assert spec.feishu.app_secret is not None and spec.feishu.app_secret.get_secret_value() == "s3cr3t-value"
    assert spec.feishu.base_url == "https://open.larksuite.com"  # Lark international
    assert (spec.rate.app_per_second, spec.rate.app_per_minute) == (20, 600)
    card_content = spec.rate.for_api("card_content")  # every API of the app is capped, CardKit's too
    assert (card_content.app_per_second, card_content.app_per_minute) == (20, 600)
    assert "s3cr3t-value" not in repr(spec)  # never printed


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (GOOD.replace('"S"', '"MISSING"'), ["app 'a'", "app_secret_env", "MISSING"]),
        (GOOD + "colour = 1\n", ["app 'a'", "'colour'"]),
        (GOOD + 'app_secret = "inline"\n', ["app 'a'", "'app_secret'"]),
        (GOOD + "[apps.a.rate]\nper_hour = 1\n", ["app 'a'", "rate.per_hour"]),
        (GOOD + "[apps.a.rate]\napp_per_second = 0\n", ["app 'a'", "rate.app_per_second"]),
        (GOOD + 'domain = "ftp://x"\n', ["app 'a'", "domain"]),
        (GOOD + 'mode = "poll"\n', ["app 'a'", "mode"]),
        (
            GOOD + '[apps.b]\napp_id = "cli_a"\napp_secret_env = "S2"\nencrypt_key_env = "K"\n',
            ["'b'", "cli_a"],
        ),
        ('[apps.a]\napp_id = "cli_a"\napp_secret_env = "S"\n', ["app 'a'", "encrypt_key_env"]),
        ('[apps."Bad Name"]\napp_id = "x"\n', ["'Bad Name'"]),
        ("[apps.a\n", ["not valid TOML"]),
        ("[other]\n", ["'other'"]),
    ],
)
def test_a_bad_apps_file_is_refused_naming_the_app_and_the_key(
    tmp_path: Path, text: str, named: list[str]
) -> None:
    with pytest.raises(ConfigError) as refused:
        _specs(tmp_path, text, ENV)
    for part in named:
        assert part in str(refused.value)


def test_a_bad_apps_file_stops_the_service_before_it_serves(tmp_path: Path) -> None:
    path = tmp_path / "apps.toml"
    path.write_text(GOOD.replace('"S"', '"FP_NOT_SET_ANYWHERE"'), encoding="utf-8")
    settings = Settings(_env_file=None, apps_file=str(path), api=ApiSettings(token=API_TOKEN))
    with pytest.raises(ConfigError, match="FP_NOT_SET_ANYWHERE"):
        create_app(settings, registry=CollectorRegistry())


def test_several_apps_may_use_the_long_connection(tmp_path: Path) -> None:
    text = (
        '[apps.a]\napp_id = "cli_a"\napp_secret_env = "S"\nmode = "ws"\n'
        '[apps.b]\napp_id = "cli_b"\napp_secret_env = "S2"\nmode = "ws"\ndomain = "lark"\n'
    )
    specs = _specs(tmp_path, text, ENV)
    assert [(spec.name, spec.feishu.mode, spec.feishu.base_url) for spec in specs] == [
        ("a", "ws", "https://open.feishu.cn"),
        ("b", "ws", "https://open.larksuite.com"),
    ]


def test_without_an_apps_file_there_is_one_default_app() -> None:
    [spec] = app_specs(Settings(_env_file=None))
    assert spec.name == "default"


async def test_the_python_client_and_the_embedded_api_take_app(
    client: Client, sandboxes: dict[str, RunningSandbox], tmp_path: Path
) -> None:
    base_url = str(client.make_url("")).rstrip("/")
    async with FeishuProgressClient(base_url, API_TOKEN) as fp:
        created = await fp.create_task(
            receive_id="oc_1", receive_id_type="chat_id", requester_open_id=REQUESTER, app="sales"
        )
    assert created.message_id in sandboxes["sales"].state.messages
    settings = settings_for(tmp_path / "embedded", sandboxes)
    async with EmbeddedService(settings, serve_http=False) as embedded:
        task = await embedded.create_task(
            receive_id="oc_1", receive_id_type="chat_id", requester_open_id=REQUESTER, app="research"
        )
        assert (await embedded.get_task(task.session_id))["app"] == "research"
    assert task.message_id in sandboxes["research"].state.messages


def test_the_env_vars_an_apps_file_names_are_not_reported_as_unknown_settings(tmp_path: Path) -> None:
    path = tmp_path / "apps.toml"
    path.write_text(GOOD.replace('"S"', '"FP_APP_A_SECRET"'), encoding="utf-8")
    settings = Settings(_env_file=None, apps_file=str(path))
    environ = {"FP_APP_A_SECRET": "x", "K": "k", "FP_APP_A_SECRT": "typo"}
    assert unknown_variables(environ, referenced_variables(settings)) == ["FP_APP_A_SECRT"]

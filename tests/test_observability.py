"""The dashboard (deploy/grafana) and the alert rules (deploy/prometheus) read metrics the service exports.

A running app is scraped at its admin ``/metrics``: in sandbox mode (single mode: the delivery, runtime and
readiness metrics) and in cluster mode on MariaDB and Redis (the lease and the shared budget). Every metric
name in every dashboard expression and alert rule must be exported by one of them. The rules and the
dashboard's expressions are also checked by ``promtool`` when it is installed (Debian: ``prometheus``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    CardSettings,
    ClusterSettings,
    FeishuSettings,
    HttpSettings,
    Settings,
)
from feishu_progress.sandbox import RunningSandbox
from tests.rigs import APP_ID, APP_SECRET, eventually

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "feishu-progress.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bfp_[a-z0-9_]+\b")
CLUSTER_ONLY = re.compile(r"^fp_cluster_")
REQUIRED_ALERTS = {
    "FeishuRateLimited",
    "FeishuBreakerOpen",
    "FinalCardsPending",
    "CallbackSlow",
    "ClusterLeaseLost",
    "RedisFallback",
    "DatabaseNotReady",
}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def names_in(expressions: list[str]) -> set[str]:
    return {name for expression in expressions for name in METRIC.findall(expression)}


def exported_names(exposition: str) -> set[str]:
    """Every series name a query may use: sample names, and each family's even without a sample yet."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names.update({f"{name}_bucket", f"{name}_count", f"{name}_sum"})
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def sandbox_settings(tmp_path: Path) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'metrics.db'}",
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token="metrics-token"),
    )


async def scrape(client: TestClient[Any, Any]) -> str:
    admin_url = client.app[ADMIN_URL]
    async with aiohttp.ClientSession() as http, http.get(f"{admin_url}/metrics") as response:
        assert response.status == 200
        return await response.text()


@pytest.fixture
async def single_mode_metrics(tmp_path: Path, aiohttp_client: Any) -> AsyncIterator[set[str]]:
    client: TestClient[Any, Any] = await aiohttp_client(
        create_app(sandbox_settings(tmp_path), registry=CollectorRegistry())
    )
    yield exported_names(await scrape(client))


async def test_a_final_state_held_back_by_feishu_shows_its_age_and_budget_use_is_reported(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = sandbox_settings(tmp_path).model_copy(update={"card": CardSettings(transport="patch")})
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    services = client.app[SERVICES]
    sandbox = services.sandbox
    assert sandbox is not None
    headers = {"Authorization": "Bearer metrics-token"}
    body = {"receive_id": "oc_m", "receive_id_type": "chat_id", "requester_open_id": "ou_m", "title": "t"}
    created = await client.post("/v1/tasks", json=body, headers=headers)
    session_id = (await created.json())["session_id"]
    sandbox.state.faults.fail(1.0, status=503, endpoints=("patch",))  # Feishu down for card updates
    finished = {"events": [{"type": "finished", "status": "COMPLETED", "content": "done"}]}
    assert (await client.post(f"/v1/tasks/{session_id}/events", json=finished, headers=headers)).status == 202

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return services.metrics.value(name, labels)

    await eventually(  # the final waits, and ages
        lambda: sample("fp_oldest_pending_final_seconds"), until=lambda age: age >= 0.2, timeout=10
    )
    assert (
        sample("fp_budget_minute_use_ratio", {"app": "default", "api": "patch"}) > 0
    )  # the failed tries count
    # Every write is counted by API (no tracer provider here: counting needs no [otel]).
    assert sample("fp_open_api_writes_total", {"app": "default", "api": "patch", "result": "error"}) > 0
    assert sample("fp_open_api_writes_total", {"app": "default", "api": "send", "result": "ok"}) == 1
    sandbox.state.faults.clear()
    await eventually(  # delivered: nothing waits
        lambda: sample("fp_oldest_pending_final_seconds"), until=lambda age: age <= 0, timeout=15
    )
    async with aiohttp.ClientSession() as http, http.get(f"{client.app[ADMIN_URL]}/readyz") as ready:
        assert ready.status == 200
    assert sample("fp_readiness_ok", {"check": "database"}) == 1
    assert sample("fp_readiness_ok", {"check": "database_holder"}) == 1
    assert sample("fp_open_api_writes_total", {"api": "patch", "result": "ok"}) >= 1  # the final went out


def test_the_alerts_cover_what_operators_are_paged_for_each_with_a_runbook_line() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(rules) >= REQUIRED_ALERTS
    runbooks = (REPO / "deploy" / "README.md").read_text()
    section = runbooks[runbooks.index("## Alerts and what to do") :]
    for name, rule in rules.items():
        assert "deploy/README.md#alerts-and-what-to-do" in rule["annotations"]["runbook"], name
        assert f"**{name}**" in section, f"{name} has no runbook line in deploy/README.md"


async def test_every_single_mode_metric_the_dashboard_and_alerts_use_is_exported(
    single_mode_metrics: set[str],
) -> None:
    used = names_in(dashboard_expressions()) | names_in([rule["expr"] for rule in alert_rules()])
    single_mode = {name for name in used if not CLUSTER_ONLY.match(name)}
    assert single_mode - single_mode_metrics == set()
    # The scrape itself is not vacuous: state read at scrape time and readiness are there.
    assert {"fp_oldest_pending_final_seconds", "fp_budget_minute_use_ratio", "fp_readiness_ok"} <= (
        single_mode_metrics
    )
    assert "fp_database_holder_lost" in single_mode_metrics


@pytest.mark.mysql
async def test_every_cluster_metric_the_dashboard_and_alerts_use_is_exported(
    mysql_url: str, aiohttp_client: Any, sandbox: RunningSandbox
) -> None:
    redis_url = os.environ.get("FP_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")
    client: TestClient[Any, Any] = await aiohttp_client(
        create_app(cluster_settings(mysql_url, redis_url, sandbox), registry=CollectorRegistry())
    )
    exported = exported_names(await scrape(client))
    await client.close()
    used = names_in(dashboard_expressions()) | names_in([rule["expr"] for rule in alert_rules()])
    cluster = {name for name in used if CLUSTER_ONLY.match(name) or name.startswith("fp_budget_")}
    assert cluster and cluster - exported == set()
    assert "fp_database_holder_lost" not in exported  # cluster mode holds no database alone


def cluster_settings(mysql_url: str, redis_url: str, sandbox: RunningSandbox) -> Settings:
    return Settings(
        database_url=mysql_url,
        redis_url=redis_url,
        instance_id="fp-metrics-test",
        cluster=ClusterSettings(secret="metrics-cluster-secret-" + "x" * 16),
        feishu=FeishuSettings(
            base_url=sandbox.base_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            encrypt_key="metrics-key",
            verification_token="metrics-vtoken",
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token="metrics-token"),
    )


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "feishu-progress" and dashboard["title"]
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["targets"] and all(target["expr"] for target in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt: prometheus)")
def test_promtool_accepts_the_rules_and_every_dashboard_expression(tmp_path: Path) -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Dashboard queries as recording rules: promtool parses each one as PromQL.
    recording = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{index}", "expr": expression}
                    for index, expression in enumerate(dashboard_expressions())
                ],
            }
        ]
    }
    queries = tmp_path / "dashboard-queries.yaml"
    queries.write_text(yaml.safe_dump(recording))
    parsed = subprocess.run(
        ["promtool", "check", "rules", str(queries)], capture_output=True, text=True, check=False
    )
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr

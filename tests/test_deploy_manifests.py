"""deploy/: every compose file and Kubernetes manifest parses, and the cluster ones run what the README
promises. There is no docker or kubectl here, so this reads the YAML (with pyyaml, when it is installed:
it is no dependency of ours); it cannot tell whether Compose or Kubernetes would accept every field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.config import setting_names

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.yaml")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_deploy_file_parses(path: Path) -> None:
    assert documents(path), f"{path} holds no YAML document"


def test_the_cluster_compose_runs_two_named_instances_on_one_mysql_and_redis_behind_a_balancer() -> None:
    (compose,) = documents(DEPLOY / "compose.cluster.yaml")
    services = compose["services"]
    serving = {name: s for name, s in services.items() if s.get("command") == ["feishu-progress", "serve"]}
    assert len(serving) == 2
    envs = [s["environment"] for s in serving.values()]
    assert len({env["FP_INSTANCE_ID"] for env in envs}) == 2
    assert {env["FP_REDIS_URL"] for env in envs} == {"redis://redis:6379/0"}
    assert all(env["FP_CLUSTER__SECRET"].startswith("${FP_CLUSTER__SECRET:?") for env in envs)
    assert len({env["FP_DATABASE_URL"] for env in envs}) == 1 and "@mysql:3306/" in envs[0]["FP_DATABASE_URL"]
    for service in serving.values():
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["build"]["args"]["FP_EXTRAS"].endswith(":-cluster}")  # redis-py is in the image
        assert all(port.startswith("127.0.0.1:") for port in service["ports"]), "admin stays on loopback"
    assert services["migrate"]["command"] == ["feishu-progress", "migrate"]
    assert {"mysql", "redis", "lb"} <= services.keys()
    upstream = compose["configs"]["lb-nginx"]["content"]
    assert all(f"server {name}:8000" in upstream for name in serving)


def test_the_cluster_deployment_has_two_replicas_named_by_their_pods_and_a_disruption_budget() -> None:
    (deployment,) = documents(DEPLOY / "k8s" / "cluster" / "deployment.yaml")
    (pdb,) = documents(DEPLOY / "k8s" / "cluster" / "pdb.yaml")
    (single,) = documents(DEPLOY / "k8s" / "deployment.yaml")
    spec = deployment["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (container,) = spec["template"]["spec"]["containers"]
    env = {item["name"]: item.get("valueFrom", item.get("value")) for item in container["env"]}
    assert env["FP_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["FP_REDIS_URL"]["secretKeyRef"] == {"name": "feishu-progress", "key": "FP_REDIS_URL"}
    secret = {"name": "feishu-progress", "key": "FP_CLUSTER__SECRET"}
    assert env["FP_CLUSTER__SECRET"]["secretKeyRef"] == secret, "instances trust each other by it"
    assert pdb["kind"] == "PodDisruptionBudget" and pdb["spec"]["minAvailable"] == 1
    labels = spec["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # It replaces the single-replica Deployment: same name and labels, so the Services select it.
    assert deployment["metadata"]["name"] == single["metadata"]["name"]
    assert labels == single["spec"]["template"]["metadata"]["labels"]
    assert single["spec"]["replicas"] == 1 and single["spec"]["strategy"]["type"] == "Recreate"


def test_env_example_lists_every_setting() -> None:
    """deploy/.env.example claims every FP_ setting: a new setting without a line there fails here."""
    text = (DEPLOY / ".env.example").read_text(encoding="utf-8")
    listed = set(re.findall(r"^#? ?(FP_[A-Z0-9_]+)=", text, re.MULTILINE))
    assert sorted(set(setting_names()) - listed) == []
    assert sorted(listed - set(setting_names())) == []  # and nothing it lists is a typo


def test_the_cluster_pods_advertise_their_ip_on_the_public_port() -> None:
    """Forwarding needs an address peers resolve: the pod IP (defined before it is referenced)."""
    (deployment,) = documents(DEPLOY / "k8s" / "cluster" / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = [item["name"] for item in container["env"]]
    env = {item["name"]: item for item in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert names.index("POD_IP") < names.index("FP_CLUSTER__ADVERTISE_URL")
    (http,) = [port for port in container["ports"] if port["name"] == "http"]
    assert env["FP_CLUSTER__ADVERTISE_URL"]["value"] == f"http://$(POD_IP):{http['containerPort']}"

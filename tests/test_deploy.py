"""The deployment in deploy/, checked offline (no container daemon here): the Kubernetes
manifests rendered by `kubectl kustomize` and validated against the API schemas that
kubernetes-validate bundles, compose.yaml against the Compose Specification's JSON schema
(the copy check-jsonschema vendors), the Dockerfile's structure, and the configuration
the containers get parsed by redline's own loader."""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from redline.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.32.0"  # the oldest the manifests promise (preStop `sleep` is GA from 1.30)


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is not installed")
        pytest.skip("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one `kind` named `name` (or `name-<hash>`, kustomize's generated ConfigMaps)."""
    exact = re.compile(re.escape(name) + r"(-[a-z0-9]{10})?$")
    found = [d for d in docs if d["kind"] == kind and exact.match(d["metadata"]["name"])]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def test_every_rendered_manifest_validates_strictly(manifests: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in manifests)
    assert kinds == sorted(["Namespace", "ConfigMap", "ConfigMap", "ConfigMap", "Service", "Service",
                            "Deployment", "Deployment", "StatefulSet", "PodDisruptionBudget",
                            "HorizontalPodAutoscaler"])
    for doc in manifests:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"].get("namespace", "redline") == "redline"


def test_the_validator_rejects_a_misspelt_field(manifests: list[dict[str, Any]]) -> None:
    bad = copy.deepcopy(one(manifests, "Deployment", "redline-gateway"))
    container(bad)["readinessProbe"]["httpGett"] = container(bad)["readinessProbe"].pop("httpGet")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_gateways_are_ready_on_readyz_and_drain_before_they_stop(manifests: list[dict[str, Any]]) -> None:
    gw = one(manifests, "Deployment", "redline-gateway")
    pod = gw["spec"]["template"]["spec"]
    c = container(gw)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(env_of(c)["REDLINE_LIMITS__DRAIN_TIMEOUT_S"])
    assert sleep + drain < pod["terminationGracePeriodSeconds"]  # the drain is never cut short
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert gw["spec"]["replicas"] >= 2 and gw["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    svc = one(manifests, "Service", "redline")
    assert svc["spec"]["selector"] == gw["spec"]["selector"]["matchLabels"]
    assert env_of(c)["REDLINE_STORE__URL"].startswith("redis://redline-redis:")
    config = next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"]
    one(manifests, "ConfigMap", config)  # the generated (hash-suffixed) name is wired in


def test_disruption_budget_and_autoscaler_target_the_gateways(manifests: list[dict[str, Any]]) -> None:
    gw = one(manifests, "Deployment", "redline-gateway")
    labels = gw["spec"]["template"]["metadata"]["labels"]
    pdb = one(manifests, "PodDisruptionBudget", "redline-gateway")
    assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    assert pdb["spec"]["maxUnavailable"] == 1
    hpa = one(manifests, "HorizontalPodAutoscaler", "redline-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": gw["metadata"]["name"]}
    assert hpa["spec"]["minReplicas"] >= 2
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    # a metric redline exports, which the adapter's rule serves under that name
    from redline.telemetry.metrics import Metrics

    exported = {m.name for m in Metrics().registry.collect()}
    assert metric in exported
    rules = yaml.safe_load(one(manifests, "ConfigMap", "redline-prometheus-adapter")["data"]["config.yaml"])
    rule = rules["rules"][0]
    assert rule["seriesQuery"].startswith(metric + "{") and rule["name"]["as"] == metric
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    annotations = gw["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"


def test_redis_persists_to_a_volume(manifests: list[dict[str, Any]]) -> None:
    redis = one(manifests, "StatefulSet", "redline-redis")
    args = container(redis)["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    mount = container(redis)["volumeMounts"][0]
    assert mount["mountPath"] == args[args.index("--dir") + 1]
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == mount["name"]


def test_the_dashboard_config_map_is_the_shipped_dashboard(manifests: list[dict[str, Any]]) -> None:
    cm = one(manifests, "ConfigMap", "redline-grafana-dashboard")
    assert json.loads(cm["data"]["redline.json"]) == json.loads((DEPLOY / "grafana/redline.json").read_text())


# -- compose ---------------------------------------------------------------------------

def compose_schema() -> dict[str, Any]:
    ref = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(ref.read_text())  # type: ignore[no-any-return]


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())  # type: ignore[no-any-return]


def test_compose_file_follows_the_compose_specification() -> None:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    doc = compose()
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, "\n".join(e.message for e in errors)
    doc["services"]["gateway-1"]["stop_grace_priod"] = "40s"  # and a typo is caught
    assert any(validator.iter_errors(doc))


def test_compose_topology() -> None:
    doc = compose()
    services = doc["services"]
    gateways = [n for n, s in services.items() if s.get("command", [""])[0] == "serve"]
    assert len(gateways) == 2
    workers = [n for n, s in services.items() if s.get("command", [""])[0] == "worker"]
    assert workers == ["worker"]
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert any(v.startswith("redis-data:/data") for v in services["redis"]["volumes"])
    assert "redis-data" in doc["volumes"]
    for name in gateways + workers:
        s = services[name]
        assert s["environment"]["REDLINE_STORE__URL"] == "redis://redis:6379/0"
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"
    # every file mounted from the repository exists
    for s in services.values():
        for v in s.get("volumes", []):
            src = v.split(":", 1)[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), src
    prom = yaml.safe_load((DEPLOY / "compose/prometheus.yml").read_text())
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert sorted(targets) == sorted(f"{g}:8000" for g in gateways)
    grafana_mounts = " ".join(services["grafana"]["volumes"])
    assert "grafana/redline.json" in grafana_mounts and "grafana/provisioning/dashboards" in grafana_mounts
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/redline.yml").read_text())
    assert f"{provider['providers'][0]['options']['path']}/redline.json" in grafana_mounts


# -- the image and its configuration ----------------------------------------------------

def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), one list per stage."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_dockerfile_is_multi_stage_non_root_with_the_models_baked_in() -> None:
    build, runtime = stages()
    assert re.match(r"FROM \S+ AS build$", build[0]) and re.match(r"FROM \S+ AS runtime$", runtime[0])
    user = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert any("python -m redline.models /var/lib/redline/models" in line for line in build)
    assert any(line.startswith("COPY --from=build") and "/var/lib/redline" in line for line in runtime)
    assert not any(line.startswith(("RUN apt-get", "RUN pip")) and "build-essential" in line
                   for line in runtime)  # no compiler in the image that runs
    # the sources it copies exist, and the ignore file lets them through
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for line in build + runtime:
        if line.startswith("COPY") and "--from" not in line:
            for src in line.split()[1:-1]:
                if not src.startswith("--"):
                    assert (ROOT / src).exists(), src
                    assert f"!{src}" in ignore or f"!{src}/**" in ignore, src
    # the model packages are the versions the Makefile installs
    makefile = (ROOT / "Makefile").read_text()
    for pin in re.findall(r"[a-z0-9-]+==[0-9.]+", " ".join(build)):
        assert pin in makefile or pin in (ROOT / "pyproject.toml").read_text(), pin


def test_the_containers_configuration_loads(monkeypatch: pytest.MonkeyPatch,
                                            manifests: list[dict[str, Any]]) -> None:
    runtime_env = {}
    for line in stages()[1]:
        if line.startswith("ENV "):
            runtime_env.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    gateway = env_of(container(one(manifests, "Deployment", "redline-gateway")))
    for env in (runtime_env | compose()["services"]["gateway-1"]["environment"], runtime_env | gateway):
        for k, v in env.items():
            if k.startswith("REDLINE_"):
                monkeypatch.setenv(k, v)
        cfg = load_config(DEPLOY / "config/redline.yaml")
        assert cfg.store.url == "redis://" + env["REDLINE_STORE__URL"].split("://", 1)[1]
        assert cfg.server.host == "0.0.0.0" and cfg.server.data_dir == "/var/lib/redline"
        assert cfg.jobs.worker_in_server is False  # the worker service runs the jobs
    grace = compose()["x-redline"]["stop_grace_period"]
    assert cfg.limits.drain_timeout_s < int(grace.rstrip("s"))

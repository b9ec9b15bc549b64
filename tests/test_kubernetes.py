"""The Kubernetes manifests: validated against the Kubernetes schemas (no cluster here).

Built-in kinds go through `kubernetes-validate` (the API's own OpenAPI schemas, strict:
an unknown field is an error); KEDA's ScaledObject through its CRD's schema.
"""

import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.config import DEFAULT_MODELS, Settings
from tests import batch_sim
from tests.engine_fixtures import wait_status
from tests.harness import running_server

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "docker" / "kubernetes"
KUBERNETES_VERSION = "1.33.0"
KEDA_SCHEMA = yaml.safe_load((Path(__file__).parent / "keda_scaledobject.schema.yaml").read_text())


def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return loaded


def manifests() -> list[dict[str, Any]]:
    return [
        doc
        for name in kustomization()["resources"]
        for doc in yaml.safe_load_all((K8S / name).read_text())
        if doc
    ]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests() if m["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


@pytest.mark.parametrize(
    "manifest", manifests(), ids=lambda m: f"{m['kind']}/{m['metadata']['name']}"
)
def test_every_manifest_is_valid(manifest: dict[str, Any]) -> None:
    if manifest["apiVersion"].startswith("keda.sh/"):
        jsonschema.validate(manifest, KEDA_SCHEMA)
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The validators refuse what a cluster would: a misspelt field, a wrong type."""
    api = by_kind("Deployment")["overnight-api"]
    broken = {**api, "spec": {**api["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    scaled = by_kind("ScaledObject")["overnight-worker-chat"]
    trigger = {**scaled["spec"]["triggers"][0], "metadata": {"threshold": 1000}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {**scaled, "spec": {**scaled["spec"], "triggers": [trigger]}}, KEDA_SCHEMA
        )


def test_the_kustomization_is_complete() -> None:
    k = kustomization()
    assert all((K8S / name).is_file() for name in k["resources"])
    [secrets] = k["secretGenerator"]
    assert secrets["name"] == "overnight-secrets"
    for env_file in secrets["envs"]:
        assert (K8S / f"{env_file}.example").is_file(), "the secrets file is made from its example"
        assert f"docker/kubernetes/{env_file}" in (ROOT / ".gitignore").read_text().split()
    config = {m["metadata"]["name"] for m in manifests() if m["kind"] == "ConfigMap"}
    for deployment in by_kind("Deployment").values():
        refs = container(deployment)["envFrom"]
        assert {r["configMapRef"]["name"] for r in refs if "configMapRef" in r} <= config
        assert {r["secretRef"]["name"] for r in refs if "secretRef" in r} == {"overnight-secrets"}
        assert container(deployment)["image"] in {i["name"] for i in k["images"]}
    example = (K8S / "secrets.env.example").read_text()
    for key in ("OVERNIGHT_DATABASE_URL", "OVERNIGHT_ADMIN_KEY", "AWS_SECRET_ACCESS_KEY"):
        assert f"\n{key}=" in example or example.startswith(f"{key}="), key


def test_the_api_is_replicated_behind_a_service_with_both_probes() -> None:
    api = by_kind("Deployment")["overnight-api"]
    assert api["spec"]["replicas"] >= 2
    main = container(api)
    assert main["command"][:2] == ["overnight", "api"]
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = by_kind("Service")["overnight-api"]
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    config = by_kind("ConfigMap")["overnight-config"]["data"]
    assert config["OVERNIGHT_STORAGE_URL"].startswith("s3://"), "no shared volume: a bucket"


def test_the_schema_is_migrated_before_the_api_starts() -> None:
    """`overnight db upgrade` in an init container, with the API's image and settings: no
    replica serves before the schema is at head (replicas starting together take turns)."""
    api = by_kind("Deployment")["overnight-api"]
    [migrate] = api["spec"]["template"]["spec"]["initContainers"]
    assert migrate["command"] == ["overnight", "db", "upgrade"]
    main = container(api)
    assert (migrate["image"], migrate["envFrom"]) == (main["image"], main["envFrom"])


def test_a_gpu_worker_deployment_per_model_that_outlasts_its_drain() -> None:
    workers = {n: d for n, d in by_kind("Deployment").items() if n.startswith("overnight-worker-")}
    served = {container(d)["command"][2] for d in workers.values()}
    assert served == {m.name for m in DEFAULT_MODELS}
    drain = float(
        by_kind("ConfigMap")["overnight-config"]["data"]["OVERNIGHT_WORKER_DRAIN_SECONDS"]
    )
    for deployment in workers.values():
        assert container(deployment)["command"][:2] == ["overnight", "worker"]
        assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == 1
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= drain + 30, "the drain and the engine's shutdown fit in the grace period"
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]


def test_each_model_scales_on_its_own_queue(settings: Settings) -> None:
    """Every worker Deployment has a ScaledObject whose query, run on what the API exports,
    is that model's queue: the requests of a batch for one model move only its query."""
    workers = {n: d for n, d in by_kind("Deployment").items() if n.startswith("overnight-worker-")}
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in by_kind("ScaledObject").values()}
    assert scaled.keys() == workers.keys()
    queries = {}
    for name, deployment in workers.items():
        [trigger] = scaled[name]["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        queries[container(deployment)["command"][2]] = trigger["metadata"]["query"]
    with running_server(settings) as server:
        idle = evaluate_all(queries, server.url)
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        f = client.files.create(file=("in.jsonl", batch_sim.requests_file(7)), purpose="batch")
        batch = client.batches.create(
            input_file_id=f.id, endpoint=batch_sim.CHAT, completion_window="24h"
        )
        wait_status(client, batch.id, "in_progress")
        queued = evaluate_all(queries, server.url)
    assert idle == {model: 0 for model in queries}, "an idle model's query has a value: 0"
    assert queued == {model: 7 if model == batch_sim.MODEL else 0 for model in queries}


QUERY = re.compile(r'^max\((?P<name>\w+)\{model="(?P<model>[^"]+)"\}\)$')


def evaluate_all(queries: dict[str, str], url: str) -> dict[str, float]:
    """Each query (`max(metric{model="…"})`, the one form the manifests use) on `/metrics`."""
    exported = list(text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text))
    values = {}
    for model, query in queries.items():
        match = QUERY.match(query)
        assert match, f"not max(metric{{model=...}}): {query}"
        assert match["model"] == model, f"{model}'s workers scale on {match['model']}'s queue"
        samples = [
            s.value
            for family in exported
            for s in family.samples
            if s.name == match["name"] and s.labels == {"model": model}
        ]
        assert samples, f"{query} matches nothing the API exports"
        values[model] = max(samples)
    return values

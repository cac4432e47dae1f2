"""The Kubernetes manifests in deploy/k8s, checked without a cluster.

Every object of a built-in kind is validated against the Kubernetes JSON schemas that the
``kubernetes-validate`` package ships (strict: unknown fields are errors), for the oldest
version the manifests claim and the newest the package knows. The references between objects
are resolved (Services to pods and ports, probes to ports, env to ConfigMap and Secret keys,
KEDA to its Deployment and Secret), and the containers are held to the package: each runs a real
``sessionfold`` subcommand, sets only settings ``Settings`` reads, in values it accepts. The
KEDA objects have no schema offline; their structure is checked, and the Redis list they watch is
the one the package's Celery app really enqueues fold jobs to (on an embedded Redis server).
The autoscaler itself is not exercised here: there is no cluster and no KEDA.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
#: The oldest Kubernetes the manifests are meant for, and the newest the schemas know.
KUBE_VERSIONS = ("1.27", ".".join(latest_version().split(".")[:2]))
NOT_APPLIED = {"secret.example.yaml"}  # a template, created by hand (see its header)
KEDA_API = "keda.sh/v1alpha1"


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


OBJECTS: list[tuple[str, dict[str, Any]]] = [
    (f"{p.relative_to(K8S)}:{d['kind']}/{d['metadata']['name']}", d)
    for p in _files() for d in _load(p)]
BUILTIN = [(where, doc) for where, doc in OBJECTS if not doc["apiVersion"].startswith("keda.sh/")]


def _objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in OBJECTS if d["kind"] == kind}


def _pod_specs() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(owner, pod template metadata, pod spec)`` of every workload."""
    for _, doc in OBJECTS:
        if doc["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"}:
            template = doc["spec"]["template"]
            yield f"{doc['kind']}/{doc['metadata']['name']}", template["metadata"], template["spec"]


CONTAINERS = [(f"{owner}/{c['name']}", c) for owner, _, spec in _pod_specs()
              for c in spec["containers"]]


# --- schemas -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(("where", "doc"), BUILTIN, ids=[w for w, _ in BUILTIN])
def test_each_object_follows_the_kubernetes_schema(where: str, doc: dict[str, Any],
                                                   version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{where} against {version}: {path}: {exc.message}")


def test_the_schema_check_catches_unknown_fields_and_wrong_types() -> None:
    deployment = _objects("Deployment")["sessionfold-worker"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["argz"] = ["worker"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[-1], strict=True)


def test_every_object_lives_in_the_sessionfold_namespace() -> None:
    (namespace,) = _objects("Namespace")
    for where, doc in OBJECTS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == namespace, where


def test_kustomization_applies_every_manifest_but_the_template_and_keda() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    top_level = sorted(p.name for p in K8S.glob("*.yaml")
                       if p.name != "kustomization.yaml" and p.name not in NOT_APPLIED)
    assert sorted(listed) == top_level
    (namespace,) = _objects("Namespace")
    assert kustomization["namespace"] == namespace
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    (image,) = kustomization["images"]
    assert image["newTag"] == version, "the manifests run the image of this version"
    assert {c["image"] for _, c in CONTAINERS} == {image["name"]}, "one image for every role"


# --- references between objects ------------------------------------------------------------


def test_worker_scheduler_and_flower_run_as_deployments() -> None:
    deployments = _objects("Deployment")
    roles = {d["spec"]["template"]["spec"]["containers"][0]["args"][0]: name
             for name, d in deployments.items()}
    assert {"worker", "scheduler", "flower"} <= set(roles)
    jobs = _objects("Job")
    assert any(j["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
               for j in jobs.values()), "a one-shot migration Job"
    for name, doc in deployments.items():
        selector = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{name}: the selector misses its own pods"


def test_services_select_pods_and_their_named_ports() -> None:
    pods = list(_pod_specs())
    for name, service in _objects("Service").items():
        selector = service["spec"]["selector"]
        chosen = [spec for _, meta, spec in pods if selector.items() <= meta["labels"].items()]
        assert chosen, f"Service {name} selects no pod"
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            for spec in chosen:
                names = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
                assert target in names, f"Service {name}: pods have no port {target!r}"


def test_disruption_budgets_cover_their_pods() -> None:
    pods = [meta["labels"] for _, meta, _ in _pod_specs()]
    for name, pdb in _objects("PodDisruptionBudget").items():
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert any(selector.items() <= labels.items() for labels in pods), name


@pytest.mark.parametrize(("where", "container"), CONTAINERS, ids=[w for w, _ in CONTAINERS])
def test_probes_use_declared_ports(where: str, container: dict[str, Any]) -> None:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe:
            assert probe["httpGet"]["port"] in ports, f"{where} {kind}"
    if container["args"][0] in {"worker", "scheduler", "flower"}:
        assert container.get("livenessProbe"), f"{where}: a long-running role needs a probe"


def _env_sources(container: dict[str, Any]) -> dict[str, str]:
    """Every variable the container gets, resolved from the manifests (Secrets from the
    template secret.example.yaml)."""
    configmaps, secrets = _objects("ConfigMap"), _objects("Secret")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]]["data"])
        else:
            env.update(secrets[source["secretRef"]["name"]]["stringData"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"].get("secretKeyRef") or var["valueFrom"]["configMapKeyRef"]
        owner = secrets.get(ref["name"]) or configmaps[ref["name"]]
        env[var["name"]] = (owner.get("stringData") or owner.get("data"))[ref["key"]]
    return env


@pytest.mark.parametrize(("where", "container"), CONTAINERS, ids=[w for w, _ in CONTAINERS])
def test_config_and_secret_references_resolve(where: str, container: dict[str, Any]) -> None:
    configmaps, secrets = _objects("ConfigMap"), _objects("Secret")
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef") or source["secretRef"]
        assert ref["name"] in (configmaps if "configMapRef" in source else secrets), where
    for var in container.get("env", []):
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            assert ref["key"] in secrets[ref["name"]]["stringData"], f"{where}: {ref}"
    assert _env_sources(container)


@pytest.mark.parametrize(("where", "container"), CONTAINERS, ids=[w for w, _ in CONTAINERS])
def test_each_container_runs_a_sessionfold_subcommand(
        where: str, container: dict[str, Any],
        parse_cli: Callable[[list[str]], Any]) -> None:
    assert "command" not in container, f"{where}: keep the image's entrypoint (sessionfold)"
    args = parse_cli(container["args"])
    assert args.command == container["args"][0]


@pytest.mark.parametrize(("where", "container"), CONTAINERS, ids=[w for w, _ in CONTAINERS])
def test_each_container_sets_only_real_settings(where: str, container: dict[str, Any],
                                                settings_env_names: frozenset[str]) -> None:
    unknown = sorted(k for k in _env_sources(container) if k.upper() not in settings_env_names)
    assert not unknown, f"{where}: Settings reads no {unknown}"


@pytest.mark.parametrize(("where", "container"), CONTAINERS, ids=[w for w, _ in CONTAINERS])
def test_settings_accept_each_container_environment(
        where: str, container: dict[str, Any], dockerfile: Any,
        settings_from_env: Callable[..., Any]) -> None:
    image_env = {k: v for k, v in dockerfile.final.env().items() if k.startswith("SESSIONFOLD_")}
    env = _env_sources(container)
    settings = settings_from_env({**image_env, **env})
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if "metrics" in ports:
        assert settings.metrics_port == ports["metrics"] and settings.metrics_host == "0.0.0.0"
    if "http" in ports:  # Flower
        assert settings.flower_port == ports["http"] and settings.flower_host == "0.0.0.0"
        assert settings.flower_basic_auth is not None, "Flower without basic auth"
    mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert str(settings.data_dir) in mounts, f"{where}: the data dir must be a writable volume"


@pytest.mark.parametrize(("owner", "spec"), [(o, s) for o, _, s in _pod_specs()],
                         ids=[o for o, _, _ in _pod_specs()])
def test_pods_run_unprivileged(owner: str, spec: dict[str, Any], dockerfile: Any) -> None:
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    image_user = int(dockerfile.final.all("USER")[-1].value.split(":")[0])
    assert pod["runAsUser"] == image_user, f"{owner}: the image's user is {image_user}"
    volumes = {v["name"] for v in spec.get("volumes", [])}
    for container in spec["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"]
        if ctx.get("readOnlyRootFilesystem"):
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{owner}: a read-only root needs a writable /tmp"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, owner
        assert container["resources"]["requests"] and container["resources"]["limits"], owner


def test_workers_get_time_to_finish_their_folds() -> None:
    from sessionfold.runtime.settings import Settings

    worker = _objects("Deployment")["sessionfold-worker"]
    config = _objects("ConfigMap")["sessionfold-config"]["data"]
    limit = float(config.get("SESSIONFOLD_TASK_TIME_LIMIT_S",
                             Settings.model_fields["task_time_limit_s"].default))
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > limit


# --- KEDA ------------------------------------------------------------------------------------


def _keda() -> tuple[dict[str, Any], dict[str, Any]]:
    (scaled,) = [d for _, d in OBJECTS if d["kind"] == "ScaledObject"]
    (auth,) = [d for _, d in OBJECTS if d["kind"] == "TriggerAuthentication"]
    assert scaled["apiVersion"] == auth["apiVersion"] == KEDA_API
    return scaled, auth


def test_keda_scales_the_worker_deployment_on_the_redis_queue() -> None:
    scaled, auth = _keda()
    spec = scaled["spec"]
    assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount",
                         "pollingInterval", "cooldownPeriod", "advanced", "triggers",
                         "idleReplicaCount", "fallback"}
    target = spec["scaleTargetRef"]["name"]
    assert target in _objects("Deployment") and target.endswith("worker")
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "redis"
    meta = trigger["metadata"]
    assert all(isinstance(v, str) for v in meta.values()), "KEDA metadata values are strings"
    assert int(meta["listLength"]) >= 1
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    secrets = _objects("Secret")
    params = {}
    for ref in auth["spec"]["secretTargetRef"]:
        params[ref["parameter"]] = secrets[ref["name"]]["stringData"][ref["key"]]
    assert {"address", "password"} <= set(params)
    # The same Redis and database as the workers' REDIS_URL.
    worker = _objects("Deployment")[target]["spec"]["template"]["spec"]["containers"][0]
    redis_url = urlsplit(_env_sources(worker)["REDIS_URL"])
    assert params["address"] == f"{redis_url.hostname}:{redis_url.port}"
    assert params["password"] == redis_url.password
    assert meta["databaseIndex"] == (redis_url.path.lstrip("/") or "0")


def test_keda_watches_the_list_fold_jobs_are_enqueued_to(tmp_path: Path) -> None:
    """Enqueue a fold job through the package's own Celery app on an embedded Redis, with the
    manifests' settings, and look for it in the list KEDA reads."""
    from sessionfold.runtime.redis_conn import EmbeddedRedis, redis_client
    from sessionfold.runtime.settings import Settings
    from sessionfold.workers.celery_app import make_celery, make_enqueue, runtime_of

    scaled, _ = _keda()
    list_name = scaled["spec"]["triggers"][0]["metadata"]["listName"]
    config = _objects("ConfigMap")["sessionfold-config"]["data"]
    prefix = {"key_prefix": config["SESSIONFOLD_KEY_PREFIX"]} \
        if "SESSIONFOLD_KEY_PREFIX" in config else {}
    with EmbeddedRedis(tmp_path / "redis") as server:
        settings = Settings(redis_url=server.url, data_dir=tmp_path, **prefix)
        app = make_celery(settings)
        client = redis_client(server.url)
        try:
            assert client.llen(list_name) == 0
            make_enqueue(app)("deploy-test-session", None, "threshold")
            lists = [k.decode() for k in client.scan_iter(_type="list")]
            assert client.llen(list_name) == 1, f"the job went to {lists}, not {list_name!r}"
        finally:
            client.close()
            runtime_of(app).close()
            app.close()


# --- Prometheus on Kubernetes --------------------------------------------------------------


def test_the_kubernetes_scrape_config_finds_the_services() -> None:
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus-k8s.yml").read_text())
    (namespace,) = _objects("Namespace")
    services = _objects("Service")
    for job in config["scrape_configs"]:
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "endpoints" and sd["namespaces"]["names"] == [namespace]
        keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
        (rule,) = keep
        assert rule["source_labels"] == ["__meta_kubernetes_service_name",
                                         "__meta_kubernetes_endpoint_port_name"]
        service_name, port_name = rule["regex"].split(";")
        assert service_name in services, f"{job['job_name']}: no Service {service_name}"
        ports = {p["name"] for p in services[service_name]["spec"]["ports"]}
        assert port_name in ports, f"{job['job_name']}: {service_name} has no port {port_name}"
        assert re.fullmatch(r"[\w-]+", service_name)

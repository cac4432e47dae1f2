"""docker-compose.yml, checked without a Docker engine.

The file is validated against the Compose specification's JSON schema (vendored by the
``check-jsonschema`` package) both as written and after variable interpolation the way Compose
does it; then held to what issue 5 asks of it (a safe Redis broker, a one-shot migration that
gates everything else, scalable workers, Flower behind basic auth, healthchecks and restart
policies, a monitoring profile) and to the package: every command must parse with the real
``sessionfold`` parser, and every environment variable must be a setting that ``Settings``
reads and accepts.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
RAW: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
#: What a user puts in .env (deploy/env.example); interpolation needs these.
TEST_ENV = {"POSTGRES_PASSWORD": "pg-pw", "REDIS_PASSWORD": "redis-pw",
            "SESSIONFOLD_FLOWER_BASIC_AUTH": "admin:flower-pw",
            "GRAFANA_ADMIN_PASSWORD": "grafana-pw"}
#: Services that run the sessionfold image (built from deploy/Dockerfile).
IMAGE_SERVICES = sorted(name for name, svc in RAW["services"].items()
                        if isinstance(svc.get("build"), dict))
ONE_SHOT = {"migrate"}
LONG_RUNNING = sorted(set(RAW["services"]) - ONE_SHOT)
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|BASIC_AUTH|DATABASE_URL|REDIS_URL", re.I)


# --- Compose variable interpolation -------------------------------------------------------


class MissingVariableError(Exception):
    """A ``${VAR:?message}`` whose variable is unset (Compose refuses to start)."""


_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_]\w*)(?:(:?[-?+])((?:[^{}]|\{[^{}]*\})*))?\}|"
                  r"([A-Za-z_]\w*))")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's interpolation of ``value`` (recursively): ``$$``, ``$VAR``, ``${VAR}``,
    ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}``, ``${VAR?err}``, ``${VAR:+alt}``,
    ``${VAR+alt}``. Unset variables without a default become empty strings."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        escaped, name, op, arg, bare = match.groups()
        if escaped:
            return "$"
        if bare:
            return env.get(bare, "")
        current = env.get(name)
        empty = current is None or (op is not None and op.startswith(":") and current == "")
        kind = op[-1] if op else None
        if kind == "-":
            return str(interpolate(arg, env)) if empty else str(current)
        if kind == "?":
            if empty:
                raise MissingVariableError(f"{name}: {arg}")
            return str(current)
        if kind == "+":
            return "" if empty else str(interpolate(arg, env))
        return current or ""

    return _VAR.sub(one, value)


def test_interpolation_follows_compose() -> None:
    env = {"A": "a", "E": ""}
    assert interpolate("$$A ${A} $A ${B:-x} ${E:-x} ${E-x} ${A:+y} ${B+y}", env) == "$A a a x x  y "
    with pytest.raises(MissingVariableError, match="B: say"):
        interpolate("${B:?say}", env)
    assert interpolate("${E?ok}", env) == ""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The file as Compose runs it with :data:`TEST_ENV`."""
    result: dict[str, Any] = interpolate(RAW, TEST_ENV)
    return result


def _environment(service: dict[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] if "=" in item else (item, None) for item in env)
    return {k: (None if v is None else str(v)) for k, v in env.items()}


# --- the specification ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose_validator() -> Any:
    ref = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(ref.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_the_file_follows_the_compose_specification(compose_validator: Any,
                                                    compose: dict[str, Any]) -> None:
    for doc in (RAW, compose):
        errors = sorted(compose_validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_misspelt_key(compose_validator: Any) -> None:
    broken = copy.deepcopy(RAW)
    broken["services"]["worker"]["restart_policy"] = "always"  # belongs under deploy:
    assert not compose_validator.is_valid(broken)
    broken = copy.deepcopy(RAW)
    broken["services"]["worker"]["depends_on"] = {"migrate": {"condition": "service_finished"}}
    assert not compose_validator.is_valid(broken)


def test_every_required_secret_must_be_supplied() -> None:
    for name in TEST_ENV:
        env = {k: v for k, v in TEST_ENV.items() if k != name}
        with pytest.raises(MissingVariableError, match=name):
            interpolate(RAW, env)


def test_no_secret_is_written_into_the_file() -> None:
    for name, service in RAW["services"].items():
        for key, value in _environment(service).items():
            if SECRET_NAME.search(key) and value is not None:
                assert "${" in value, f"{name}: {key} must come from the environment"
    for match in re.finditer(r"://[^:/\s]*:([^@\s]+)@", COMPOSE.read_text()):
        assert match.group(1).startswith("${"), f"a literal password in a URL: {match.group(0)}"


# --- the services --------------------------------------------------------------------------


def test_redis_is_a_broker_that_keeps_its_jobs(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert re.search(r"--maxmemory-policy\s+noeviction\b", command)
    assert re.search(r"--appendonly\s+yes\b", command)
    assert re.search(r'--requirepass\s+"?\$REDIS_PASSWORD\b', command), (
        "the password comes from the container's environment, not the command line")
    env = _environment(redis)
    assert env["REDIS_PASSWORD"] == TEST_ENV["REDIS_PASSWORD"]
    assert "--dir /data" in command
    assert _named_volume_at(compose, redis, "/data")
    for name in IMAGE_SERVICES:
        url = urlsplit(_environment(compose["services"][name])["REDIS_URL"] or "")
        assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379), name
        assert url.password == TEST_ENV["REDIS_PASSWORD"], name


def test_postgres_keeps_its_data_and_matches_database_url(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    env = _environment(postgres)
    assert _named_volume_at(compose, postgres, "/var/lib/postgresql/data")
    for name in IMAGE_SERVICES:
        url = urlsplit(_environment(compose["services"][name])["DATABASE_URL"] or "")
        assert url.scheme == "postgresql+psycopg" and url.hostname == "postgres", name
        assert url.username == env["POSTGRES_USER"] and url.path == f"/{env['POSTGRES_DB']}"
        assert url.password == env["POSTGRES_PASSWORD"] == TEST_ENV["POSTGRES_PASSWORD"]
    check = " ".join(postgres["healthcheck"]["test"])
    assert "pg_isready" in check and env["POSTGRES_USER"] in check


def _named_volume_at(compose: dict[str, Any], service: dict[str, Any], target: str) -> bool:
    for volume in service.get("volumes", []):
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return source in (compose.get("volumes") or {})
    return False


def test_migrate_runs_once_before_anything_that_uses_the_store(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in IMAGE_SERVICES:
        if name in ONE_SHOT:
            continue
        deps = compose["services"][name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name


def test_workers_scale_with_docker_compose_up_scale(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert "container_name" not in worker, "a fixed name allows one replica only"
    assert "ports" not in worker, "a fixed host port allows one replica only"
    assert "hostname" not in worker
    # Celery's warm shutdown lets running folds finish: the grace period must cover the
    # hard time limit, or Docker kills folds mid-flight on every scale-down.
    grace = worker["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace)
    from sessionfold.runtime.settings import Settings

    assert int(grace[:-1]) > Settings.model_fields["task_time_limit_s"].default


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_restart_and_report_health(compose: dict[str, Any],
                                                         name: str) -> None:
    service = compose["services"][name]
    assert service.get("restart") in {"always", "unless-stopped", "on-failure"}, name
    check = service.get("healthcheck") or {}
    assert not check.get("disable") and check.get("test"), f"{name} has no healthcheck"
    assert check["test"][0] in {"CMD", "CMD-SHELL"}


def test_flower_listens_on_5555_behind_basic_auth(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    env = _environment(flower)
    assert flower["command"] == ["flower"]
    assert env["SESSIONFOLD_FLOWER_PORT"] == "5555"
    assert env["SESSIONFOLD_FLOWER_HOST"] == "0.0.0.0"
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    user, _, password = (env["SESSIONFOLD_FLOWER_BASIC_AUTH"] or "").partition(":")
    assert user and password, "basic auth as user:password"
    assert "/healthcheck" in " ".join(flower["healthcheck"]["test"]), (
        "Flower's /healthcheck answers without credentials; its UI does not")


def test_every_published_port_is_bound_to_loopback(compose: dict[str, Any]) -> None:
    # A web UI (Flower, Grafana, Prometheus) reached from another machine goes through a
    # reverse proxy that the operator chooses; compose never opens one on every interface.
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)


def test_grafanas_admin_password_has_no_default() -> None:
    grafana = RAW["services"]["grafana"]
    raw = _environment(grafana)["GF_SECURITY_ADMIN_PASSWORD"] or ""
    assert raw.startswith("${GRAFANA_ADMIN_PASSWORD:?"), raw
    env = {k: v for k, v in TEST_ENV.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    with pytest.raises(MissingVariableError, match="GRAFANA_ADMIN_PASSWORD"):
        interpolate(grafana, env)


def test_env_example_supplies_every_required_variable(repo: Path) -> None:
    example = dict(line.split("=", 1) for line in
                   (repo / "deploy" / "env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    assert required == set(TEST_ENV), "TEST_ENV must be exactly what compose requires"
    assert required <= set(example), f"deploy/env.example lacks {required - set(example)}"


def test_metrics_and_healthchecks_use_the_same_port(compose: dict[str, Any]) -> None:
    for name in ("worker", "scheduler"):
        service = compose["services"][name]
        env = _environment(service)
        assert env["SESSIONFOLD_METRICS_HOST"] == "0.0.0.0", name
        port = env["SESSIONFOLD_METRICS_PORT"]
        assert port in [str(p) for p in service["expose"]], name
        assert "SESSIONFOLD_METRICS_PORT" in " ".join(service["healthcheck"]["test"]), name


def test_the_image_is_built_from_deploy_dockerfile(compose: dict[str, Any]) -> None:
    assert {"migrate", "worker", "scheduler", "flower"} <= set(IMAGE_SERVICES)
    images = {compose["services"][n]["image"] for n in IMAGE_SERVICES}
    assert len(images) == 1, "one image for every role"
    for name in IMAGE_SERVICES:
        build = compose["services"][name]["build"]
        assert (REPO / build["context"] / build["dockerfile"]).is_file(), name
        assert (REPO / build["context"]).resolve() == REPO


# --- held to the package -------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGE_SERVICES)
def test_each_role_is_a_sessionfold_subcommand(compose: dict[str, Any], name: str,
                                               parse_cli: Callable[[list[str]], Any]) -> None:
    command = compose["services"][name]["command"]
    args = parse_cli([str(a) for a in command])
    assert args.command == command[0]
    if name == "worker":  # the flags the compose file passes reach the worker's options
        assert (getattr(args, "concurrency", None), getattr(args, "pool", None)) == \
            (2, "prefork"), vars(args)


@pytest.mark.parametrize("name", IMAGE_SERVICES)
def test_each_role_sets_only_real_settings(compose: dict[str, Any], name: str,
                                           settings_env_names: frozenset[str]) -> None:
    env = _environment(compose["services"][name])
    unknown = sorted(k for k in env if k.upper() not in settings_env_names)
    assert not unknown, f"{name}: Settings reads no {unknown}; they would be ignored silently"


@pytest.mark.parametrize("name", IMAGE_SERVICES)
def test_settings_accept_each_role_environment(compose: dict[str, Any], name: str,
                                               dockerfile: Any,
                                               settings_from_env: Callable[..., Any]) -> None:
    image_env = {k: v for k, v in dockerfile.final.env().items() if k.startswith("SESSIONFOLD_")}
    env = {k: v for k, v in _environment(compose["services"][name]).items() if v is not None}
    settings = settings_from_env({**image_env, **env})
    assert settings.database_url == env["DATABASE_URL"]
    assert settings.redis_url == env["REDIS_URL"]
    # ANTHROPIC_API_KEY is passed through from the host only when set there.
    assert _environment(compose["services"][name])["ANTHROPIC_API_KEY"] is None
    assert settings.summarizer_kind == "offline"


#: What picks and reaches the OpenAI-compatible summarizer: passed through from the host.
OPENAI_SUMMARIZER_ENV = ("SESSIONFOLD_SUMMARIZER", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                         "SESSIONFOLD_SUMMARIZER_MODEL", "SESSIONFOLD_SUMMARIZER_CONTEXT_TOKENS")


@pytest.mark.parametrize("name", IMAGE_SERVICES)
def test_each_role_can_be_switched_to_the_openai_summarizer(
        compose: dict[str, Any], name: str, dockerfile: Any,
        settings_from_env: Callable[..., Any]) -> None:
    declared = _environment(compose["services"][name])
    for key in OPENAI_SUMMARIZER_ENV:
        assert key in declared and declared[key] is None, (
            f"{name}: {key} must pass through from the host (as `{key}:`), got {declared.get(key)}")
    # The host sets two variables; the service then runs the OpenAI provider with its own
    # default model, not an Anthropic model the file pinned.
    host = {"SESSIONFOLD_SUMMARIZER": "openai", "OPENAI_API_KEY": "sk-test"}
    image_env = {k: v for k, v in dockerfile.final.env().items() if k.startswith("SESSIONFOLD_")}
    env = {k: v for k, v in declared.items() if v is not None}
    settings = settings_from_env({**image_env, **env, **host})
    assert settings.summarizer_kind == "openai"
    assert settings.summarizer_model.startswith("gpt-"), settings.summarizer_model


# --- monitoring profile --------------------------------------------------------------------


def test_monitoring_runs_only_in_its_profile(compose: dict[str, Any]) -> None:
    profiled = {n for n, s in compose["services"].items() if s.get("profiles")}
    assert profiled == {"prometheus", "grafana"}
    for name in profiled:
        assert compose["services"][name]["profiles"] == ["monitoring"]


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts: container path → host path (which must exist)."""
    found = {}
    for volume in service.get("volumes", []):
        source, _, rest = volume.partition(":")
        if source.startswith("."):
            host = (REPO / source).resolve()
            assert host.exists(), f"mounted {source} does not exist"
            found[rest.split(":")[0]] = host
    return found


def _in_container(mounts: dict[str, Path], path: str) -> Path:
    for target, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return host / Path(path).relative_to(target)
    raise AssertionError(f"{path} is not mounted from the repository")


def test_prometheus_scrapes_every_metrics_endpoint(compose: dict[str, Any]) -> None:
    prom = compose["services"]["prometheus"]
    mounts = _mounts(prom)
    flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_path = _in_container(mounts, flag.partition("=")[2])
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:
        assert (config_path.parent / rule_file).is_file(), rule_file
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for job_name, service in (("sessionfold-worker", "worker"),
                              ("sessionfold-scheduler", "scheduler")):
        (sd,) = jobs[job_name]["dns_sd_configs"]
        assert sd["names"] == [service] and sd["type"] == "A"
        port = _environment(compose["services"][service])["SESSIONFOLD_METRICS_PORT"]
        assert str(sd["port"]) == port, job_name
    flower_env = _environment(compose["services"]["flower"])
    (static,) = jobs["flower"]["static_configs"]
    assert static["targets"] == [f"flower:{flower_env['SESSIONFOLD_FLOWER_PORT']}"]
    assert jobs["flower"].get("metrics_path", "/metrics") == "/metrics"


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(
        compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = _mounts(grafana)
    provisioning = _in_container(mounts, "/etc/grafana/provisioning")
    (datasources,) = list((provisioning / "datasources").glob("*.yml"))
    (source,) = yaml.safe_load(datasources.read_text())["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
    (providers,) = list((provisioning / "dashboards").glob("*.yml"))
    (provider,) = yaml.safe_load(providers.read_text())["providers"]
    dashboards = _in_container(mounts, provider["options"]["path"])
    assert (dashboards / "sessionfold.json").is_file()
    home = _environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] or ""
    assert _in_container(mounts, home).is_file()

"""deploy/Dockerfile: one slim, non-root image for every role, checked without a Docker engine.

The structure is read from the file itself (stages, user, entrypoint, healthcheck, what is
copied, what is set in the environment). What can run outside Docker runs for real: the
healthcheck command against a live and a dead metrics endpoint, and the build stage's wheel
build from exactly the files the Dockerfile copies, installed into a fresh virtualenv whose
``sessionfold`` command then serves each role's ``--help`` and migrates a store.
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|BASIC_AUTH|DATABASE_URL|REDIS_URL", re.I)
BASE_IMAGE = "python:3.12-slim"


def _pyproject(repo: Path) -> dict[str, Any]:
    return tomllib.loads((repo / "pyproject.toml").read_text())


def _healthcheck_argv(stage: Any) -> list[str]:
    (check,) = stage.all("HEALTHCHECK")
    rest = re.sub(r"^(?:--\S+\s+)*", "", check.value)
    keyword, _, command = rest.partition(" ")
    assert keyword.upper() == "CMD", "HEALTHCHECK NONE disables the check"
    argv = json.loads(command)
    assert isinstance(argv, list), "write the healthcheck in exec form (a JSON array)"
    return [str(a) for a in argv]


def _dockerignore(repo: Path) -> list[str]:
    path = repo / ".dockerignore"
    assert path.is_file(), "the build context is the repository root: it needs a .dockerignore"
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether the build context leaves out ``rel`` (Docker's rules, without ``!`` exceptions)."""
    parts = rel.split("/")
    for pattern in patterns:
        assert not pattern.startswith("!"), "exceptions are not modelled by this test"
        pat = pattern.strip("/")
        if pat.startswith("**/") and any(fnmatch.fnmatch(part, pat[3:]) for part in parts):
            return True
        # A pattern matching a directory leaves out everything under it.
        for depth in range(1, len(parts) + 1):
            if fnmatch.fnmatch("/".join(parts[:depth]), pat):
                return True
    return False


def _copies(stage: Any) -> list[tuple[list[str], str]]:
    """``(sources, destination)`` of every COPY from the build context in ``stage``."""
    found = []
    for ins in stage.all("COPY") + stage.all("ADD"):
        if "from" in ins.flags():
            continue
        words = re.sub(r"^(?:--\S+\s+)*", "", ins.value).split()
        found.append((words[:-1], words[-1]))
    return found


# --- structure ------------------------------------------------------------------------------


def test_it_is_a_multi_stage_build_on_python_3_12_slim(dockerfile: Any) -> None:
    assert len(dockerfile.stages) >= 2, "build the wheel in one stage, install it in another"
    for stage in dockerfile.stages:
        assert stage.base == BASE_IMAGE, f"stage {stage.name} starts from {stage.base}"
    earlier = [s.name for s in dockerfile.stages[:-1]]
    # The runtime stage takes the wheels from an earlier stage, by name: COPY --from=NAME, or
    # RUN --mount=...,from=NAME,... which leaves no copy of them in a layer.
    taken = [ins.flags()["from"] for ins in dockerfile.final.all("COPY")
             if "from" in ins.flags()]
    mounts = [ins.flags()["mount"] for ins in dockerfile.final.all("RUN")
              if "mount" in ins.flags()]
    for mount in mounts:
        opts = dict(kv.partition("=")[::2] for kv in mount.split(","))
        if "from" in opts:
            taken.append(opts["from"])
    assert taken, "the runtime stage takes nothing from the build stage"
    for ref in taken:
        assert ref in earlier, f"from={ref} names no earlier stage ({earlier})"
    if mounts:
        # RUN --mount needs BuildKit's Dockerfile frontend, which the syntax directive pins.
        assert dockerfile.directives.get("syntax", "").startswith("docker/dockerfile:1")


def test_the_runtime_stage_installs_from_the_wheelhouse_alone(dockerfile: Any) -> None:
    runs = " ".join(ins.value for ins in dockerfile.final.all("RUN"))
    assert "python -m venv" in runs, "install into a virtualenv"
    assert re.search(r"pip install[^&]*--no-index[^&]*--find-links", runs), (
        "the runtime stage must not reach a package index")
    build_runs = " ".join(i.value for s in dockerfile.stages[:-1] for i in s.all("RUN"))
    assert "pip wheel" in build_runs, "the build stage builds the wheels"


def test_it_runs_as_a_numeric_non_root_user(dockerfile: Any) -> None:
    final = dockerfile.final
    users = final.all("USER")
    assert users, "the runtime stage never leaves root"
    user = users[-1].value.split(":")[0]
    # Kubernetes' runAsNonRoot can verify only a numeric user.
    assert user.isdigit() and int(user) != 0, f"USER {users[-1].value}"
    entry = final.all("ENTRYPOINT")[-1]
    assert users[-1].line < entry.line, "USER must be set before the entrypoint"


def test_the_entrypoint_is_the_sessionfold_command(dockerfile: Any, repo: Path) -> None:
    entry = dockerfile.final.all("ENTRYPOINT")[-1].exec_form()
    assert entry is not None, "exec form, so signals reach sessionfold (and Celery) directly"
    assert entry == ["sessionfold"], entry
    scripts = _pyproject(repo)["project"]["scripts"]
    assert scripts.get("sessionfold") == "sessionfold.cli.main:main"
    path_dirs = dockerfile.final.env()["PATH"].split(":")
    runs = " ".join(ins.value for ins in dockerfile.final.all("RUN"))
    venv = re.search(r"python -m venv (\S+)", runs)
    assert venv is not None and f"{venv.group(1)}/bin" == path_dirs[0], (
        "the virtualenv's bin/ (where pip puts the console script) leads PATH")


def test_the_healthcheck_is_bounded_and_probes_the_metrics_port(dockerfile: Any) -> None:
    (check,) = dockerfile.final.all("HEALTHCHECK")
    flags = check.flags()
    assert {"interval", "timeout", "retries", "start-period"} <= set(flags), flags
    assert _seconds(flags["timeout"]) < _seconds(flags["interval"])
    argv = _healthcheck_argv(dockerfile.final)
    assert "SESSIONFOLD_METRICS_PORT" in " ".join(argv)
    env = dockerfile.final.env()
    assert env["SESSIONFOLD_METRICS_PORT"] in " ".join(argv), (
        "the probe's fallback port is the image's metrics port")
    exposed = {p.split("/")[0] for ins in dockerfile.final.all("EXPOSE")
               for p in ins.value.split()}
    assert {env["SESSIONFOLD_METRICS_PORT"], env["SESSIONFOLD_FLOWER_PORT"]} <= exposed


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert found, f"a duration like 30s, not {text!r}"
    return float(found.group(1)) * units[found.group(2)]


def test_nothing_secret_is_built_in(dockerfile: Any, repo: Path) -> None:
    for stage in dockerfile.stages:
        for ins in stage.all("ENV") + stage.all("ARG") + stage.all("LABEL"):
            for token in re.findall(r"([A-Za-z_][\w.]*)=", ins.value):
                assert not SECRET_NAME.search(token), f"line {ins.line}: {token} in the image"
        for sources, _ in _copies(stage):
            for src in sources:
                assert not src.startswith(".env"), f"{src} copied into the image"
    assert _ignored(".env", _dockerignore(repo)), ".env must stay out of the build context"


def test_the_build_context_holds_what_is_copied_and_nothing_heavy(dockerfile: Any,
                                                                   repo: Path) -> None:
    patterns = _dockerignore(repo)
    for heavy in (".git", ".venv", ".venv/lib/python3.11/site-packages/x.py", "build",
                  "core/__pycache__/a.pyc", ".mypy_cache"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent with every build"
    copied = [src for stage in dockerfile.stages for srcs, _ in _copies(stage) for src in srcs]
    for src in copied:
        assert (repo / src).exists(), f"COPY {src}: not in the repository"
        assert not _ignored(src, patterns), f"COPY {src}: left out by .dockerignore"


def test_the_build_stage_copies_everything_the_wheel_is_built_from(dockerfile: Any,
                                                                    repo: Path) -> None:
    project = _pyproject(repo)
    needed = {"pyproject.toml", *project["tool"]["setuptools"]["package-dir"].values()}
    readme = project["project"].get("readme")
    if isinstance(readme, str):
        needed.add(readme)
    build = dockerfile.stages[0]
    copied = {src.rstrip("/") for srcs, _ in _copies(build) for src in srcs}
    assert needed <= copied, f"the build stage does not copy {sorted(needed - copied)}"


#: The extra (pyproject.toml) each role the image is started with needs beyond the base install;
#: a role missing here fails the test below, so a new role is placed before it ships.
ROLE_EXTRAS: dict[str, set[str]] = {
    "migrate": set(),
    "worker": {"worker"},
    "scheduler": {"worker"},
    "flower": {"worker"},
    "serve": {"api"},
}


def _image_extras(stage: Any, pattern: str) -> set[str]:
    runs = " ".join(ins.value for ins in stage.all("RUN"))
    found = re.search(pattern, runs)
    assert found, f"update this test: no {pattern!r} in {runs!r}"
    return set(found.group(1).split(","))


def test_the_image_installs_the_extras_its_roles_need(dockerfile: Any, repo: Path) -> None:
    built = _image_extras(dockerfile.stages[0], r'pip wheel .*"\.\[([\w,]+)\]"')
    installed = _image_extras(dockerfile.final, r'"sessionfold\[([\w,]+)\]"')
    assert built == installed, "the wheelhouse holds other extras than the image installs"
    known = set(_pyproject(repo)["project"]["optional-dependencies"])
    assert installed <= known, f"no such extra: {sorted(installed - known)}"
    roles = _image_roles(repo)
    assert roles <= set(ROLE_EXTRAS), f"which extras does {sorted(roles - set(ROLE_EXTRAS))} need?"
    needed = set().union(*(ROLE_EXTRAS[role] for role in roles))
    # The compose file and the manifests point DATABASE_URL at PostgreSQL, and the summarizer
    # setting may pick the OpenAI-compatible provider.
    needed |= {"postgres", "openai"}
    assert needed <= installed, f"the image lacks the extras {sorted(needed - installed)}"
    assert "demo" not in installed, "the demo's plotting stack does not belong in the image"


def test_the_image_environment_names_real_settings(dockerfile: Any,
                                                   settings_env_names: frozenset[str]) -> None:
    env = dockerfile.final.env()
    ours = {k for k in env if k.startswith("SESSIONFOLD_")}
    assert ours, "the image sets no sessionfold setting (metrics and Flower must listen on 0.0.0.0)"
    unknown = sorted(k for k in ours if k.upper() not in settings_env_names)
    assert not unknown, f"Settings reads no {unknown}: they would be silently ignored"


def test_settings_accept_the_image_environment(dockerfile: Any,
                                               settings_from_env: Callable[..., Any]) -> None:
    env = {k: v for k, v in dockerfile.final.env().items() if k.startswith("SESSIONFOLD_")}
    settings = settings_from_env(env)
    assert settings.metrics_host == "0.0.0.0"
    assert settings.flower_host == "0.0.0.0"
    assert str(settings.metrics_port) == env["SESSIONFOLD_METRICS_PORT"]
    assert str(settings.data_dir) == env["SESSIONFOLD_DATA_DIR"]


# --- what runs outside Docker -----------------------------------------------------------------


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/metrics"
        body = b"# TYPE up gauge\nup 1\n" if ok else b"not found"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_healthcheck(argv: list[str], port: int) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "python"
    env = {"PATH": os.environ.get("PATH", ""), "SESSIONFOLD_METRICS_PORT": str(port)}
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True,
                          timeout=30)


def test_the_healthcheck_passes_on_a_live_metrics_endpoint(dockerfile: Any,
                                                           metrics_server: int) -> None:
    proc = _run_healthcheck(_healthcheck_argv(dockerfile.final), metrics_server)
    assert proc.returncode == 0, proc.stderr


def test_the_healthcheck_fails_when_nothing_listens(dockerfile: Any) -> None:
    proc = _run_healthcheck(_healthcheck_argv(dockerfile.final), _free_port())
    assert proc.returncode != 0


@pytest.fixture(scope="module")
def image_venv(dockerfile: Any, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's steps, as far as a plain virtualenv goes.

    The build context is staged from exactly the Dockerfile's COPY instructions (honouring
    .dockerignore), the wheel is built there with the build stage's ``pip wheel`` command (only
    sessionfold's own wheel: the dependencies come from the index in the image, from this
    test's virtualenv here), and installed into a new virtualenv, as the runtime stage does.
    """
    work = tmp_path_factory.mktemp("image")
    context = work / "src"
    patterns = _dockerignore(repo)
    build = dockerfile.stages[0]
    for sources, dest in _copies(build):
        assert not dest.startswith("/"), "update this test: COPY to an absolute path"
        into_dir = dest.endswith("/") or len(sources) > 1
        for src in sources:
            path = repo / src
            if path.is_dir():  # Docker copies a directory's contents into dest
                _stage_dir(repo, path, context / dest, patterns)
            else:
                target = context / dest / path.name if into_dir else context / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    (run,) = build.all("RUN")
    found = re.fullmatch(r'python -m pip wheel --wheel-dir (\S+) "\.\[[\w,]+\]"', run.value)
    assert found, f"update this test: the build stage now runs {run.value!r}"
    wheels = work / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "--wheel-dir", str(wheels), "."], cwd=context,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the build stage's wheel build fails:\n{proc.stderr}"
    (wheel,) = wheels.glob("sessionfold-*.whl")
    venv = work / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # The dependencies: this interpreter's site-packages, appended after the new venv's own, so
    # the new venv's sessionfold (the wheel) is the one imported. Listed directories' .pth files
    # are not run, so the editable install's import hook stays out.
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv),
                                             "platbase": str(venv)})["purelib"])
    (purelib / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return venv


def _stage_dir(repo: Path, path: Path, target: Path, patterns: list[str]) -> None:
    for item in path.rglob("*"):
        rel = item.relative_to(repo).as_posix()
        if item.is_file() and not _ignored(rel, patterns):
            dest = target / item.relative_to(path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, dest)


def _sessionfold(venv: Path, *args: str, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {"PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}", "HOME": str(cwd or venv),
            **(env or {})}
    return subprocess.run([str(venv / "bin" / "sessionfold"), *args], env=full, cwd=cwd or venv,
                          capture_output=True, text=True, timeout=120)


def _image_roles(repo: Path) -> set[str]:
    """Every subcommand the compose file and the Kubernetes manifests start the image with."""
    roles: set[str] = set()
    compose = yaml.safe_load((repo / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        if isinstance(service.get("build"), dict) and isinstance(service.get("command"), list):
            roles.add(service["command"][0])
    for path in (repo / "deploy" / "k8s").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if container.get("args"):
                    roles.add(container["args"][0])
    return roles


@pytest.mark.slow
def test_the_installed_wheel_is_what_runs(image_venv: Path) -> None:
    proc = subprocess.run(
        [str(image_venv / "bin" / "python"), "-c",
         "import sessionfold.cli.main as c; print(c.__file__)"],
        capture_output=True, text=True, timeout=60, cwd=image_venv)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(image_venv), (
        f"imported {proc.stdout.strip()}, not the wheel installed in the image's virtualenv")


_ROLE_HELP = """
import contextlib, io, json, sys
from sessionfold.cli.main import main
out = {}
for role in sys.argv[1:]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = main([role, "--help"])
        except SystemExit as exc:
            code = exc.code
    out[role] = [code, buf.getvalue()]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_image_command_serves_every_role(image_venv: Path, repo: Path,
                                             registered_subcommands: frozenset[str]) -> None:
    proc = _sessionfold(image_venv, "--help")
    assert proc.returncode == 0, proc.stderr
    roles = _image_roles(repo)
    assert {"migrate", "worker", "scheduler", "flower", "serve"} <= roles
    # A role the image is started with that the command lacks is a container that cannot start.
    assert roles <= registered_subcommands, sorted(roles - registered_subcommands)
    # Every role's --help in one interpreter of the image's virtualenv (one start-up, not five).
    proc = subprocess.run([str(image_venv / "bin" / "python"), "-c", _ROLE_HELP, *sorted(roles)],
                          capture_output=True, text=True, timeout=120, cwd=image_venv)
    assert proc.returncode == 0, proc.stderr
    answered = json.loads(proc.stdout)
    assert set(answered) == roles
    for role, (code, text) in answered.items():
        assert code == 0 and f"sessionfold {role}" in text, f"sessionfold {role} --help:\n{text}"


@pytest.mark.slow
def test_the_image_migrates_a_store(image_venv: Path, tmp_path: Path,
                                    registered_subcommands: frozenset[str]) -> None:
    assert "migrate" in registered_subcommands, "the image's migrate Job runs `sessionfold migrate`"
    db = tmp_path / "store.db"
    proc = _sessionfold(image_venv, "migrate", env={"DATABASE_URL": f"sqlite:///{db}",
                                                    "SESSIONFOLD_DATA_DIR": str(tmp_path)},
                        cwd=tmp_path)
    assert proc.returncode == 0, f"sessionfold migrate in the image fails:\n{proc.stderr}"
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"sessions", "ledger", "window_items", "folds"} <= tables, tables

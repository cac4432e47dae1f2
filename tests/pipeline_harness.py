"""What the pipeline tests share: real worker and scheduler processes, databases, sessions.

- :class:`PipelineProcess` runs ``sessionfold worker`` / ``scheduler`` as a real child process in
  its own process group (so a test can SIGKILL the whole worker, pool children included), with
  the settings passed through the environment as in production, and waits for it to be ready by
  reading its log.
- :func:`child_env` turns a :class:`Settings` into the environment a child reads it from.
- :class:`PostgresDatabases` makes and drops uniquely named databases on the machine's
  PostgreSQL (``SF_TEST_POSTGRES_URL``); skipped on a laptop without it, failed under CI.
- :func:`transcript_session` loads a slice of a shared transcript.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sessionfold.cli.files import load_conversation_file
from sessionfold.cli.stack import FLOWER_LOGIN_FILE
from sessionfold.core.messages import Conversation
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings, env_name
from sessionfold.store import SessionStore
from sessionfold.store.engine import create_store_engine

TRANSCRIPTS = Path(__file__).resolve().parent / "data" / "transcripts"
DEFAULT_POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REPO = Path(__file__).resolve().parents[1]


def unavailable(reason: str) -> None:
    """Skip on a laptop without the service; fail under CI, where it must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason)


def transcript_session(name: str, messages: int | None = None) -> Conversation:
    """A shared transcript, cut to its first ``messages`` messages (None: whole)."""
    conv = load_conversation_file(TRANSCRIPTS / f"{name}.json")
    if messages is None:
        return conv
    return Conversation(system=conv.system, messages=conv.messages[:messages])


def deleting_the_session(client: Any, sid: str) -> Callable[[Any], str]:
    """A stand-in model's reply function whose answer arrives after the session was deleted:
    the reply is paid for, and can no longer be recorded (the SDK wrappers' tests)."""
    def reply(request: Any) -> str:
        client.store.delete_session(sid)
        return "Reconciled 12 refunds."
    return reply


def core_invariants() -> ModuleType:
    """The core's own statement of the window invariants (``tests/core/test_invariants.py``,
    whose ``check_window(ledger, items, policy)`` the pipeline's windows must pass too)."""
    name = "sessionfold_core_invariants"
    if name in sys.modules:
        return sys.modules[name]
    path = REPO / "tests" / "core" / "test_invariants.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Callable[[], Any], *, timeout_s: float, what: str,
               poll_s: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(poll_s)


def seeded_store(database_url: str, sid: str, *, messages: int = 60) -> None:
    """Migrate the store at ``database_url`` and add ``sid``: the first ``messages`` messages
    of django__django-15554 under an 8,000-token budget (over its trigger at 60)."""
    with SessionStore.from_url(database_url) as store:
        store.migrate()
        conv = transcript_session("django__django-15554", messages)
        store.create_session(sid, FoldPolicy(budget_tokens=8000), conv.system)
        store.append(sid, conv.messages)


def started_flower(request: pytest.FixtureRequest, settings: Settings,
                   log_path: Path) -> tuple[PipelineProcess, str]:
    """``sessionfold flower`` on ``settings`` (its port set), stopped when the test ends at the
    latest: the process and its base URL, once it answers."""
    proc = started(request, PipelineProcess(["flower"], child_env(settings), log_path,
                                            "sessionfold flower:"))
    url = f"http://127.0.0.1:{settings.flower_port}"
    wait_until(lambda: _answers(f"{url}/healthcheck"), timeout_s=60, what="Flower to answer")
    # Flower's API needs its login: the one the command made (its healthcheck needs none).
    login = (settings.flower_basic_auth.get_secret_value() if settings.flower_basic_auth
             else (settings.data_dir / FLOWER_LOGIN_FILE).read_text(encoding="utf-8").strip())
    return proc, url.replace("http://", f"http://{login}@")


def flower_lists(flower_url: str, job_id: str) -> dict[str, Any]:
    """The job as Flower's API lists it, once it shows the job succeeded."""

    def listed() -> dict[str, Any] | None:
        tasks = httpx2.get(f"{flower_url}/api/tasks", timeout=5).json()
        task: dict[str, Any] | None = tasks.get(job_id)
        return task if task and task.get("state") == "SUCCESS" else None

    found: dict[str, Any] = wait_until(listed, timeout_s=60, what="Flower to list the job")
    return found


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


# --- child processes --------------------------------------------------------------------------

def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a child process reads ``settings`` from (as a deployment would set it)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SESSIONFOLD_", "ANTHROPIC_")) and k not in (
               "REDIS_URL", "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    for field, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[env_name(field)] = str(value)
    env.update(extra)
    return env


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class PipelineProcess:
    """``python -m sessionfold.cli ARGS`` in its own process group, logging to a file."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path,
                 ready_text: str, *, sigint_ignored: bool = False) -> None:
        self.argv = argv
        #: Start it with SIGINT ignored, as a non-interactive shell starts a background job.
        self.sigint_ignored = sigint_ignored
        self.env = dict(env)
        self.log_path = log_path
        self.ready_text = ready_text
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> PipelineProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            # A session of its own: killpg reaches the worker's pool children too.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sessionfold.cli", *self.argv],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.log_path.parent,
                start_new_session=True,
                preexec_fn=_ignore_sigint if self.sigint_ignored else None)
        wait_until(lambda: self._ready(offset), timeout_s=timeout_s,
                   what=f"{' '.join(self.argv)} to be ready (log {self.log_path})")
        return self

    def _ready(self, offset: int) -> bool:
        assert self.proc is not None
        text = self.log_text(offset)
        if self.proc.poll() is not None:
            pytest.fail(f"{' '.join(self.argv)} exited ({self.proc.returncode}):\n{text[-3000:]}")
        return self.ready_text in text

    def log_text(self, offset: int = 0) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the whole process group (the worker and its pool children), as a crash."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a worker finishes its jobs), then SIGKILL the group if it lingers."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray pool children, if any
        self.proc.wait(timeout=30)
        self.proc = None


def worker_process(settings: Settings, log_path: Path, *, concurrency: int = 1,
                   pool: str = "prefork", **env: str) -> PipelineProcess:
    name = f"w{uuid.uuid4().hex[:6]}@%h"
    return PipelineProcess(
        ["worker", f"--concurrency={concurrency}", f"--pool={pool}", f"--hostname={name}"],
        child_env(settings, **env), log_path, "ready.")


def scheduler_process(settings: Settings, log_path: Path, **env: str) -> PipelineProcess:
    return PipelineProcess(["scheduler"], child_env(settings, **env), log_path,
                           "sessionfold scheduler: reading")


def started(request: pytest.FixtureRequest, proc: PipelineProcess,
            timeout_s: float = 90.0) -> PipelineProcess:
    """Start ``proc``; it is stopped when the requesting test (or fixture scope) ends."""
    request.addfinalizer(lambda: proc.stop(timeout_s=10))
    return proc.start(timeout_s)


# --- PostgreSQL -----------------------------------------------------------------------------

class PostgresDatabases:
    """Uniquely named databases on the test server, dropped at the end."""

    def __init__(self, admin_url: str) -> None:
        self.admin = create_store_engine(admin_url, pool_size=1).execution_options(
            isolation_level="AUTOCOMMIT")
        self.made: list[str] = []

    def create(self, *, migrate: bool = True) -> str:
        name = f"sf_wtest_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        url = self.admin.url.set(database=name).render_as_string(hide_password=False)
        if migrate:
            with SessionStore.from_url(url) as store:
                store.migrate()
        return url

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.made:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.dispose()


def open_postgres() -> PostgresDatabases:
    url = os.environ.get("SF_TEST_POSTGRES_URL", DEFAULT_POSTGRES_ADMIN_URL)
    try:
        server = PostgresDatabases(url)
        with server.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        unavailable(f"no PostgreSQL at {url}: {str(exc.orig).strip().splitlines()[0]}")
    return server


_POSTGRES = pytest.StashKey[PostgresDatabases]()


def postgres_url(request: pytest.FixtureRequest, *, migrate: bool = True) -> str:
    """A fresh database on the test PostgreSQL (migrated unless ``migrate=False``), dropped
    when the test run ends."""
    server = request.config.stash.get(_POSTGRES, None)
    if server is None:
        server = open_postgres()
        request.config.stash[_POSTGRES] = server
        request.config.add_cleanup(server.drop_all)
    return server.create(migrate=migrate)

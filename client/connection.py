"""A connection to one sessionfold deployment: :class:`Client`, and :func:`connect`.

::

    client = connect()                      # settings from the environment (embedded defaults)
    agent = client.session("agent-7", policy=FoldPolicy(budget_tokens=64_000), system=SYSTEM)

The client holds the store, the usage publisher and the summarizer of inline folds, and counts
the inline folds made through it. Every connection comes from the settings through
:mod:`sessionfold.runtime.wiring`, as in every other process.

Inline folds meet the same guards as the workers' background folds
(:mod:`sessionfold.runtime.summarizer_guard`): each summarizer call holds one of the global
summarizer slots, and a session past its spend cap goes without the summarizer. The rule when
they are exhausted: the inline fold still folds, with the cheap layers (masking old tool output,
dropping thinking) and without the summarizer, and its record says why; an agent is never left
waiting on a cap. A client with no Redis at all (the embedded server could not start) has no
global guards to meet: its inline folds call the summarizer unguarded.

Each inline fold is also published on the usage stream, so that a scheduler counts it in
``/metrics`` (``folds_total{trigger="overflow"}``): the agent's process serves no metrics itself.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Literal

from sessionfold.core.errors import (
    InvalidInputError,
    RedisUnavailableError,
    SessionNotFoundError,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import Summarizer
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport, run_fold
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.metrics import VisitCounts
from sessionfold.runtime.prices import summarizer_cost_usd
from sessionfold.runtime.redis_conn import EmbeddedRedis, RedisClient, mapped_errors
from sessionfold.runtime.settings import Settings, env_name
from sessionfold.runtime.summarizer_guard import SummarizerGuard
from sessionfold.runtime.usage import FoldEvent, NudgeEvent, UsagePublisher
from sessionfold.runtime.wiring import (
    RedisEndpoint,
    inline_redis_client,
    make_summarizer,
    open_redis,
    open_store,
    summarizer_guard,
    usage_publisher,
)
from sessionfold.store import SessionInfo, SessionStore
from sessionfold.store.results import past_trigger, skip_reason

from .call_plan import OverBudget, check_over_budget
from .session import SessionHandle

__all__ = ["Client", "connect"]

log = logging.getLogger(__name__)

#: A background fold on its way to a session (:meth:`Client.background_fold`).
FoldOnItsWay = Literal["pending", "expected"] | None
#: How long a request past its line waits for an expected background fold (a scheduler owns
#: the session's partition, but no job is queued yet) to be queued: a scheduler reads its
#: stream in blocks of ``scheduler_block_ms`` (one second by default).
EXPECTED_GRACE_S = 2.0


class Client:
    """A connection to one sessionfold deployment: the store, the usage bus, a summarizer.

    Thread-safe; share one per process. ``summarizer`` (for inline folds) defaults to the one
    the settings name, made on first use; inline folds call it behind the guards
    (:attr:`summarizer_guard`) whenever the client has a Redis.
    ``embedded``: the embedded Redis server this client started (stopped by :meth:`close`).
    """

    def __init__(self, settings: Settings, store: SessionStore,
                 publisher: UsagePublisher | None, *, redis_url: str | None = None,
                 summarizer: Summarizer | None = None,
                 embedded: EmbeddedRedis | None = None) -> None:
        self.settings = settings
        self.store = store
        self.publisher = publisher
        #: The Redis the usage bus is on (an embedded server's socket URL without REDIS_URL).
        self.redis_url = redis_url or settings.redis_url
        self._summarizer = summarizer
        self._embedded = embedded
        self._guard: SummarizerGuard | None = None
        self._guard_redis: RedisClient | None = None
        self._lock_redis: RedisClient | None = None
        self._lock = threading.Lock()
        self._summarizer_calls = 0
        self._inline_folds = 0

    def __repr__(self) -> str:
        return f"Client({self.store!r})"

    @property
    def summarizer(self) -> Summarizer:
        with self._lock:
            if self._summarizer is None:
                self._summarizer = make_summarizer(self.settings)
            return self._summarizer

    @property
    def summarizer_guard(self) -> SummarizerGuard | None:
        """The summarizer behind the global slots and the spend cap, as inline folds call it
        (made on first use, on a Redis connection with short timeouts); None without Redis."""
        if self.redis_url is None:
            return None
        summarizer = self.summarizer
        with self._lock:
            if self._guard is None:
                self._guard_redis = inline_redis_client(self.settings, self.redis_url)
                self._guard = summarizer_guard(self.settings, self._guard_redis, summarizer,
                                               inline=True)
            return self._guard

    @property
    def summarizer_calls(self) -> int:
        """Summarizer calls made on agents' paths (inline folds) through this client."""
        return self._summarizer_calls

    @property
    def inline_folds(self) -> int:
        return self._inline_folds

    def session(self, session_id: str, policy: FoldPolicy | None = None,
                system: str | None = None, *, over_budget: OverBudget = "cap") -> SessionHandle:
        """A handle on one session; with ``policy`` it is created when absent.

        An existing session takes a new ``policy`` if one is given. Its system prompt is fixed at
        creation: a different ``system`` raises InvalidInputError rather than silently sending
        the old one. Without ``policy`` an absent session raises SessionNotFoundError.
        """
        check_over_budget(over_budget)
        try:
            info = self.store.get_session(session_id)
        except SessionNotFoundError:
            if policy is None:
                raise SessionNotFoundError(
                    f"no session {session_id!r}; pass policy= to create it") from None
            info = self.store.create_session(session_id, policy, system or "", exist_ok=True)
        else:
            if policy is not None and policy != info.policy:
                self.store.set_policy(session_id, policy)
                self.nudge(session_id, info.revision)  # the scheduler reads the new trigger
        if system is not None and system != info.system:
            raise InvalidInputError(
                f"session {session_id!r} exists with another system prompt; a session's system "
                "prompt is fixed when it is created")
        return SessionHandle(self, session_id, over_budget=over_budget)

    def set_paused(self, session_id: str, paused: bool) -> SessionInfo:
        """Pause (or resume) background folds of a session; its scheduler is nudged, so a
        resumed session past its trigger gets its fold now. Returns the session as it is."""
        self.store.set_paused(session_id, paused)
        info = self.store.get_session(session_id)
        self.nudge(session_id, info.revision)
        return info

    def nudge(self, session_id: str, revision: int) -> bool:
        """Tell the session's scheduler to read it from the store now (its trigger was passed,
        or its policy or pause changed: the scheduler trusts what it read between reads).
        True if the nudge reached Redis; never raises (no publisher: False)."""
        if self.publisher is None:
            return False
        try:
            return self.publisher.publish(NudgeEvent(session_id, revision))
        except Exception:  # the publisher never raises; belt and braces for the agent's sake
            log.warning("nudge for %s failed", session_id, exc_info=True)
            return False

    def run_inline_fold(self, job: FoldJob) -> FoldReport:
        """Run ``job`` now, on this thread, through the runtime's fold procedure, with the
        guarded summarizer (see the module doc); count it."""
        started = time.perf_counter()
        report = run_fold(self.store, self.summarizer_guard or self.summarizer, job)
        self._count_inline(report, duration_s=time.perf_counter() - started)
        return report

    def _count_inline(self, report: FoldReport, *, duration_s: float) -> None:
        with self._lock:
            self._inline_folds += 1
            self._summarizer_calls += report.summarizer_calls
        if report.record is not None and self.publisher is not None:
            # This process serves no /metrics: a scheduler counts the visit from the stream.
            visit = VisitCounts.from_record(
                report.record, duration_s=duration_s,
                cost_usd=summarizer_cost_usd(report.summarizer_usage,
                                             self.settings.price_table()))
            self.publisher.publish(FoldEvent(visit))  # never raises; buffers while Redis is away

    # --- a background fold on its way ---------------------------------------------------------

    def background_fold(self, info: SessionInfo, tokens: int) -> FoldOnItsWay:
        """Whether a background fold of the session is on its way, for a request of ``tokens``:
        ``"pending"`` when a worker holds a live claim on it or the scheduler's fold lock says a
        job is queued or running; ``"expected"`` when none is yet but the request is past the
        session's trigger, the scheduler's own rule on the row would queue one
        (:func:`~sessionfold.store.results.skip_reason`: past the trigger, grown since a visit
        that folded nothing) and a scheduler owns the session's partition (it enqueues one as
        soon as it reads a report or nudge: an agent faster than the pipeline outruns it);
        None otherwise: a row the scheduler would pass on, a fold waiting on a provider's batch
        API (its answer may take hours), a paused session, no Redis to ask (no scheduler can
        have enqueued one), or a Redis that does not answer (never raises: the caller folds
        inline instead of waiting)."""
        if info.batch is not None:
            return None
        if (info.claimed_by is not None and info.claim_expires_at is not None
                and info.claim_expires_at > datetime.now(UTC)):
            return "pending"
        if self.redis_url is None:
            return None
        with self._lock:
            if self._lock_redis is None:
                self._lock_redis = inline_redis_client(self.settings, self.redis_url)
            conn = self._lock_redis
        keys = Keys.from_settings(self.settings)
        try:
            with mapped_errors("reading a fold lock"):
                if conn.exists(keys.fold_lock(info.id)):
                    return "pending"
                if (past_trigger(tokens, info.trigger_tokens, paused=info.paused)
                        and skip_reason(info) is None
                        and conn.exists(keys.partition_lease(keys.partition_of(info.id)))):
                    return "expected"
        except RedisUnavailableError as exc:
            log.debug("fold lock of %s unreadable (%s): not waiting for a background fold",
                      info.id, exc)
        return None

    def await_window_change(self, session_id: str, revision: int, tokens: int,
                            timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, for the window of ``session_id`` to move past
        ``revision`` while a background fold is on its way for a request of ``tokens``
        (:meth:`background_fold`; one only expected is waited for :data:`EXPECTED_GRACE_S` at
        most from when it is found expected, to appear, and the scheduler is nudged for it: a
        session already past its trigger sends no nudge on append, and the request held here
        sends no usage report, so without one only the scheduler's sweep would look). True: it
        moved (a fold landed, or anything else changed it); False: nothing was on its way, or
        it did not land in time. Reads the session row, first every 20 ms, backing off to every
        250 ms."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        #: When a fold found only expected stops being waited for (None: not expected now).
        expected_until: float | None = None
        delay = 0.02
        while True:
            info = self.store.get_session(session_id)
            if info.revision != revision:
                return True
            state = self.background_fold(info, tokens)
            now = time.monotonic()
            if state == "expected":
                if expected_until is None:
                    # Its grace counts from now, not from the start of the wait: a job that
                    # ended without folding (it read the window before the request's append)
                    # leaves the next one expected after a long pending wait.
                    expected_until = min(deadline, now + EXPECTED_GRACE_S)
                    self.nudge(session_id, info.revision)
                end = expected_until
            else:
                expected_until = None
                end = deadline
            if state is None or now >= end:
                # A worker commits its fold before its job releases the fold lock: a lock
                # found gone after the row above was read may be a fold that landed between
                # the two reads. Read the row once more before calling it not on its way.
                return self.store.get_session(session_id).revision != revision
            time.sleep(min(delay, end - now))
            delay = min(0.25, delay * 2)

    def close(self) -> None:
        """Flush buffered usage, close connections, stop an embedded Redis this client started."""
        if self.publisher is not None:
            self.publisher.close()
        if self._guard_redis is not None:
            self._guard_redis.close()
        if self._lock_redis is not None:
            self._lock_redis.close()
        self.store.close()
        if self._embedded is not None:
            self._embedded.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(settings: Settings | None = None, *, migrate: bool | None = None) -> Client:
    """A :class:`Client` for the deployment the settings (default: the environment) name.

    Without ``REDIS_URL`` it uses the embedded Redis server of the data dir (attaching to one
    that runs, starting one otherwise); without ``DATABASE_URL`` the SQLite store. ``migrate``:
    apply the store's migrations (default: only for SQLite, the embedded case; PostgreSQL is
    migrated by ``sessionfold migrate``). If Redis cannot be reached the client still works;
    usage reports are then buffered and dropped, with a warning.
    """
    if settings is None:
        settings = Settings()
    embedded_data = settings.embedded_data()
    if embedded_data is not None:
        log.info("sessionfold client: %s", embedded_data)
    store = open_store(settings, migrate=migrate)
    endpoint: RedisEndpoint | None
    try:
        endpoint = open_redis(settings)
    except RedisUnavailableError as exc:
        log.warning("no usage bus: %s; usage reports will be dropped", exc)
        endpoint = None
    if endpoint is not None and endpoint.owned:
        # Nobody ran the embedded server of this data dir before us, so no scheduler or worker
        # runs on it: sessions made here are folded inline only, never in the background.
        log.warning("sessionfold client: started a new embedded Redis in %s; no pipeline runs "
                    "on this data dir, so its sessions are not folded in the background. Run "
                    "`sessionfold up` in the same folder, or point %s (or REDIS_URL and "
                    "DATABASE_URL) at the running one", settings.data_dir,
                    env_name("data_dir"))
    url = endpoint.url if endpoint is not None else None
    publisher = usage_publisher(settings, url) if url else None
    # Attached to another process's server: not ours to stop.
    owned = endpoint.server if endpoint is not None and endpoint.owned else None
    return Client(settings, store, publisher, redis_url=url, embedded=owned)

"""Prometheus metrics of the pipeline, recorded through a few calls, exposed over HTTP.

Code records what happened in the project's own terms (a visit's :class:`CompactionRecord`, a
retry, a dead letter, a usage batch) and this module turns it into metrics; no other module
touches prometheus_client::

    m = metrics()                                   # the process's default set
    with m.track_fold("threshold") as timer:        # times the job; an escaping error counts
        record = ...                                # as outcome "error"
        timer.done(record, cost_usd=0.0012)         # folds, refusals, tokens saved, cost
    m.record_retry("529")
    m.record_dead_letter("max-attempts")
    server = start_metrics_server(9464, "0.0.0.0")  # /metrics

Metrics (all prefixed ``sessionfold_``): ``folds_total{outcome,trigger}``,
``refusals_total{reason}``, ``tokens_saved_total``, ``summarizer_tokens_total{model,kind}``,
``summarizer_cost_usd_total{model}``, ``fold_duration_seconds{outcome}``,
``scheduler_lag_seconds`` (usage event time → job enqueued), ``usage_events_total{result}``,
``fold_jobs_enqueued_total{source}``, ``fold_retries_total{reason}``,
``dead_letters_total{reason}``, ``sessions_over_budget`` (gauge, set by the scheduler's sweep:
sessions past their whole budget, not just the trigger — a session stuck there means folds are
not landing), ``paused_sessions_over_budget`` (gauge, same sweep: paused sessions past their
budget, which no background fold brings down), ``recall_requests_total{kind,outcome}``
(recall tool requests answered from the ledger), ``guarded_requests_total{outcome}`` (requests
past the budget's line, by what the client's pre-send guard did: ``waited`` for the background
fold on its way, which landed; ``folded-inline``; sent with the cheap layers applied,
``guarded``; or could not bring under the budget, ``over-budget``),
``batch_folds_total{event}`` (folds through a provider's batch API: ``submitted``,
``collected``, ``fallen-back`` to a summarizer call now, ``dropped``: nothing waited for the
answer any more), ``batch_folds_pending`` (gauge, set by the scheduler's sweep: folds waiting
on a batch). Label values are small closed sets (outcomes,
refusal reasons, sources, status codes); never put a session id or an error message in a label.

**Several processes.** Each Celery pool child, and each scheduler or worker on a host, is its own
process with its own counters. :func:`enable_multiprocess` (called before the pool forks and
before the first metric is recorded) keeps values in files under ``PROMETHEUS_MULTIPROC_DIR``;
:func:`start_metrics_server` then adds up every process's files. Which process serves the sum
for a host, and when, is :mod:`.exporter`'s business. Gauges of processes that are gone leave
the sum (``live`` modes: a dead scheduler's last sweep is not reported for ever).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    generate_latest,
    multiprocess,
    start_http_server,
    values,
)
from sessionfold.core.errors import InvalidInputError, MisuseError
from sessionfold.core.window import CompactionRecord, Outcome, RefusalReason, Trigger

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = [
    "FoldTimer",
    "Metrics",
    "MetricsServer",
    "VisitCounts",
    "enable_multiprocess",
    "exposition",
    "mark_process_dead",
    "metrics",
    "multiprocess_dir",
    "process_alive",
    "start_metrics_server",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_FOLD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The pipeline's metric set, registered in ``registry`` (tests pass a fresh one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.folds = Counter("sessionfold_folds", "Fold visits by outcome and trigger",
                             ["outcome", "trigger"], registry=reg)
        self.refusals = Counter("sessionfold_refusals", "Refusals to fold, by reason",
                                ["reason"], registry=reg)
        self.tokens_saved = Counter("sessionfold_tokens_saved",
                                    "Window tokens removed by folds (measured before - after)",
                                    registry=reg)
        self.summarizer_tokens = Counter("sessionfold_summarizer_tokens",
                                         "Tokens the summarizer used, by model and kind",
                                         ["model", "kind"], registry=reg)
        self.summarizer_cost = Counter("sessionfold_summarizer_cost_usd",
                                       "What the summarizer cost, in USD", ["model"], registry=reg)
        self.fold_duration = Histogram("sessionfold_fold_duration_seconds",
                                       "Duration of a fold job's visit, by outcome",
                                       ["outcome"], buckets=_FOLD_BUCKETS, registry=reg)
        self.scheduler_lag = Histogram("sessionfold_scheduler_lag_seconds",
                                       "From a usage event's time to its fold job's enqueue",
                                       buckets=_LAG_BUCKETS, registry=reg)
        self.usage_events = Counter("sessionfold_usage_events",
                                    "Usage events the scheduler read, by what became of them",
                                    ["result"], registry=reg)
        self.jobs_enqueued = Counter("sessionfold_fold_jobs_enqueued",
                                     "Fold jobs enqueued, by what found the session",
                                     ["source"], registry=reg)
        self.retries = Counter("sessionfold_fold_retries", "Fold job retries, by reason",
                               ["reason"], registry=reg)
        self.dead_letters = Counter("sessionfold_dead_letters",
                                    "Fold jobs given up on, by reason", ["reason"], registry=reg)
        self.recall_requests = Counter(
            "sessionfold_recall_requests",
            "Recall tool requests answered from the ledger, by kind and outcome",
            ["kind", "outcome"], registry=reg)
        self.guarded_requests = Counter(
            "sessionfold_guarded_requests",
            "Requests past the budget's line, by what the pre-send guard did: waited for the "
            "background fold (waited), folded inline (folded-inline), shrank the request "
            "(guarded), or could not bring it under (over-budget)", ["outcome"], registry=reg)
        self.batch_folds = Counter(
            "sessionfold_batch_folds",
            "Folds through a provider's batch API, by what became of the batch "
            "(submitted, collected, fallen-back, dropped)", ["event"], registry=reg)
        self.batch_folds_pending = Gauge(
            "sessionfold_batch_folds_pending",
            "Folds waiting on a provider's batch API (seen by the last sweep)", registry=reg,
            multiprocess_mode="livemostrecent")
        # Set by schedulers only. Under multiprocess mode the newest sweep of a live scheduler
        # wins (several may run on a host); a dead scheduler's last value leaves the sum.
        self.sessions_over_budget = Gauge(
            "sessionfold_sessions_over_budget",
            "Sessions whose current size is past their budget_tokens (seen by the last sweep)",
            registry=reg, multiprocess_mode="livemostrecent")
        self.paused_over_budget = Gauge(
            "sessionfold_paused_sessions_over_budget",
            "Paused sessions (never folded in the background) past their budget_tokens "
            "(seen by the last sweep)", registry=reg, multiprocess_mode="livemostrecent")

    # --- fold jobs ---------------------------------------------------------------------------
    def record_visit(self, record: CompactionRecord, *, duration_s: float | None = None,
                     cost_usd: float = 0.0) -> None:
        """Count one visit from its record: outcome, refusals, tokens saved, summarizer usage."""
        self.count_visit(VisitCounts.from_record(record, duration_s=duration_s,
                                                 cost_usd=cost_usd))

    def count_visit(self, visit: VisitCounts) -> None:
        """Count one visit from what metrics keep of it (a worker's, or an agent's inline fold
        that a scheduler read off the usage stream)."""
        self.folds.labels(visit.outcome, visit.trigger).inc()
        for reason in visit.refusals:
            self.refusals.labels(reason).inc()
        if visit.tokens_saved > 0:
            self.tokens_saved.inc(visit.tokens_saved)
        model = visit.model or "unknown"
        for kind, count in (("input", visit.input_tokens), ("output", visit.output_tokens),
                            ("cache_read", visit.cache_read_input_tokens),
                            ("cache_creation", visit.cache_creation_input_tokens)):
            if count:
                self.summarizer_tokens.labels(model, kind).inc(count)
        if visit.cost_usd > 0:
            self.summarizer_cost.labels(model).inc(visit.cost_usd)
        if visit.duration_s is not None:
            self.fold_duration.labels(visit.outcome).observe(visit.duration_s)

    @contextlib.contextmanager
    def track_fold(self, trigger: str = "threshold") -> Iterator[FoldTimer]:
        """Time a fold job; call ``timer.done(record)`` inside. No ``done`` and an escaping
        exception count as outcome ``error``; no ``done`` and no exception records nothing
        but the duration under ``skipped`` (a job that stopped at its claim)."""
        timer = FoldTimer(self, trigger)
        try:
            yield timer
        except BaseException:
            if not timer.recorded:
                self.folds.labels("error", trigger).inc()
                self.fold_duration.labels("error").observe(timer.elapsed())
            raise
        if not timer.recorded:
            self.fold_duration.labels("skipped").observe(timer.elapsed())

    def record_retry(self, reason: str) -> None:
        """A fold job will run again (``reason``: a status code or ``timeout``, a closed set)."""
        self.retries.labels(reason).inc()

    def record_dead_letter(self, reason: str) -> None:
        """A fold job was given up on (``reason``: ``max-attempts``, ``permanent-error``…)."""
        self.dead_letters.labels(reason).inc()

    # --- batch folds -------------------------------------------------------------------------
    def record_batch(self, event: str) -> None:
        """A batch fold's batch was ``submitted``, ``collected`` (its fold landed),
        ``fallen-back`` (the summarizer was called now instead) or ``dropped`` (nothing waits
        for its answer: the session was deleted, or its claim moved on)."""
        if event not in BATCH_EVENTS:
            raise InvalidInputError(f"batch fold: unknown event {event!r}")
        self.batch_folds.labels(event).inc()

    def set_batches_pending(self, n: int) -> None:
        """What the sweep saw: folds of its partitions waiting on a batch API."""
        self.batch_folds_pending.set(n)

    # --- recall ------------------------------------------------------------------------------
    def record_recall(self, kind: str, outcome: str) -> None:
        """One recall request answered (``kind``: ``seq``, ``query``, ``unknown``; ``outcome``:
        ``served``, ``clipped``, ``unavailable``, ``no-match``, ``invalid``: the closed sets of
        :mod:`sessionfold.client.recall`). Counted where it was answered: the process serving
        the agent's client or the HTTP service."""
        if kind not in RECALL_KINDS or outcome not in RECALL_OUTCOMES:
            raise InvalidInputError(f"recall: unknown kind {kind!r} or outcome {outcome!r}")
        self.recall_requests.labels(kind, outcome).inc()

    # --- the pre-send guard ------------------------------------------------------------------
    def record_guard(self, outcome: str) -> None:
        """One request the client's pre-send guard acted on (``outcome``: ``guarded``: shrunk
        under the budget; ``folded-inline``: nothing cheap got it under, so the client folded
        inline first; ``over-budget``: not under even then, refused, or sent over with
        ``over_budget="send"``). Counted in the process serving the agent's client, as recall
        requests are."""
        if outcome not in GUARD_OUTCOMES:
            raise InvalidInputError(f"guard: unknown outcome {outcome!r}")
        self.guarded_requests.labels(outcome).inc()

    # --- scheduler ---------------------------------------------------------------------------
    def count_usage_events(self, result: str, n: int = 1) -> None:
        """Usage events read: ``accepted`` (newest for its session), ``superseded`` (an older
        position than one already seen), ``malformed``, ``unknown-session``, ``deferred`` (newest
        too, but only its call time kept: under the trigger, the session's size written to the
        store less than ``scheduler_store_refresh_s`` ago)."""
        if n:
            self.usage_events.labels(result).inc(n)

    def count_enqueued(self, source: str, n: int = 1) -> None:
        """Fold jobs enqueued; ``source`` is ``stream``, ``nudge``, ``sweep`` or ``idle``."""
        if n:
            self.jobs_enqueued.labels(source).inc(n)

    def set_sessions_over_budget(self, n: int, *, paused: int = 0) -> None:
        """What the sweep saw: sessions past their budget that folds should bring down, and
        paused ones past it, which nothing folds (they grow with every turn)."""
        self.sessions_over_budget.set(n)
        self.paused_over_budget.set(paused)

    def observe_scheduler_lag(self, seconds: float) -> None:
        self.scheduler_lag.observe(max(seconds, 0.0))


@dataclass(frozen=True)
class VisitCounts:
    """What the metrics keep of one fold visit: label values from closed sets, and counts.

    Built from a :class:`CompactionRecord` where the visit ran; an agent's inline fold sends it
    over the usage stream (:class:`~sessionfold.runtime.usage.FoldEvent`) to be counted by a
    scheduler, so it is checked here against the closed sets: a label value comes from the
    project's own vocabulary, never from whatever a stream entry says.
    """

    trigger: str
    outcome: str
    refusals: tuple[str, ...] = ()
    tokens_saved: int = 0
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.trigger not in _TRIGGERS:
            raise InvalidInputError(f"fold visit: unknown trigger {self.trigger!r}")
        if self.outcome not in _OUTCOMES:
            raise InvalidInputError(f"fold visit: unknown outcome {self.outcome!r}")
        unknown = [r for r in self.refusals if r not in _REASONS]
        if unknown:
            raise InvalidInputError(f"fold visit: unknown refusal reasons {unknown!r}")
        if not (isinstance(self.model, str) and len(self.model) <= _MAX_MODEL_LEN
                and self.model.isprintable()):
            raise InvalidInputError("fold visit: model must be a short printable string")
        for name in ("tokens_saved", "input_tokens", "output_tokens", "cache_read_input_tokens",
                     "cache_creation_input_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidInputError(f"fold visit: {name} must be an integer >= 0")
        for name in ("cost_usd", "duration_s"):
            value = getattr(self, name)
            if value is None and name == "duration_s":
                continue
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise InvalidInputError(f"fold visit: {name} must be a finite number >= 0")

    @classmethod
    def from_record(cls, record: CompactionRecord, *, duration_s: float | None = None,
                    cost_usd: float = 0.0) -> VisitCounts:
        usage = record.summarizer_usage
        saved = record.measured_tokens - record.tokens_after
        return cls(trigger=record.trigger, outcome=record.outcome,
                   refusals=tuple(r.reason for r in record.refusals),
                   tokens_saved=saved if record.outcome == "folded" and saved > 0 else 0,
                   model=usage.model, input_tokens=usage.input_tokens,
                   output_tokens=usage.output_tokens,
                   cache_read_input_tokens=usage.cache_read_input_tokens,
                   cache_creation_input_tokens=usage.cache_creation_input_tokens,
                   cost_usd=max(cost_usd, 0.0), duration_s=duration_s)

    def to_json(self) -> dict[str, Any]:
        return {"trigger": self.trigger, "outcome": self.outcome,
                "refusals": list(self.refusals), "tokens_saved": self.tokens_saved,
                "model": self.model, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "cache_read_input_tokens": self.cache_read_input_tokens,
                "cache_creation_input_tokens": self.cache_creation_input_tokens,
                "cost_usd": self.cost_usd, "duration_s": self.duration_s}

    @classmethod
    def from_json(cls, data: object) -> VisitCounts:
        """The inverse of :meth:`to_json`; :class:`InvalidInputError` says what is wrong."""
        if not isinstance(data, dict) or set(data) != _JSON_FIELDS:
            raise InvalidInputError(f"fold visit: expected an object with {sorted(_JSON_FIELDS)}")
        refusals = data["refusals"]
        if not isinstance(refusals, list) or not all(isinstance(r, str) for r in refusals):
            raise InvalidInputError("fold visit: refusals must be a list of reasons")
        return cls(**{**data, "refusals": tuple(refusals)})


#: The label values of ``recall_requests_total`` (the recall module's kinds and outcomes).
RECALL_KINDS = frozenset({"seq", "query", "unknown"})
RECALL_OUTCOMES = frozenset({"served", "clipped", "unavailable", "no-match", "invalid"})
#: What becomes of a batch fold's batch (``batch_folds_total``).
BATCH_EVENTS = frozenset({"submitted", "collected", "fallen-back", "dropped"})
#: What the pre-send guard counts (its third outcome, ``under``, is the common case: not counted).
GUARD_OUTCOMES = frozenset({"waited", "guarded", "folded-inline", "over-budget"})
_TRIGGERS = frozenset(get_args(Trigger))
#: "error" is what track_fold counts for a visit that raised.
_OUTCOMES = frozenset(get_args(Outcome)) | {"error"}
_REASONS = frozenset(get_args(RefusalReason))
_MAX_MODEL_LEN = 200
_JSON_FIELDS = frozenset(VisitCounts.__dataclass_fields__)


@dataclass
class FoldTimer:
    """Times one fold job, handed out by :meth:`Metrics.track_fold`; ``done(record)`` counts
    the visit the job made (its record) with the time it took."""

    _metrics: Metrics
    trigger: str
    started: float = field(default_factory=perf_counter)
    recorded: bool = False

    def elapsed(self) -> float:
        return perf_counter() - self.started

    def done(self, record: CompactionRecord, *, cost_usd: float = 0.0) -> None:
        if self.recorded:
            return  # one visit, one count, even if a caller reports twice
        self.recorded = True
        self._metrics.record_visit(record, duration_s=self.elapsed(), cost_usd=cost_usd)


_default: Metrics | None = None
_default_lock = threading.Lock()


def metrics() -> Metrics:
    """The process's metric set in the default registry, made on first use.

    Made lazily so that :func:`enable_multiprocess` can still switch the value storage to
    files when it runs before the first metric is recorded.
    """
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Metrics()
    return _default


def multiprocess_dir() -> Path | None:
    """The multiprocess directory in effect, or None in single-process mode."""
    value = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    return Path(value) if value else None


def enable_multiprocess(directory: Path, *, clean: bool = True) -> None:
    """Keep metric values in files under ``directory``, shared by forked children.

    Call in the parent process before it forks and before any metric is recorded. ``clean``
    removes files of an earlier run (their counts would otherwise be added in): only for a
    directory of this process alone; a directory shared by a host's processes is joined through
    :func:`~sessionfold.runtime.exporter.join_host_metrics`, which never wipes a live one's.
    """
    if _default is not None and multiprocess_dir() is None:
        raise MisuseError("enable_multiprocess() must run before the first metric is recorded")
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if clean:
        for stale in directory.glob("*.db"):
            stale.unlink()
    os.environ[MULTIPROC_ENV] = str(directory)
    # prometheus_client picks its value storage from the environment; metrics made from now on
    # (and label children made later) store into mmap'd files per process.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def mark_process_dead(pid: int) -> None:
    """Tell the multiprocess collector a child exited (call from Celery's process shutdown)."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class _LiveProcessesCollector:
    """prometheus_client's multiprocess collector, after dropping the live-mode gauge files of
    processes that are gone (a killed scheduler never said it died)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._inner = multiprocess.MultiProcessCollector(  # type: ignore[no-untyped-call]
            None, path=str(directory))

    def collect(self) -> Iterable[Metric]:
        for path in self._directory.glob("gauge_live*.db"):
            pid = path.stem.rpartition("_")[2]
            if pid.isdigit() and not process_alive(int(pid)):
                multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                    int(pid), str(self._directory))
        return self._inner.collect()  # type: ignore[no-any-return,no-untyped-call]


def process_alive(pid: int) -> bool:
    """True while a process of this pid exists on the host (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exposition_registry() -> CollectorRegistry:
    directory = multiprocess_dir()
    if directory is None:
        return REGISTRY
    registry = CollectorRegistry()
    registry.register(_LiveProcessesCollector(directory))
    return registry


def exposition() -> bytes:
    """The text format of every metric, as ``/metrics`` would serve it now."""
    return generate_latest(_exposition_registry())


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``/metrics`` on a daemon thread (port 0 picks a free port; see ``.port``).

    Under multiprocess mode it adds up the values of every process writing to the directory.
    """
    server, thread = start_http_server(port, addr=host, registry=_exposition_registry())
    return MetricsServer(host, server.server_port, server, thread)

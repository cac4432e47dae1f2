"""Prometheus metrics of the pipeline, recorded through a few calls, exposed over HTTP.

Code records what happened in the project's own terms (a visit's :class:`CompactionRecord`, a
retry, a dead letter, a usage batch) and this module turns it into metrics; no other module
touches prometheus_client::

    m = metrics()                                   # the process's default set
    with m.track_fold("threshold") as visit:        # times the job; an escaping error counts
        record = ...                                # as outcome "error"
        visit.done(record, cost_usd=0.0012)         # folds, refusals, tokens saved, cost
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
not landing). Label values are small closed sets (outcomes, refusal reasons,
sources, status codes); never put a session id or an error message in a label.

**Celery prefork.** Each pool child is its own process with its own counters. Call
:func:`enable_multiprocess` in the parent before the pool forks (and before the first metric is
recorded): values then live in files under ``PROMETHEUS_MULTIPROC_DIR`` and
:func:`start_metrics_server` (in the parent) adds up every process's files.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
    values,
)
from sessionfold.core.window import CompactionRecord

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = [
    "FoldVisit",
    "Metrics",
    "MetricsServer",
    "enable_multiprocess",
    "exposition",
    "mark_process_dead",
    "metrics",
    "multiprocess_dir",
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
        # "max" under multiprocess mode: only the scheduler sets it; other processes report 0.
        self.sessions_over_budget = Gauge(
            "sessionfold_sessions_over_budget",
            "Sessions whose current size is past their budget_tokens (seen by the last sweep)",
            registry=reg, multiprocess_mode="max")

    # --- fold jobs ---------------------------------------------------------------------------
    def record_visit(self, record: CompactionRecord, *, duration_s: float | None = None,
                     cost_usd: float = 0.0) -> None:
        """Count one visit from its record: outcome, refusals, tokens saved, summarizer usage."""
        self.folds.labels(record.outcome, record.trigger).inc()
        for refusal in record.refusals:
            self.refusals.labels(refusal.reason).inc()
        if record.outcome == "folded" and record.measured_tokens > record.tokens_after:
            self.tokens_saved.inc(record.measured_tokens - record.tokens_after)
        usage = record.summarizer_usage
        model = usage.model or "unknown"
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens),
                            ("cache_read", usage.cache_read_input_tokens),
                            ("cache_creation", usage.cache_creation_input_tokens)):
            if count:
                self.summarizer_tokens.labels(model, kind).inc(count)
        if cost_usd > 0:
            self.summarizer_cost.labels(model).inc(cost_usd)
        if duration_s is not None:
            self.fold_duration.labels(record.outcome).observe(duration_s)

    @contextlib.contextmanager
    def track_fold(self, trigger: str = "threshold") -> Iterator[FoldVisit]:
        """Time a fold job; call ``visit.done(record)`` inside. No ``done`` and an escaping
        exception count as outcome ``error``; no ``done`` and no exception records nothing
        but the duration under ``skipped`` (a job that stopped at its claim)."""
        visit = FoldVisit(self, trigger)
        try:
            yield visit
        except BaseException:
            if not visit.recorded:
                self.folds.labels("error", trigger).inc()
                self.fold_duration.labels("error").observe(visit.elapsed())
            raise
        if not visit.recorded:
            self.fold_duration.labels("skipped").observe(visit.elapsed())

    def record_retry(self, reason: str) -> None:
        """A fold job will run again (``reason``: a status code or ``timeout``, a closed set)."""
        self.retries.labels(reason).inc()

    def record_dead_letter(self, reason: str) -> None:
        """A fold job was given up on (``reason``: ``max-attempts``, ``permanent-error``…)."""
        self.dead_letters.labels(reason).inc()

    # --- scheduler ---------------------------------------------------------------------------
    def count_usage_events(self, result: str, n: int = 1) -> None:
        """Usage events read: ``accepted`` (newest for its session), ``superseded`` (an older
        position than one already seen), ``malformed``, ``unknown-session``."""
        if n:
            self.usage_events.labels(result).inc(n)

    def count_enqueued(self, source: str, n: int = 1) -> None:
        """Fold jobs enqueued; ``source`` is ``stream`` or ``sweep``."""
        if n:
            self.jobs_enqueued.labels(source).inc(n)

    def set_sessions_over_budget(self, n: int) -> None:
        self.sessions_over_budget.set(n)

    def observe_scheduler_lag(self, seconds: float) -> None:
        self.scheduler_lag.observe(max(seconds, 0.0))


@dataclass
class FoldVisit:
    """Handed out by :meth:`Metrics.track_fold`; ``done(record)`` records the visit."""

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
    removes files of an earlier run (their counts would otherwise be added in).
    """
    if _default is not None and multiprocess_dir() is None:
        raise RuntimeError("enable_multiprocess() must run before the first metric is recorded")
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


def _exposition_registry() -> CollectorRegistry:
    if multiprocess_dir() is None:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
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

"""sessionfold in B1 on a deterministic clock: the real client, store, scheduler rule and fold
procedure, with the fold's landing placed by call count instead of by wall time.

The real pipeline (:mod:`b1.pipeline_systems`) lands a background fold whenever its worker gets
to it, which makes a run depend on the machine's load. Here every piece that decides is the
product's own, and only the transport is simulated:

- the agent is a :class:`~sessionfold.client.SessionHandle` (``call(fn)`` with the recall tool,
  ``append``), on a SQLite :class:`~sessionfold.store.SessionStore`;
- the usage bus is a publisher that hands each event straight to what the scheduler does with
  it: a :class:`~sessionfold.runtime.usage.UsageEvent` is written with
  ``apply_usage_batch([_report(event)])`` (the scheduler's own conversion) and a
  :class:`~sessionfold.runtime.usage.NudgeEvent` only asks; either way the session is then
  judged by :func:`sessionfold.workers.scheduler.skip_reason` on a fresh read, one job at a
  time per session (the fold lock);
- a job is :func:`sessionfold.runtime.fold_procedure.run_fold`, priced with
  :func:`sessionfold.runtime.prices.fold_pricing`, on a thread of its own. It claims the session
  and reads the window at once (when the scheduler decided); its first summarizer call is held
  until the agent is about to make call N + 1 + ``lag`` (N: the call whose report or append asked
  for it), then released, and the fold commits under compare-and-set onto a window the agent
  has kept appending to. ``lag=0``: a fold asked for after call N lands before call N + 1;
  ``lag=5``: before call N + 6 (a summarizer slower than the agent). A job that needs no
  summarizer call (the cheap layers, a refusal, a priced ``would-not-pay``) lands at once;
- inline folds (the client's overflow fallback and its hard-cap guard) use the same fake
  summarizer unheld, on the agent's thread, as a real agent's would; a request past the guard's
  line that waits for the job in flight (the hard cap's first step) has it land then;
- the idle-gap scenario (:mod:`b1.idle`) is played on a model clock the store stamps its rows
  with (each call 4 s, each gap its length): at a gap the job in flight lands, and once the
  session's cache is cold the scheduler's idle sweep sends an ``idle`` fold (when
  :func:`skip_reason` allows it), on a worker thread of its own;
- with ``batch_delay_s`` (``sessionfold-sim-batch``) the folds the cost model lets wait go
  through the batch API: the stand-in's Message Batches (:mod:`sessionfold.cli.standin.
  batches`), reached through the real ``anthropic`` SDK, in front of the fake summarizer, a
  batch ending that many model seconds after it is sent. The sweep looks at a waiting batch
  every 60 s of model time (at once when its session outgrew its trigger), and
  :func:`sessionfold.runtime.batch_collect.collect_batch` lands it; a session's batch is run to
  its end when its replay finishes (the provider answers, and bills, it anyway).

Nothing sleeps: the scripted model and the summarizer are answered at once (``time_scale`` 0),
so a run of hundreds of sessions takes minutes and gives the same figures every time.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sessionfold.client import Client, SessionHandle
from sessionfold.core.errors import BudgetExceededError, ContextOverflowError
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summarizer, Summary
from sessionfold.runtime import fold_procedure
from sessionfold.runtime.batch_collect import collect_batch
from sessionfold.runtime.batch_folds import BatchTicket
from sessionfold.runtime.fold_procedure import BATCH_PENDING, FoldJob, FoldReport, run_fold
from sessionfold.runtime.prices import fold_pricing
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import Event, NudgeEvent, UsageEvent
from sessionfold.runtime.wiring import batch_offer
from sessionfold.store import SessionStore
from sessionfold.workers.scheduler import skip_reason
from sessionfold.workers.usage_intake import _report

from .counting import Counter, Request
from .fakes import MODEL_SECONDS, FakeSummarizer
from .idle import SWEEP_INTERVAL_S
from .replay import Env, ModelFn
from .sessionfold_systems import (
    CONTEXT_WINDOW,
    batch_desk,
    describe_policy,
    fake_summarizer,
    make_policy,
)
from .transcripts import Transcript

__all__ = ["SimDeployment", "SimSystem"]

#: Where the deployment's model clock starts (the store's stamps are model time).
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class _HeldSummarizer:
    """The workers' summarizer for one job: its first call waits for :meth:`release`."""

    def __init__(self, inner: Summarizer) -> None:
        self.inner = inner
        self.model = inner.model
        self.context_tokens = inner.context_tokens
        self.parked = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        if not self._go.is_set():
            self.parked.set()
            self._go.wait()
        return self.inner.summarize(messages, previous_summary=previous_summary,
                                    must_keep=must_keep)


@dataclass
class _Job:
    session_id: str
    due: int
    summarizer: _HeldSummarizer
    thread: threading.Thread = field(default_factory=threading.Thread)
    reports: list[FoldReport] = field(default_factory=list)
    error: list[BaseException] = field(default_factory=list)


class _Bus:
    """The usage publisher: each event goes straight to the scheduler's decision."""

    def __init__(self, deployment: SimDeployment) -> None:
        self.deployment = deployment

    def publish(self, event: Event) -> bool:
        if isinstance(event, UsageEvent):
            self.deployment.store.apply_usage_batch([_report(event)])
            self.deployment.consider(event.session_id)
        elif isinstance(event, NudgeEvent):
            self.deployment.consider(event.session_id)
        return True  # FoldEvents (an inline fold, counted for /metrics) are not needed here

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        pass


class SimDeployment:
    """One store, one client and the simulated scheduler/workers (see the module doc).

    ``batch_delay_s``: background folds may go through the batch API (the stand-in's Message
    Batches in front of the fake summarizer, a batch ending that many model seconds after it
    was sent); None: never.
    """

    def __init__(self, fake: FakeSummarizer, *, lag: int = 0,
                 batch_delay_s: float | None = None) -> None:
        if lag < 0:
            raise ValueError(f"lag must be >= 0, got {lag}")
        self.lag = lag
        self.dir = Path(tempfile.mkdtemp(prefix="b1-sim-"))
        self.settings = Settings(data_dir=self.dir / "data",
                                 database_url=f"sqlite:///{self.dir / 'store.db'}",
                                 anthropic_api_key="b1-fake", summarizer="anthropic",
                                 metrics_port=0, batch_folds=batch_delay_s is not None,
                                 batch_delay_s=batch_delay_s or 600.0)
        #: Model seconds since the deployment started: each call takes MODEL_SECONDS, an idle
        #: gap its length. The store stamps rows (and sets leases, and batch deadlines) with it.
        self.clock_s = 0.0
        self.store = SessionStore.from_url(self.settings.store_url, clock=self._now)
        self.store.migrate()
        self.desk = (None if batch_delay_s is None else
                     batch_desk(fake, delay_s=batch_delay_s, clock=lambda: self.clock_s))
        self.summarizer = fake_summarizer(fake, batches=self.desk)
        self.pricing = fold_pricing(self.settings)
        self.batch = (None if batch_delay_s is None else
                      batch_offer(self.settings, self.summarizer))
        self.client = Client(self.settings, self.store, _Bus(self),  # type: ignore[arg-type]
                             redis_url=None, summarizer=self.summarizer)
        # A request past its guard's line waits for the job on its way (the client's hard
        # cap): on the simulated clock the job lands then, however many calls early.
        self.client.await_window_change = self._await_fold  # type: ignore[method-assign]
        #: Calls each session's agent has started (the clock jobs land by).
        self.calls: dict[str, int] = {}
        self.jobs: dict[str, _Job] = {}
        self.reports: list[FoldReport] = []
        self.skips: dict[str, int] = {}
        #: Requests that waited for the job in flight (it landed early).
        self.waits = 0
        #: Batch folds waiting, by session: the ticket, and when the next look at it is due.
        self.waiting: dict[str, tuple[BatchTicket, float]] = {}
        #: What became of the batches sent (submitted, collected, fallen-back, dropped).
        self.batch_events: dict[str, int] = {}
        #: Sessions opened so far (their ids count them).
        self.sessions = 0

    def _now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.clock_s)

    # --- the scheduler and the workers ---------------------------------------------------------

    def consider(self, sid: str) -> None:
        """What the scheduler does with a report past the trigger, or a nudge: one job per
        session at a time, enqueued when :func:`skip_reason` finds none needed."""
        if sid in self.jobs:
            return  # the fold lock is held: "job-pending"
        info = self.store.get_session(sid)
        reason = skip_reason(info)
        if reason is not None:
            self.skips[reason] = self.skips.get(reason, 0) + 1
            return
        held = _HeldSummarizer(self.summarizer)
        job = FoldJob(session_id=sid, job_id=f"sim-{uuid.uuid4().hex[:12]}",
                      trigger="threshold", enqueued_epoch=info.fold_epoch,
                      lease_s=self.settings.task_time_limit_s)
        slot = _Job(sid, self.calls.get(sid, 0) + self.lag, held)
        slot.thread = threading.Thread(target=self._run, args=(slot, job),
                                       name=f"sim-fold-{sid}", daemon=True)
        self.jobs[sid] = slot
        slot.thread.start()
        # The worker claims and reads now; it is either waiting on its summarizer or done.
        while not held.parked.wait(0.005):
            if not slot.thread.is_alive():
                break
        if not slot.thread.is_alive():
            self._land(slot)

    def _await_fold(self, sid: str, revision: int, tokens: int, timeout_s: float) -> bool:
        """:meth:`Client.await_window_change` here: the agent waits for the job in flight, so
        it lands now. None in flight (the scheduler already passed on the report, or a batch
        is waiting): nothing to wait for, as the real client finds."""
        slot = self.jobs.get(sid)
        if slot is None or timeout_s <= 0:
            return False
        self._land(slot)
        self.waits += 1
        return self.store.get_session(sid).revision != revision

    def _run(self, slot: _Job, job: FoldJob) -> None:
        try:
            slot.reports.append(run_fold(self.store, slot.summarizer, job, pricing=self.pricing,
                                         batch=self.batch))
        except BaseException as exc:  # surfaced on the agent's thread
            slot.error.append(exc)

    def _land(self, slot: _Job) -> None:
        slot.summarizer.release()
        slot.thread.join()
        self.jobs.pop(slot.session_id, None)
        if slot.error:
            raise RuntimeError(f"a fold of {slot.session_id} failed") from slot.error[0]
        for report in slot.reports:
            self._took(report)

    def _took(self, report: FoldReport) -> None:
        """A worker's report: kept, and a batch it sent is looked at from now on."""
        self.reports.append(report)
        if report.batch_event is not None:
            self.batch_events[report.batch_event] = self.batch_events.get(
                report.batch_event, 0) + 1
        if report.outcome == BATCH_PENDING and report.batch is not None:
            self.waiting[report.session_id] = (
                BatchTicket.from_json(report.batch),
                self.clock_s + self.settings.batch_poll_interval_s)
        elif report.batch is not None:
            self.waiting.pop(report.session_id, None)

    def _look(self, sid: str, *, urgent: bool = False) -> None:
        """The scheduler's sweep: a look at the session's batch when one is due (every poll
        interval), or at once when its session outgrew its trigger; the look runs as a
        worker's job would, off the agent's thread."""
        held = self.waiting.get(sid)
        if held is None or self.batch is None:
            return
        ticket, due = held
        if self.clock_s < due and not (urgent and self._outgrew(sid)):
            return
        self.waiting[sid] = (ticket, self.clock_s + self.settings.batch_poll_interval_s)
        found: list[FoldReport] = []
        worker = threading.Thread(target=lambda: found.append(collect_batch(
            self.store, self.summarizer, self.batch, ticket, pricing=self.pricing,
            lease_s=self.settings.task_time_limit_s)), name=f"sim-collect-{sid}")
        worker.start()
        worker.join()
        if not found:
            raise RuntimeError(f"the collection of {sid}'s batch failed")
        self._took(found[0])

    def _outgrew(self, sid: str) -> bool:
        info = self.store.get_session(sid)
        return info.current_tokens > info.policy.trigger_tokens

    def before_call(self, sid: str) -> None:
        """The agent is about to make its next call: land the job that is due by then, and
        look at its batch if a look is due; then the call takes its model time."""
        slot = self.jobs.get(sid)
        if slot is not None and self.calls.get(sid, 0) >= slot.due:
            self._land(slot)
        # A sweep runs every SWEEP_INTERVAL_S: an urgent look waits for the next one.
        since = self.clock_s % SWEEP_INTERVAL_S
        self._look(sid, urgent=since < MODEL_SECONDS)
        self.calls[sid] = self.calls.get(sid, 0) + 1
        self.clock_s += MODEL_SECONDS

    def idle(self, sid: str, seconds: float) -> None:
        """The agent is idle ``seconds`` of model time: a job in flight lands meanwhile; once
        its cache has gone cold the idle sweep sends an ``idle`` fold (what
        :func:`skip_reason` allows), which lands at once or, sent as a batch, when the batch
        ends; the looks at a waiting batch go on through the gap."""
        self.settle(sid)
        end = self.clock_s + seconds
        cold_at = self.clock_s + self.settings.cache_cold_after_s
        if end > cold_at:
            self._pass(sid, cold_at)
            self.clock_s = cold_at
            info = self.store.get_session(sid)
            if skip_reason(info, trigger="idle") is None:
                job = FoldJob(session_id=sid, job_id=f"sim-idle-{uuid.uuid4().hex[:12]}",
                              trigger="idle", enqueued_epoch=info.fold_epoch,
                              lease_s=self.settings.task_time_limit_s)
                found: list[FoldReport] = []
                worker = threading.Thread(target=lambda: found.append(run_fold(
                    self.store, self.summarizer, job, pricing=self.pricing, batch=self.batch)),
                    name=f"sim-idle-{sid}")
                worker.start()
                worker.join()
                if not found:
                    raise RuntimeError(f"the idle fold of {sid} failed")
                self._took(found[0])
        self._pass(sid, end)
        self.clock_s = end

    def _pass(self, sid: str, until: float) -> None:
        """Model time passes to ``until`` with no calls: the looks due meanwhile are made."""
        while sid in self.waiting and self.waiting[sid][1] <= until:
            self.clock_s = max(self.clock_s, self.waiting[sid][1])
            self._look(sid)

    def settle(self, sid: str) -> None:
        slot = self.jobs.get(sid)
        if slot is not None:
            self._land(slot)

    def finish(self, sid: str) -> None:
        """The session's run is over: its job lands, and its batch runs to its end (the
        provider answers it, and bills it, whether or not a call follows)."""
        self.settle(sid)
        while sid in self.waiting:
            self.clock_s = max(self.clock_s, self.waiting[sid][1])
            self._look(sid)

    def close(self) -> None:
        for slot in list(self.jobs.values()):
            self._land(slot)
        for sid in list(self.waiting):
            self.finish(sid)
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class _SimSession:
    """One transcript's agent: a handle that offers the recall tool."""

    offers_recall = True

    def __init__(self, handle: SessionHandle, deployment: SimDeployment,
                 counter: Counter) -> None:
        self.handle = handle
        self.deployment = deployment
        self.counter = counter
        self.seq = 0
        self.replies = 0

    def append(self, message: Mapping[str, Any]) -> None:
        self.handle.append([dict(message)], key=f"m{self.seq}")
        self.seq += 1

    def call(self, model: ModelFn) -> None:
        self.deployment.before_call(self.handle.session_id)

        def fn(system: str, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]]) -> dict[str, Any]:
            return self._reply(model, Request(system, messages, tools))

        try:
            self.handle.call(fn)
        except BudgetExceededError:
            # One message that cannot be brought under the budget (thinking larger than it):
            # nothing was sent, and the error says what a real agent does next. The request
            # then goes out over the budget, and is counted so.
            self.handle.call(fn, over_budget="send")

    def _reply(self, model: ModelFn, request: Request) -> dict[str, Any]:
        tokens = self.counter.request(request)
        if tokens > CONTEXT_WINDOW:  # the provider's 400: the client folds and retries
            raise ContextOverflowError(f"prompt is too long: {tokens} tokens > "
                                       f"{CONTEXT_WINDOW} maximum")
        reply = model(request)
        self.replies += 1
        return {"id": f"msg_sim_{self.replies}", "type": "message", "role": "assistant",
                "model": "b1-scripted", "content": reply.content,
                "stop_reason": reply.stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": reply.input_tokens, "output_tokens": 1}}

    def request(self) -> Request:  # the replay asks a CallingSession through call() only
        raise NotImplementedError

    def reported(self, request: Request, tokens: int) -> None:
        raise NotImplementedError

    def idle(self, seconds: float) -> None:
        self.deployment.idle(self.handle.session_id, seconds)

    def finish(self) -> None:
        self.deployment.finish(self.handle.session_id)

    def retained(self) -> list[dict[str, Any]]:
        return [e.message.to_json() for e in self.handle.ledger() if e.message is not None]


class SimSystem:
    """``sessionfold-sim`` (folds land before the next call), ``sessionfold-sim-lag5`` (six
    calls late) and ``sessionfold-sim-batch`` (folds that can wait go through the batch API,
    a batch ending ``batch_delay_s`` model seconds after it was sent): a fresh deployment per
    budget, one session per transcript."""

    def __init__(self, fake: FakeSummarizer, *, lag: int = 0,
                 overrides: Mapping[str, Any] | None = None,
                 batch_delay_s: float | None = None) -> None:
        self.fake = fake
        self.lag = lag
        self.batch_delay_s = batch_delay_s
        self.name = "sessionfold-sim" if lag == 0 else f"sessionfold-sim-lag{lag}"
        if batch_delay_s is not None:
            self.name += "-batch"
        self.overrides = dict(overrides or {})
        self.deployment: SimDeployment | None = None

    def describe(self, budget: int) -> str:
        when = ("before the next call" if self.lag == 0
                else f"{self.lag + 1} calls after the call that asked for it")
        batch = ("" if self.batch_delay_s is None else
                 "; folds that can wait go through Message Batches (the stand-in's, in front "
                 f"of the fake summarizer: a batch ends {self.batch_delay_s:g} model seconds "
                 "after it is sent, looked at every 60 s, at half the summarizer's price)")
        return ("the real client (call(fn) with the recall tool), store, scheduler rule "
                f"(skip_reason, the idle sweep) and fold procedure (run_fold, priced); folds "
                f"land {when}{batch}; "
                + describe_policy(make_policy(budget, self.overrides), self.overrides))

    def start(self) -> None:
        # A fresh deployment: its workers have landed no fold yet (the fold procedure's lag
        # prior is per process, and one process replays every system and budget in turn).
        fold_procedure.FOLD_LAG = fold_procedure._Lag()
        self.deployment = SimDeployment(self.fake, lag=self.lag,
                                        batch_delay_s=self.batch_delay_s)

    def stop(self) -> None:
        if self.deployment is not None:
            self.deployment.close()
            self.deployment = None

    def session(self, transcript: Transcript, budget: int, env: Env) -> _SimSession:
        if self.deployment is None:
            raise RuntimeError("start() the system before replaying through it")
        # A session id the same in every run: recall answers carry a digest of it, and a
        # random one made their token counts (and so the figures) differ from run to run.
        self.deployment.sessions += 1
        handle = self.deployment.client.session(
            f"sim-{budget}-{transcript.id}-{self.deployment.sessions}",
            policy=make_policy(budget, self.overrides), system=transcript.system)
        return _SimSession(handle, self.deployment, env.counter)

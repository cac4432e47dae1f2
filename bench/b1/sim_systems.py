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
  summarizer unheld, on the agent's thread, as a real agent's would.

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
from pathlib import Path
from typing import Any

from sessionfold.client import Client, SessionHandle
from sessionfold.core.errors import BudgetExceededError, ContextOverflowError
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summarizer, Summary
from sessionfold.runtime import fold_procedure
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport, run_fold
from sessionfold.runtime.prices import fold_pricing
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import Event, NudgeEvent, UsageEvent
from sessionfold.runtime.wiring import open_store
from sessionfold.workers.scheduler import _report, skip_reason

from .counting import Counter, Request
from .fakes import FakeSummarizer
from .replay import Env, ModelFn
from .sessionfold_systems import CONTEXT_WINDOW, describe_policy, fake_summarizer, make_policy
from .transcripts import Transcript

__all__ = ["SimDeployment", "SimSystem"]


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
    """One store, one client and the simulated scheduler/workers (see the module doc)."""

    def __init__(self, fake: FakeSummarizer, *, lag: int = 0) -> None:
        if lag < 0:
            raise ValueError(f"lag must be >= 0, got {lag}")
        self.lag = lag
        self.dir = Path(tempfile.mkdtemp(prefix="b1-sim-"))
        self.settings = Settings(data_dir=self.dir / "data",
                                 database_url=f"sqlite:///{self.dir / 'store.db'}",
                                 anthropic_api_key="b1-fake", summarizer="anthropic",
                                 metrics_port=0)
        self.store = open_store(self.settings, migrate=True)
        self.summarizer = fake_summarizer(fake)
        self.pricing = fold_pricing(self.settings)
        self.client = Client(self.settings, self.store, _Bus(self),  # type: ignore[arg-type]
                             redis_url=None, summarizer=self.summarizer)
        #: Calls each session's agent has started (the clock jobs land by).
        self.calls: dict[str, int] = {}
        self.jobs: dict[str, _Job] = {}
        self.reports: list[FoldReport] = []
        self.skips: dict[str, int] = {}

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

    def _run(self, slot: _Job, job: FoldJob) -> None:
        try:
            slot.reports.append(run_fold(self.store, slot.summarizer, job, pricing=self.pricing))
        except BaseException as exc:  # surfaced on the agent's thread
            slot.error.append(exc)

    def _land(self, slot: _Job) -> None:
        slot.summarizer.release()
        slot.thread.join()
        self.jobs.pop(slot.session_id, None)
        if slot.error:
            raise RuntimeError(f"a fold of {slot.session_id} failed") from slot.error[0]
        self.reports.extend(slot.reports)

    def before_call(self, sid: str) -> None:
        """The agent is about to make its next call: land the job that is due by then."""
        slot = self.jobs.get(sid)
        if slot is not None and self.calls.get(sid, 0) >= slot.due:
            self._land(slot)
        self.calls[sid] = self.calls.get(sid, 0) + 1

    def settle(self, sid: str) -> None:
        slot = self.jobs.get(sid)
        if slot is not None:
            self._land(slot)

    def close(self) -> None:
        for slot in list(self.jobs.values()):
            self._land(slot)
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

    def finish(self) -> None:
        self.deployment.settle(self.handle.session_id)

    def retained(self) -> list[dict[str, Any]]:
        return [e.message.to_json() for e in self.handle.ledger() if e.message is not None]


class SimSystem:
    """``sessionfold-sim`` (folds land before the next call) and ``sessionfold-sim-late``
    (six calls late): a fresh deployment per budget, one session per transcript."""

    def __init__(self, fake: FakeSummarizer, *, lag: int = 0,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.fake = fake
        self.lag = lag
        self.name = "sessionfold-sim" if lag == 0 else f"sessionfold-sim-lag{lag}"
        self.overrides = dict(overrides or {})
        self.deployment: SimDeployment | None = None

    def describe(self, budget: int) -> str:
        when = ("before the next call" if self.lag == 0
                else f"{self.lag + 1} calls after the call that asked for it")
        return ("the real client (call(fn) with the recall tool), store, scheduler rule "
                f"(skip_reason) and fold procedure (run_fold, priced); folds land {when}; "
                + describe_policy(make_policy(budget, self.overrides), self.overrides))

    def start(self) -> None:
        # A fresh deployment: its workers have landed no fold yet (the fold procedure's lag
        # prior is per process, and one process replays every system and budget in turn).
        fold_procedure.FOLD_LAG = fold_procedure._Lag()
        self.deployment = SimDeployment(self.fake, lag=self.lag)

    def stop(self) -> None:
        if self.deployment is not None:
            self.deployment.close()
            self.deployment = None

    def session(self, transcript: Transcript, budget: int, env: Env) -> _SimSession:
        if self.deployment is None:
            raise RuntimeError("start() the system before replaying through it")
        handle = self.deployment.client.session(
            f"sim-{budget}-{transcript.id}-{uuid.uuid4().hex[:6]}",
            policy=make_policy(budget, self.overrides), system=transcript.system)
        return _SimSession(handle, self.deployment, env.counter)

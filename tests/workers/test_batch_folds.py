"""Batch folds in the runtime: a fold that can wait is sent to a provider's batch API, the session
is marked pending, and a later collection lands it through the same claim and compare-and-set.

Driven through the real fold procedure, collection, store (SQLite, a clock the test moves) and,
for the scheduler, the real Redis; the provider's batch API is an in-process fake whose batches
end when the test says (the real SDKs against the stand-in are in
``test_batch_providers.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry
from sessionfold.core.errors import SummarizerError, TransientSummarizerError
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.messages import Message
from sessionfold.core.prices import DEFAULT_PRICES
from sessionfold.core.summarizers import ExtractiveSummarizer, Summary
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime.batch_collect import collect_batch
from sessionfold.runtime.batch_folds import BatchOffer, BatchTicket
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport, run_fold
from sessionfold.runtime.metrics import Metrics
from sessionfold.runtime.providers.batch_api import BatchPoll
from sessionfold.runtime.settings import Settings
from sessionfold.store.store import SessionStore
from sessionfold.workers.pending_batches import PendingBatches
from sessionfold.workers.scheduler import Scheduler, skip_reason
from test_idle_folds import NOW, RecordingEnqueue, new_session, report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_helpers import Clock

PRICING = FoldPricing(agent=DEFAULT_PRICES["claude-sonnet-4-5"],
                      summarizer=DEFAULT_PRICES["claude-haiku-4-5"])
SID = "s1"


class FakeBatchApi:
    """A provider's batch API in process: batches end, expire or fail when the test says."""

    provider = "fake"

    def __init__(self, summarizer: Batchable) -> None:
        self.summarizer = summarizer
        self.sent: dict[str, tuple[str, dict[str, Any]]] = {}
        self.state: dict[str, str] = {}
        self.errors: dict[str, SummarizerError] = {}
        self.cancelled: list[str] = []
        self.refuse: SummarizerError | None = None

    def submit(self, custom_id: str, request: Any) -> str:
        if self.refuse is not None:
            raise self.refuse
        batch_id = f"batch-{len(self.sent) + 1}"
        self.sent[batch_id] = (custom_id, dict(request))
        self.state[batch_id] = "pending"
        return batch_id

    def poll(self, batch_id: str, custom_id: str) -> BatchPoll:
        state = self.state[batch_id]
        if state != "ended":
            return BatchPoll(state)  # type: ignore[arg-type]
        sent_id, request = self.sent[batch_id]
        assert sent_id == custom_id
        if batch_id in self.errors:
            return BatchPoll("ended", answer=self.errors[batch_id])
        summary = self.summarizer.answer(request["messages"], request["previous_summary"],
                                         request["must_keep"])
        return BatchPoll("ended", answer=Summary(summary.text, summary.usage.through_batch()))

    def cancel(self, batch_id: str) -> None:
        self.cancelled.append(batch_id)
        if self.state[batch_id] == "pending":
            self.state[batch_id] = "cancelled"


class Batchable:
    """The offline summarizer, with usage to count and a batch API of its own."""

    model = "fake-batch-model"
    context_tokens = 100_000

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.api = FakeBatchApi(self)
        self.live_calls = 0

    def answer(self, messages: Sequence[Message], previous_summary: str | None,
               must_keep: Sequence[str]) -> Summary:
        text = self.inner.summarize(messages, previous_summary=previous_summary,
                                    must_keep=must_keep).text
        return Summary(text, SummarizerUsage(model=self.model, calls=1, input_tokens=2000,
                                             output_tokens=100))

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        self.live_calls += 1
        return self.answer(messages, previous_summary, must_keep)

    def build_request(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                      must_keep: Sequence[str] = (), nonce: str | None = None
                      ) -> dict[str, Any]:
        return {"messages": list(messages), "previous_summary": previous_summary,
                "must_keep": list(must_keep)}

    def batch_api(self) -> FakeBatchApi:
        return self.api


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    s = SessionStore.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def summarizer() -> Batchable:
    return Batchable()


@pytest.fixture
def offer(summarizer: Batchable) -> BatchOffer:
    return BatchOffer(summarizer, delay_s=600, max_wait_s=3600)


def idle_session(store: SessionStore, sid: str = SID) -> None:
    """A session idle past its cache's lifetime, between its idle trigger and its trigger."""
    new_session(store, sid, steps=10)
    report(store, sid, 6_500)


def submit(store: SessionStore, summarizer: Batchable, offer: BatchOffer,
           job_id: str = "job-1") -> FoldReport:
    sent = run_fold(store, summarizer, FoldJob(SID, job_id, trigger="idle", lease_s=60),
                    pricing=PRICING, batch=offer)
    assert sent.outcome == "batch-pending", sent.detail
    return sent


def collect(store: SessionStore, summarizer: Batchable, offer: BatchOffer | None,
            sent: FoldReport) -> FoldReport:
    assert sent.batch is not None
    return collect_batch(store, summarizer, offer, BatchTicket.from_json(sent.batch),
                         pricing=PRICING)


def test_a_fold_that_can_wait_goes_to_the_batch_api_and_marks_its_session_pending(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    assert summarizer.live_calls == 0 and list(summarizer.api.state) == ["batch-1"]
    flower = sent.to_json()
    assert flower["outcome"] == "batch-pending"
    assert flower["batch"] == {"session": SID, "incarnation": sent.incarnation, "job": "job-1",
                               "provider": "fake", "batch": "batch-1", "event": "submitted"}
    info = store.get_session(SID)
    assert info.batch is not None and info.claimed_by == "job-1"
    assert store.records(SID) == []  # the visit is not over: nothing recorded yet
    # Neither a threshold nor an idle visit is planned again while it waits.
    assert skip_reason(info) == skip_reason(info, trigger="idle") == "batch-pending"


def test_the_collected_fold_lands_through_the_claim_and_compare_and_set(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    waiting = collect(store, summarizer, offer, sent)
    assert waiting.outcome == "batch-pending" and waiting.batch_event is None
    summarizer.api.state["batch-1"] = "ended"
    landed = collect(store, summarizer, offer, sent)
    assert landed.outcome == "folded" and landed.batch_event == "collected"
    assert landed.epoch == sent.epoch and summarizer.live_calls == 0
    record = store.records(SID)[-1]
    assert record.outcome == "folded" and record.job_id == "job-1"
    assert record.economics is not None and record.economics["batch"] is True
    assert record.summarizer_usage.batch_calls == record.summarizer_usage.calls == 1
    (span,) = store.spans(SID)
    assert span.job_id == "job-1" and span.epoch == sent.epoch
    info = store.get_session(SID)
    assert info.batch is None and info.claimed_by is None
    # The fold's wait is not a worker's lag: the session's measure is not moved by it.
    assert info.fold_lag_calls is None
    # A look after the landing lands nothing again.
    again = collect(store, summarizer, offer, sent)
    assert again.claim == "already-committed" and again.batch_event is None
    assert len(store.spans(SID)) == 1


def test_an_append_while_the_batch_runs_does_not_make_the_fold_stale(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    before = store.get_session(SID).ledger_len
    store.append(SID, [{"role": "assistant", "content": "back at work: TICKET-1 next"},
                       {"role": "user", "content": "go on"}])
    summarizer.api.state["batch-1"] = "ended"
    landed = collect(store, summarizer, offer, sent)
    assert landed.outcome == "folded" and landed.batch_event == "collected"
    window = store.read_window(SID)
    assert [i.start_seq for i in window.items[-2:]] == [before, before + 1]
    assert window.items[-1].message.to_json()["content"] == "go on"


@pytest.mark.parametrize("ending", ["expired", "cancelled", "failed", "errored"])
def test_a_batch_that_ends_without_a_summary_falls_back_to_an_immediate_call(
        ending: str, store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    if ending == "errored":
        summarizer.api.state["batch-1"] = "ended"
        summarizer.api.errors["batch-1"] = TransientSummarizerError("overloaded_error")
    else:
        summarizer.api.state["batch-1"] = ending
    landed = collect(store, summarizer, offer, sent)
    assert landed.batch_event == "fallen-back" and landed.outcome == "folded"
    assert summarizer.live_calls == 1 and "batch:" in landed.detail
    record = store.records(SID)[-1]
    assert record.job_id == "job-1" and record.summarizer_usage.batch_calls == 0
    assert store.get_session(SID).batch is None


def test_a_fold_stops_waiting_once_its_session_outgrew_its_trigger(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    report(store, SID, 9_000)  # the session woke and grew past its trigger (8,500)
    landed = collect(store, summarizer, offer, sent)
    assert landed.batch_event == "fallen-back" and "past its trigger" in landed.detail
    assert summarizer.api.cancelled == ["batch-1"] and summarizer.live_calls == 1


def test_a_fold_stops_waiting_at_its_deadline(summarizer: Batchable, tmp_path: Path) -> None:
    clock = Clock()
    store = SessionStore.from_url(f"sqlite:///{tmp_path / 'clocked.db'}", clock=clock)
    store.migrate()
    try:
        idle_session(store)
        offer = BatchOffer(summarizer, delay_s=600, max_wait_s=3600)
        sent = submit(store, summarizer, offer)
        clock.advance(3599)
        assert collect(store, summarizer, offer, sent).outcome == "batch-pending"
        clock.advance(1)
        landed = collect(store, summarizer, offer, sent)
        assert landed.batch_event == "fallen-back" and "deadline" in landed.detail
        assert summarizer.api.cancelled == ["batch-1"] and summarizer.live_calls == 1
    finally:
        store.close()


def test_a_deleted_session_never_receives_the_commit_and_its_batch_is_cancelled(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    store.delete_session(SID)
    summarizer.api.state["batch-1"] = "ended"
    gone = collect(store, summarizer, offer, sent)
    assert gone.batch_event == "dropped" and "deleted" in gone.detail
    assert summarizer.api.cancelled == ["batch-1"]
    # Created again under the id: another session, which the old batch never reaches.
    idle_session(store)
    again = collect(store, summarizer, offer, sent)
    assert again.batch_event == "dropped" and store.spans(SID) == []
    assert store.records(SID) == []


def test_a_forced_inline_fold_takes_the_claim_and_the_batch_is_dropped(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    inline = run_fold(store, ExtractiveSummarizer(), FoldJob(SID, "inline-1", trigger="overflow",
                                                             force=True))
    assert inline.claim == "claimed"
    summarizer.api.state["batch-1"] = "ended"
    late = collect(store, summarizer, offer, sent)
    assert late.batch_event == "dropped" and summarizer.api.cancelled == ["batch-1"]
    assert all(s.job_id != "job-1" for s in store.spans(SID))


def test_the_claims_lease_does_not_pass_a_waiting_fold_to_another_worker(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    submit(store, summarizer, offer)
    # Its own lease was 60 s; held for the batch, the claim outlives it.
    info = store.get_session(SID)
    assert info.batch is not None and info.claim_expires_at == info.batch.deadline
    other = run_fold(store, summarizer, FoldJob(SID, "job-2", trigger="threshold"),
                     pricing=PRICING)
    assert other.outcome == "skipped" and other.claim == "newer-claim"
    assert store.get_session(SID).abandoned_folds == 0 and summarizer.live_calls == 0


def test_a_batch_api_that_refuses_the_request_is_replaced_by_an_immediate_call(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    summarizer.api.refuse = TransientSummarizerError("batch API unavailable", status_code=503)
    landed = run_fold(store, summarizer, FoldJob(SID, "job-1", trigger="idle"),
                      pricing=PRICING, batch=offer)
    assert landed.outcome == "folded" and landed.batch_event == "fallen-back"
    assert summarizer.live_calls == 1 and store.get_session(SID).batch is None


def test_a_collection_without_the_batch_api_calls_the_summarizer_now(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer) -> None:
    idle_session(store)
    sent = submit(store, summarizer, offer)
    landed = collect(store, summarizer, None, sent)  # batch folds turned off, say
    assert landed.batch_event == "fallen-back" and summarizer.live_calls == 1


# --- the scheduler ------------------------------------------------------------------------------

class RecordingCollect:
    def __init__(self) -> None:
        self.looks: list[tuple[dict[str, Any], str | None]] = []

    def __call__(self, ticket: dict[str, Any], lock_token: str | None) -> str:
        self.looks.append((ticket, lock_token))
        return f"look-{len(self.looks)}"


@pytest.mark.redis
def test_a_second_scheduler_does_not_plan_a_waiting_session_again_and_looks_at_its_batch_once(
        store: SessionStore, summarizer: Batchable, offer: BatchOffer, redis_conn: redis.Redis,
        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(scheduler_block_ms=10, scheduler_policy_cache_s=0,
                             batch_poll_interval_s=60)
    idle_session(store)
    sent = submit(store, summarizer, offer)
    report(store, SID, 9_000)  # past its trigger: a sweep finds it over, and due at once

    def scheduler(name: str, enqueue: RecordingEnqueue, looks: RecordingCollect) -> Scheduler:
        return Scheduler(settings, store, redis_conn, enqueue, consumer_name=name,
                         metrics_=Metrics(CollectorRegistry()), clock=lambda: NOW,
                         collect=looks)

    first_jobs, first_looks = RecordingEnqueue(), RecordingCollect()
    first = scheduler("sched-a", first_jobs, first_looks)
    first.rebalance()
    stats = first.run_once()  # a first batch sweeps the store
    assert stats.swept and first_jobs.jobs == [] and stats.skipped[SID] == "batch-pending"
    (look,) = first_looks.looks
    assert look[0] == BatchTicket.from_json(sent.batch).to_json() and look[1] is not None
    assert stats.collecting == {SID: "look-1"}
    first.leases.leave()
    second_jobs, second_looks = RecordingEnqueue(), RecordingCollect()
    second = scheduler("sched-b", second_jobs, second_looks)
    second.rebalance()
    later = second.run_once()
    assert later.swept
    # No fold planned again; the look already enqueued holds the session's fold lock.
    assert second_jobs.jobs == [] and second_looks.looks == []
    assert later.skipped[SID] == "job-pending"
    keys = second.keys
    pending = PendingBatches(redis_conn, keys)
    assert pending.count(keys.partition_of(SID)) == 1

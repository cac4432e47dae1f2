"""Batch folds end to end through the real ``anthropic`` and ``openai`` SDKs against the stand-in's
batch APIs (Anthropic's Message Batches; OpenAI's Batch API with its Files API), faults included.

A fold that can wait (an idle session) is sent as a batch; the stand-in ends it when the test
moves its clock; the collection lands the fold, and the spend cap counts it at half the list
price. A batch that expires, or whose request meets an overloaded API, falls back to an
immediate call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from pipeline_harness import transcript_session
from sessionfold.cli.standin.fakeprovider import FakeProvider, FakeProviderServer, Fault
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import SummarizerUsage
from sessionfold.runtime.batch_collect import collect_batch
from sessionfold.runtime.batch_folds import BatchOffer, BatchTicket
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport, run_fold
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.prices import fold_pricing, summarizer_cost_usd
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.summarizer_guard import SummarizerGuard
from sessionfold.runtime.wiring import batch_offer, make_summarizer, summarizer_guard
from sessionfold.store import SessionStore

SID = "agent-1"
MODELS = {"anthropic": "claude-haiku-4-5", "openai": "gpt-4.1-mini"}


class Clock:
    """The stand-in's batch clock: batches end when the test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def provider() -> FakeProvider:
    provider = FakeProvider()
    provider.batches.clock = Clock()
    provider.batches.delay_s = 300.0
    return provider


@pytest.fixture
def server(provider: FakeProvider) -> Iterator[FakeProviderServer]:
    with provider.serve() as running:
        yield running


@pytest.fixture(params=["anthropic", "openai"])
def settings(request: pytest.FixtureRequest, make_settings: Callable[..., Settings],
             server: FakeProviderServer) -> Settings:
    kind = str(request.param)
    where = ({"anthropic_api_key": "sk-test", "anthropic_base_url": server.base_url}
             if kind == "anthropic" else
             {"openai_api_key": "sk-test", "openai_base_url": server.base_url + "/v1"})
    return make_settings(summarizer=kind, summarizer_model=MODELS[kind], batch_folds=True,
                         session_spend_cap_usd=5.0, **where)


class Setup:
    def __init__(self, settings: Settings, client: redis.Redis, store: SessionStore) -> None:
        summarizer = make_summarizer(settings)
        offer = batch_offer(settings, summarizer)
        assert offer is not None and offer.provider == settings.summarizer_kind
        self.settings = settings
        self.offer: BatchOffer = offer
        self.guard: SummarizerGuard = summarizer_guard(settings, client, summarizer,
                                                       inline=False)
        self.store = store
        self.pricing = fold_pricing(settings)

    def submit(self) -> FoldReport:
        return run_fold(self.store, self.guard, FoldJob(SID, "job-1", trigger="idle"),
                        pricing=self.pricing, batch=self.offer)

    def collect(self, sent: FoldReport) -> FoldReport:
        assert sent.batch is not None
        return collect_batch(self.store, self.guard, self.offer,
                             BatchTicket.from_json(sent.batch), pricing=self.pricing)


@pytest.fixture
def setup(settings: Settings, redis_conn: redis.Redis, tmp_path: Path) -> Iterator[Setup]:
    conv = transcript_session("django__django-15554", 40)
    with SessionStore.from_url(f"sqlite:///{tmp_path / 'store.db'}") as store:
        store.migrate()
        store.create_session(SID, FoldPolicy(budget_tokens=8000), conv.system)
        store.append(SID, conv.messages)
        # A budget the idle window sits well under (between its idle trigger and its trigger):
        # a fold that can wait, not one the ceiling forces.
        size = store.get_session(SID).current_tokens
        store.set_policy(SID, FoldPolicy(budget_tokens=int(size / 0.6)))
        yield Setup(settings, redis_conn, store)


@pytest.mark.redis
def test_a_fold_goes_through_the_batch_api_and_lands_at_half_the_price(
        setup: Setup, provider: FakeProvider, redis_conn: redis.Redis) -> None:
    sent = setup.submit()
    assert sent.outcome == "batch-pending", sent.detail
    assert provider.batches.created == 1 and provider.stats.calls == 0  # nothing answered yet
    assert setup.collect(sent).outcome == "batch-pending"
    provider.batches.clock.now += 300  # type: ignore[attr-defined]
    landed = setup.collect(sent)
    assert landed.outcome == "folded" and landed.batch_event == "collected", landed.detail
    assert provider.stats.succeeded == 1  # the batched request, answered once
    usage = landed.summarizer_usage
    assert usage.calls == usage.batch_calls == 1 and usage.input_tokens > 0
    (span,) = setup.store.spans(SID)
    assert span.model == setup.settings.summarizer_model and span.job_id == "job-1"
    assert setup.store.get_session(SID).batch is None
    table = setup.settings.price_table()
    spent = float(redis_conn.get(Keys.from_settings(setup.settings).summarizer_spend(
        SID, setup.store.get_session(SID).incarnation)) or 0)
    listed = summarizer_cost_usd(SummarizerUsage(
        model=usage.model, calls=1, input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens), table)
    assert spent == pytest.approx(summarizer_cost_usd(usage, table)) == pytest.approx(
        listed / 2)


@pytest.mark.redis
def test_an_expired_batch_falls_back_to_an_immediate_call(setup: Setup,
                                                          provider: FakeProvider) -> None:
    provider.batches.script("expired")
    sent = setup.submit()
    provider.batches.clock.now += 300  # type: ignore[attr-defined]
    landed = setup.collect(sent)
    assert landed.batch_event == "fallen-back" and landed.outcome == "folded"
    assert "expired" in landed.detail
    assert provider.stats.succeeded == 1 and landed.summarizer_usage.batch_calls == 0


@pytest.mark.redis
def test_an_overloaded_batch_request_falls_back_to_an_immediate_call(
        setup: Setup, provider: FakeProvider) -> None:
    sent = setup.submit()
    provider.script(Fault.overloaded())  # met by the batched request when the batch runs
    provider.batches.clock.now += 300  # type: ignore[attr-defined]
    landed = setup.collect(sent)
    assert landed.batch_event == "fallen-back" and landed.outcome == "folded"
    assert provider.stats.by_status[529] == 1 and provider.stats.succeeded == 1


@pytest.mark.redis
def test_a_batch_cancelled_by_the_collection_is_not_answered(setup: Setup,
                                                             provider: FakeProvider) -> None:
    sent = setup.submit()
    mark = setup.store.get_session(SID).batch
    assert mark is not None
    setup.store.delete_session(SID)
    dropped = setup.collect(sent)
    assert dropped.batch_event == "dropped" and provider.batches.cancels == 1
    provider.batches.clock.now += 300  # type: ignore[attr-defined]
    polled = setup.offer.api.poll(mark.batch_id, mark.custom_id)
    assert polled.state == "cancelled" and polled.answer is None
    assert provider.stats.calls == 0  # the cancelled batch never ran its request

"""The shared fold procedure against a real store (SQLite and PostgreSQL): claim, fold, commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded  # type: ignore[import-untyped]
from pipeline_harness import postgres_url, transcript_session, wait_until
from sessionfold.core.errors import PermanentSummarizerError, TransientSummarizerError
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import ExtractiveSummarizer, Summary
from sessionfold.core.window import CompactionRecord
from sessionfold.runtime.faults import PAUSE_AT_ENV, PAUSE_MARKER_ENV
from sessionfold.runtime.fold_procedure import FoldJob, run_fold, store_job_id
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers.locks import FoldLock
from sessionfold.workers.tasks import _fold, _retry_or_give_up

SID = "agent-fold"
POLICY = FoldPolicy(budget_tokens=8000)


class ScriptedSummarizer:
    """The extractive summarizer, counting calls; can fail or run a callback on its first call."""

    model = "scripted-extractive"
    context_tokens = 1_000_000

    def __init__(self, errors: Sequence[Exception] = (),
                 on_first_call: Callable[[], None] | None = None) -> None:
        self.inner = ExtractiveSummarizer()
        self.calls = 0
        self.errors = list(errors)
        self.on_first_call = on_first_call

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        self.calls += 1
        if self.on_first_call is not None:
            callback, self.on_first_call = self.on_first_call, None
            callback()  # runs while this fold is planned and unpaid-for: no transaction is open
        if self.errors:
            raise self.errors.pop(0)
        return self.inner.summarize(messages, previous_summary=previous_summary,
                                    must_keep=must_keep)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        with SessionStore.from_url(url) as s:
            s.migrate()
    else:
        url = postgres_url(request)
    with SessionStore.from_url(url) as s:
        yield s


@pytest.fixture
def session(store: SessionStore) -> list[Message]:
    """An agent session well over its trigger: 40 messages of a real transcript."""
    conv = transcript_session("django__django-15554", 40)
    store.create_session(SID, POLICY, conv.system)
    store.append(SID, conv.messages)
    assert store.get_session(SID).over_trigger
    return conv.messages


def _summaries(store: SessionStore) -> int:
    return sum(1 for item in store.read_window(SID).items if item.kind == "summary")


def test_fold_commits_a_summary_and_leaves_the_ledger_whole(
        store: SessionStore, session: list[Message]) -> None:
    summarizer = ScriptedSummarizer()
    report = run_fold(store, summarizer, FoldJob(SID, "job-1"))
    assert report.outcome == "folded" and report.claim == "claimed"
    assert report.spans >= 1 and report.summarizer_calls == summarizer.calls >= 1
    assert report.tokens_after is not None and report.tokens_before is not None
    assert report.tokens_after < report.tokens_before
    assert _summaries(store) == 1
    assert [e.message for e in store.read_ledger(SID)] == session
    spans = store.spans(SID)
    assert [s.job_id for s in spans] == ["job-1"] * len(spans)
    assert store.recover(SID, spans[0].start_seq, spans[0].end_seq) == \
        session[spans[0].start_seq:spans[0].end_seq + 1]
    info = store.get_session(SID)
    assert info.claimed_by is None and info.last_visit_outcome == "folded"
    assert report.to_json()["session"] == SID and report.to_json()["outcome"] == "folded"


class StoreCalls:
    """A store that notes every method the procedure calls on it."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)
        return call


def test_a_fold_crosses_into_the_store_twice_to_read_with_the_claim_and_to_write(
        store: SessionStore, session: list[Message]) -> None:
    watched = StoreCalls(store)
    report = run_fold(watched, ScriptedSummarizer(), FoldJob(SID, "job-1"))  # type: ignore[arg-type]
    assert report.outcome == "folded"
    assert watched.calls == ["begin_fold", "finish_fold"]
    again = StoreCalls(store)
    assert run_fold(again, ScriptedSummarizer(), FoldJob(SID, "job-2")).outcome in (  # type: ignore[arg-type]
        "nothing-to-fold", "refused", "folded")
    assert again.calls == ["begin_fold", "finish_fold"]  # a visit that folds nothing too


class BrokenTextSummarizer(ScriptedSummarizer):
    """A model whose reply carries a lone surrogate (legal in a JSON escape, not in UTF-8)."""

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        summary = super().summarize(messages, previous_summary=previous_summary,
                                    must_keep=must_keep)
        return Summary(text="half a pair \ud83d here. " + summary.text, usage=summary.usage)


def test_a_summary_with_a_lone_surrogate_still_commits_on_every_backend(
        store: SessionStore, session: list[Message]) -> None:
    report = run_fold(store, BrokenTextSummarizer(), FoldJob(SID, "job-1"))
    assert report.outcome == "folded"
    (summary,) = [i for i in store.read_window(SID).items if i.kind == "summary"]
    assert "half a pair \ufffd here." in summary.message.text()


def test_a_redelivered_job_stops_at_its_claim_without_paying(
        store: SessionStore, session: list[Message]) -> None:
    summarizer = ScriptedSummarizer()
    first = run_fold(store, summarizer, FoldJob(SID, "job-1"))
    paid = summarizer.calls
    again = run_fold(store, summarizer, FoldJob(SID, "job-1"))
    assert first.outcome == "folded"
    assert (again.outcome, again.claim) == ("skipped", "already-committed")
    assert summarizer.calls == paid
    assert len(store.spans(SID)) == first.spans


def test_a_duplicate_delivery_finds_the_live_claim_of_its_twin(
        store: SessionStore, session: list[Message]) -> None:
    twin = store.claim(SID, "job-1", lease_s=60)  # the twin delivery is running
    assert twin.claimed
    summarizer = ScriptedSummarizer()
    report = run_fold(store, summarizer, FoldJob(SID, "job-1"))
    assert (report.outcome, report.claim) == ("skipped", "newer-claim")
    assert summarizer.calls == 0 and store.spans(SID) == []


def test_a_job_overtaken_by_a_newer_claim_stops(
        store: SessionStore, session: list[Message]) -> None:
    enqueued = store.get_session(SID).fold_epoch
    run_fold(store, ScriptedSummarizer(), FoldJob(SID, "job-newer"))
    summarizer = ScriptedSummarizer()
    report = run_fold(store, summarizer, FoldJob(SID, "job-older", enqueued_epoch=enqueued))
    assert (report.outcome, report.claim) == ("skipped", "newer-claim")
    assert summarizer.calls == 0


def test_transient_failure_keeps_the_cheap_layers_releases_the_claim_and_can_retry(
        store: SessionStore, session: list[Message]) -> None:
    summarizer = ScriptedSummarizer(errors=[TransientSummarizerError(
        "Anthropic API answered 529: Overloaded", retry_after=3.0, status_code=529)])
    task_id = "task-7"
    report = run_fold(store, summarizer, FoldJob(SID, store_job_id(task_id, 0)))
    assert report.retry_error is not None and report.retry_error.retry_after == 3.0
    assert "summarizer-failed" in report.refusals
    assert _summaries(store) == 0
    record = store.records(SID)[-1]
    assert any(r.reason == "summarizer-failed" for r in record.refusals)
    assert store.get_session(SID).claimed_by is None  # released: the retry can claim
    retry = run_fold(store, summarizer, FoldJob(SID, store_job_id(task_id, 1),
                                                enqueued_epoch=report.epoch))
    assert retry.outcome == "folded" and retry.retry_error is None
    assert _summaries(store) == 1


class _Retry(Exception):
    """What the task double's ``retry`` returns (Celery's Retry, raised by the task)."""

    def __init__(self, **options: Any) -> None:
        super().__init__("retry")
        self.options = options


def test_the_soft_time_limit_records_the_visit_releases_the_claim_and_retries(
        store: SessionStore, session: list[Message], tmp_path: Path) -> None:
    # Celery raises SoftTimeLimitExceeded wherever the fold happens to be: here, in the
    # summarizer call, which therefore never returns. The task hands it to the procedure as
    # its time limit (the procedure itself imports nothing of Celery).
    summarizer = ScriptedSummarizer(errors=[SoftTimeLimitExceeded()])
    worker = SimpleNamespace(store=store, summarizer=summarizer, pricing=None, batch=None)
    report = _fold(worker, FoldJob(SID, "task-9", lease_s=3600))  # type: ignore[arg-type]
    assert summarizer.calls == 1
    assert report.outcome == "refused" and report.refusals == ("summarizer-failed",)
    assert report.retry_error is not None and "soft time limit" in str(report.retry_error)
    record = store.records(SID)[-1]
    assert record.outcome == "refused" and record.job_id == "task-9"
    assert [(r.reason, r.detail) for r in record.refusals] == [("summarizer-failed",
                                                                "soft time limit")]
    # Released at once, not after the hour-long lease: a retry (or anyone) may claim now.
    info = store.get_session(SID)
    assert info.claimed_by is None and info.abandoned_folds == 0
    assert _summaries(store) == 0
    # The task retries it like a transient summarizer error: capped backoff, the claimed epoch.
    settings = Settings(data_dir=tmp_path, max_attempts=3, retry_backoff_base_s=1.0,
                        retry_backoff_cap_s=2.0)
    task = SimpleNamespace(request=SimpleNamespace(retries=0),
                           retry=lambda **options: _Retry(**options))
    runtime = SimpleNamespace(settings=settings, store=store, redis=None)
    with pytest.raises(_Retry) as retried:
        _retry_or_give_up(task, runtime, FoldJob(SID, "task-9"),  # type: ignore[arg-type]
                          report, FoldLock.__new__(FoldLock), None, "attempts-key")
    options = retried.value.options
    assert 0 < options["countdown"] <= settings.retry_backoff_cap_s
    assert options["kwargs"]["enqueued_epoch"] == report.epoch
    assert report.incarnation is not None
    assert options["kwargs"]["incarnation"] == report.incarnation
    retry = run_fold(store, ScriptedSummarizer(), FoldJob(
        SID, store_job_id("task-9", 1), enqueued_epoch=options["kwargs"]["enqueued_epoch"],
        incarnation=options["kwargs"]["incarnation"]))
    assert retry.outcome == "folded" and _summaries(store) == 1


class _Deadline(Exception):
    """A runner's own time limit, raised into the fold wherever it happens to be."""


def test_the_time_limit_is_the_runners_own_exception_and_only_it_is_caught(
        store: SessionStore, session: list[Message]) -> None:
    # Without it the exception is not the procedure's to swallow: it leaves run_fold.
    with pytest.raises(_Deadline):
        run_fold(store, ScriptedSummarizer(errors=[_Deadline()]), FoldJob(SID, "job-1"))
    # The claim that exception left behind is taken over by force (as an inline fold does).
    report = run_fold(store, ScriptedSummarizer(errors=[_Deadline()]),
                      FoldJob(SID, "job-2", force=True), out_of_time=(_Deadline,))
    assert report.outcome == "refused" and report.refusals == ("summarizer-failed",)
    assert report.retry_error is not None and "soft time limit" in str(report.retry_error)


def test_permanent_failure_is_a_recorded_refusal_not_a_retry(
        store: SessionStore, session: list[Message]) -> None:
    summarizer = ScriptedSummarizer(errors=[PermanentSummarizerError(
        "Anthropic API answered 400: bad request", status_code=400)] * 5)
    report = run_fold(store, summarizer, FoldJob(SID, "job-1"))
    assert report.retry_error is None
    assert "summarizer-failed" in report.refusals
    assert _summaries(store) == 0
    assert any(r.reason == "summarizer-failed" for r in store.records(SID)[-1].refusals)


def test_inline_claim_wins_over_a_background_fold_in_flight(
        store: SessionStore, session: list[Message]) -> None:
    inline_reports = []

    def inline_fold() -> None:
        # The agent overflows while the background summarizer is still writing.
        inline_reports.append(run_fold(store, ScriptedSummarizer(), FoldJob(
            SID, "inline-1", trigger="overflow", force=True,
            target_tokens=POLICY.budget_tokens // 2, replan=True)))

    background = run_fold(store, ScriptedSummarizer(on_first_call=inline_fold),
                          FoldJob(SID, "job-bg"))
    assert inline_reports[0].outcome == "folded"
    assert background.outcome == "stale" and background.spans == 0
    assert _summaries(store) == 1  # never two summaries
    assert {s.job_id for s in store.spans(SID)} == {"inline-1"}
    assert [e.message for e in store.read_ledger(SID)] == session  # no turn lost
    assert any(r.outcome == "stale" and r.job_id == "job-bg" for r in store.records(SID))


def test_a_fold_of_a_session_deleted_and_created_again_meanwhile_lands_nowhere(
        store: SessionStore, session: list[Message]) -> None:
    renewed = transcript_session("django__django-16560", 40)

    def renew() -> None:
        # While the old job's summary is being written: the session is deleted, created again
        # under the same id with other messages, and another job visits it (folding nothing).
        store.delete_session(SID)
        store.create_session(SID, POLICY, renewed.system)
        store.append(SID, renewed.messages)
        claim = store.claim(SID, "job-new")
        store.record_visit(SID, CompactionRecord(
            trigger="threshold", outcome="nothing-to-fold", budget_tokens=POLICY.budget_tokens,
            target_tokens=POLICY.target_tokens, measured_tokens=1, tokens_after=1),
            job_id="job-new", epoch=claim.epoch, incarnation=claim.incarnation)

    report = run_fold(store, ScriptedSummarizer(on_first_call=renew), FoldJob(SID, "job-old"))
    assert report.outcome == "stale" and "deleted" in report.detail, report
    assert report.summarizer_calls >= 1  # paid for, and reported: it was spent
    assert store.spans(SID) == [] and _summaries(store) == 0
    assert [e.message for e in store.read_ledger(SID)] == renewed.messages
    (stale,) = [r for r in store.records(SID) if r.job_id == "job-old"]
    assert stale.outcome == "stale" and "earlier session" in stale.detail
    assert store.get_session(SID).claimed_by is None


def test_inline_fold_that_loses_a_race_stops_when_the_winner_did_the_work(
        store: SessionStore, session: list[Message]) -> None:
    winner = []

    def other_inline() -> None:
        winner.append(run_fold(store, ScriptedSummarizer(), FoldJob(
            SID, "inline-b", trigger="overflow", force=True)))

    loser = ScriptedSummarizer(on_first_call=other_inline)
    target = POLICY.trigger_tokens
    report = run_fold(store, loser, FoldJob(SID, "inline-a", trigger="overflow", force=True,
                                            target_tokens=target, replan=True))
    assert winner[0].outcome == "folded"
    assert store.get_session(SID).current_tokens <= target
    assert report.outcome == "stale" and report.replans == 0, report
    assert "concurrent fold won" in report.detail
    assert _summaries(store) == 1
    assert loser.calls == 1  # paid once, not twice


def test_inline_fold_that_loses_a_race_replans_once_when_still_over_target(
        store: SessionStore, session: list[Message]) -> None:
    before = store.get_session(SID).current_tokens

    def small_fold() -> None:
        # Another fold that only masks a little: the session stays over the loser's target.
        run_fold(store, None, FoldJob(SID, "inline-b", trigger="overflow", force=True,
                                      target_tokens=before - 500))

    loser = ScriptedSummarizer(on_first_call=small_fold)
    report = run_fold(store, loser, FoldJob(SID, "inline-a", trigger="overflow", force=True,
                                            replan=True))
    assert report.replans == 1 and report.outcome == "folded"
    assert report.job_id == "inline-a~replan"
    assert _summaries(store) == 1
    assert [e.message for e in store.read_ledger(SID)] == session


def test_background_visit_of_a_paused_session_folds_nothing(
        store: SessionStore, session: list[Message]) -> None:
    store.set_paused(SID, True)
    summarizer = ScriptedSummarizer()
    report = run_fold(store, summarizer, FoldJob(SID, "job-1"))
    assert report.outcome == "nothing-to-fold" and "paused" in report.detail
    assert summarizer.calls == 0 and store.get_session(SID).claimed_by is None
    # The inline fallback still folds a paused session: the agent's call must go through.
    forced = run_fold(store, summarizer, FoldJob(SID, "inline-1", trigger="overflow",
                                                 force=True))
    assert forced.outcome == "folded"


def test_store_job_ids_differ_per_retry_and_not_per_redelivery() -> None:
    assert store_job_id("t", 0) == "t"
    assert store_job_id("t", 1) != store_job_id("t", 2) != "t"


def test_fault_point_marks_once_and_waits_until_killed(tmp_path: Path) -> None:
    marker = tmp_path / "paused.pid"
    code = ("from sessionfold.runtime.faults import fault_point\n"
            "fault_point('elsewhere')\nfault_point('after-summary')\n")
    env = {**os.environ, PAUSE_AT_ENV: "after-summary", PAUSE_MARKER_ENV: str(marker)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        wait_until(marker.exists, timeout_s=60, what="the fault point's marker")
        assert proc.poll() is None  # waiting, not finished
        assert marker.read_text().strip() == str(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The marker exists now: the next process passes the point (a redelivery runs to its end).
    again = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert again.returncode == 0


# --- a priced visit: the session's age and its folds' lag ------------------------------------

def _priced(store: SessionStore, sid: str, calls: int, policy: FoldPolicy) -> Any:
    """A session of ``calls`` tool steps (each an 8-line read), visited as the scheduler's job
    would visit it, priced with the default tables."""
    from sessionfold.core.fold_cost import FoldPricing
    from sessionfold.core.prices import DEFAULT_PRICES

    store.create_session(sid, policy)
    store.append(sid, [{"role": "user", "content": "Fix the rounding in src/billing.py."}])
    for n in range(calls):
        out = "\n".join(f"src/mod_{n}.py:{i}: total += line_{i}" for i in range(40))
        store.append(sid, [
            {"role": "assistant", "content": [
                {"type": "text", "text": f"THOUGHT: step {n}"},
                {"type": "tool_use", "id": f"{sid}-t{n}", "name": "bash",
                 "input": {"cmd": f"cat src/mod_{n}.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"{sid}-t{n}", "content": out}]}])
    pricing = FoldPricing(agent=DEFAULT_PRICES["claude-sonnet-4-5"],
                          summarizer=DEFAULT_PRICES["claude-haiku-4-5"])
    return run_fold(store, ScriptedSummarizer(), FoldJob(sid, f"job-{sid}"), pricing=pricing)


def test_a_priced_fold_of_a_session_told_it_is_about_to_end_is_refused(
        store: SessionStore) -> None:
    open_ended = FoldPolicy(budget_tokens=64_000, trigger_ratio=0.3, target_ratio=0.05)
    # The same window: a session that says nothing of its length is priced over about its
    # age from now on, and the fold pays; one that says it makes one more call is left alone.
    assert _priced(store, "long", 30, open_ended).outcome == "folded"
    ending = open_ended.model_copy(update={"expected_calls": 31})
    report = _priced(store, "ending", 30, ending)
    assert report.outcome == "refused" and "would-not-pay" in report.refusals
    assert "before the session ends" in report.detail
    assert store.get_session("ending").calls == 30


def test_a_late_background_fold_teaches_the_process_how_late_first_folds_will_land(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from sessionfold.runtime import fold_procedure

    lag = fold_procedure._Lag()
    monkeypatch.setattr(fold_procedure, "FOLD_LAG", lag)
    assert lag.prior() == 1.0  # nothing landed yet: by the next call
    policy = FoldPolicy(budget_tokens=4000, economics="window")
    store.create_session(SID, policy)
    store.append(SID, transcript_session("django__django-15554", 41).messages)

    def the_agent_goes_on() -> None:  # three calls while the summarizer works
        for n in range(3):
            store.append(SID, [
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"late-{n}", "name": "bash",
                     "input": {"cmd": "ls"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"late-{n}", "content": "ok"}]}])

    report = run_fold(store, ScriptedSummarizer(on_first_call=the_agent_goes_on),
                      FoldJob(SID, "job-late"))
    assert report.outcome == "folded"
    assert store.get_session(SID).fold_lag_calls == 3.0
    assert lag.prior() == 3.0  # a session none of whose folds landed yet starts from this
    lag.landed(None)  # an inline fold says nothing of the workers' lag
    assert lag.prior() == 3.0

"""B1's simulated-clock system and its per-session figures: the real client, store, scheduler
rule and fold procedure, folds landing by call count (the next call, or several calls late),
and each session priced against its own no-compaction run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from b1.baseline import NoCompaction  # noqa: E402
from b1.counting import Counter  # noqa: E402
from b1.fakes import FakeSummarizer  # noqa: E402
from b1.per_session import per_session, summary  # noqa: E402
from b1.prices import PRICES  # noqa: E402
from b1.replay import replay  # noqa: E402
from b1.sim_systems import SimSystem  # noqa: E402
from b1.transcripts import Transcript, load_transcripts  # noqa: E402

BUDGET = 6000


def short_session(calls: int = 24) -> Transcript:
    """The first ``calls`` calls of a shipped run, ending on a tool result."""
    (whole,) = load_transcripts(only=["django__django-16560"])
    kept: list[Any] = []
    seen = 0
    for message in whole.messages:
        if message["role"] == "assistant":
            if seen == calls:
                break
            seen += 1
        kept.append(message)
    return Transcript(id="short", system=whole.system, messages=tuple(kept))


def run(lag: int) -> tuple[Any, Any, SimSystem]:
    counter = Counter()
    fake = FakeSummarizer(counter=counter, time_scale=0.0)
    system = SimSystem(fake, lag=lag)
    system.start()
    try:
        run_ = replay(system, [short_session()], BUDGET, time_scale=0.0, counter=counter,
                      summarizer=fake, stress=False)
        assert system.deployment is not None
        reports = list(system.deployment.reports)
    finally:
        system.stop()
    none = replay(NoCompaction(), [short_session()], BUDGET, time_scale=0.0, counter=counter,
                  stress=False)
    return run_, none, reports


@pytest.mark.parametrize("lag", [0, 3])
def test_no_request_goes_over_the_budget_whenever_the_folds_land(lag: int) -> None:
    sim, none, reports = run(lag)
    tokens = [r.tokens for t in sim.transcripts for r in t.requests]
    assert max(tokens) <= BUDGET < max(r.tokens for t in none.transcripts for r in t.requests)
    assert any(r.outcome == "folded" for r in reports)  # the background did fold
    assert all(t.retrievable for t in sim.transcripts)


@pytest.mark.parametrize("wait", [False, True])
def test_a_late_fold_lands_the_calls_later_it_was_told_to(wait: bool) -> None:
    counter = Counter()
    fake = FakeSummarizer(counter=counter, time_scale=0.0)
    system = SimSystem(fake, lag=3)
    system.start()
    deployment = system.deployment
    assert deployment is not None
    landed: list[tuple[int, int]] = []
    consider, land = deployment.consider, deployment._land

    def watch_consider(sid: str) -> None:
        before = set(deployment.jobs)
        consider(sid)
        if sid in deployment.jobs and sid not in before:
            landed.append((deployment.calls.get(sid, 0), -1))

    def watch_land(slot: Any) -> None:
        land(slot)
        if landed and landed[-1][1] == -1:
            landed[-1] = (landed[-1][0], deployment.calls.get(slot.session_id, 0))

    deployment.consider = watch_consider  # type: ignore[method-assign]
    deployment._land = watch_land  # type: ignore[method-assign]
    if not wait:
        # No request waits for the job in flight: every job lands by the clock alone.
        deployment.client.await_window_change = (  # type: ignore[method-assign]
            lambda *args: False)
    try:
        replay(system, [short_session()], BUDGET, time_scale=0.0, counter=counter,
               summarizer=fake, stress=False)
    finally:
        system.stop()
    finished = [(asked, at) for asked, at in landed if at != -1]
    # Asked for after call N, a job lands as the agent starts call N + 1 + lag (3 here): N + 3
    # calls had started when it landed (the last may have landed at the run's end instead),
    # unless a request past the guard's line waited for it (the client's hard cap): then it
    # landed earlier, and the deployment counted the wait.
    assert len(finished) >= 2, landed
    lags = [at - asked for asked, at in finished[:-1]]
    if not wait:
        assert lags == [3] * len(lags) and deployment.waits == 0
    else:
        # A request past the guard's line waited for the job in flight: it landed then.
        early = [lag for lag in lags if lag != 3]
        assert early and all(0 <= lag < 3 for lag in early), lags
        assert len(early) <= deployment.waits, (lags, deployment.waits)


def test_each_session_is_priced_against_its_own_no_compaction_run() -> None:
    sim, none, _ = run(0)
    figures = per_session([none, sim])
    by_system = {f.system: f for f in figures}
    assert by_system["none"].ratio == 1.0
    sf = by_system["sessionfold-sim"]
    assert sf.none_dollars == by_system["none"].dollars
    assert sf.over_budget == 0 and sf.calls == 24
    assert sf.summarizer_dollars > 0  # the folds' calls are the session's own
    table = summary(figures)
    row = next(line for line in table.splitlines() if "| sessionfold-sim |" in line)
    assert f"{sf.ratio:.3f}×" in row
    json.dumps([f.__dict__ for f in figures])  # plain data


def test_a_fold_that_can_wait_goes_through_the_batch_api_and_is_billed_at_its_rate() -> None:
    counter = Counter()
    fake = FakeSummarizer(counter=counter, time_scale=0.0)
    # An idle gap of ~58 minutes after call 16 (b1.idle's day for this transcript): the idle
    # sweep's fold waits for a batch that ends 300 model seconds after it is sent.
    system = SimSystem(fake, batch_delay_s=300.0, overrides={"idle_trigger_ratio": 0.1})
    assert system.name == "sessionfold-sim-batch"
    system.start()
    try:
        run_ = replay(system, [short_session(40)], BUDGET, time_scale=0.0, counter=counter,
                      summarizer=fake, stress=False, idle=True)
        assert system.deployment is not None
        events = dict(system.deployment.batch_events)
        reports = list(system.deployment.reports)
    finally:
        system.stop()
    assert events.get("submitted", 0) >= 1 and events.get("collected", 0) >= 1
    collected = [r for r in reports if r.batch_event == "collected"]
    assert all(r.trigger == "idle" and r.outcome == "folded" for r in collected)
    batched = [c for c in run_.summarizer_calls if c["batch"]]
    assert batched and not any(c["on_agent_thread"] for c in batched)
    tokens = [r.tokens for t in run_.transcripts for r in t.requests]
    assert max(tokens) <= BUDGET
    # The report bills a batch call at half Haiku's price.
    call = batched[0]
    listed = PRICES.summarizer_dollars(call["input_tokens"], call["output_tokens"])
    assert PRICES.calls_dollars([call]) == pytest.approx(listed / 2)

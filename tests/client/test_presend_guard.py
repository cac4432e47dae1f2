"""The pre-send guard: through the real client, against the stand-in model (which keeps the
requests it got), on SQLite and PostgreSQL. Under ``over_budget="shrink"`` a request past the
budget goes out under it, the same bytes when sent again, and the stored window is left as it
was; under ``"cap"`` (the default) the session is folded inline first, once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from pipeline_harness import postgres_url
from prometheus_client import REGISTRY
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.client import (
    AsyncClient,
    Client,
    OverBudget,
    SessionAnthropic,
    SessionHandle,
    connect,
)
from sessionfold.core.errors import BudgetExceededError, InvalidPolicyError
from sessionfold.core.layers import MASK_TAG
from sessionfold.core.messages import parse_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import count_text, default_counter
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent

SID = "agent-guarded"
SYSTEM = "You fix bugs in the billing service."
POLICY = FoldPolicy(budget_tokens=8000, keep_recent_turns=2)  # guard line: 7,600 tokens


@pytest.fixture(params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest,
           make_settings: Callable[..., Settings]) -> Iterator[Client]:
    overrides = {} if request.param == "sqlite" else {"database_url": postgres_url(request)}
    with connect(make_settings(**overrides), migrate=True) as c:
        yield c


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(keep_requests=50)


def ask(provider: FakeProvider) -> Callable[..., Any]:
    def fn(system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return provider(system, messages, tools=tools)
    return fn


def output(n: int, lines: int = 150) -> str:
    return "\n".join(f"line {j} of file {n}: balance={j * n}" for j in range(lines))


def tool_step(n: int, lines: int = 150) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"cmd": f"cat f{n}"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{n}", "content": output(n, lines)}]},
    ]


def grown(client: Client, policy: FoldPolicy = POLICY, steps: int = 8,
          lines: int = 150, over_budget: OverBudget = "shrink") -> SessionHandle:
    """A session about twice its budget (no pipeline runs here: no background fold brings it
    down); its handle shrinks requests on their own unless ``over_budget`` says otherwise."""
    agent = client.session(SID, policy=policy, system=SYSTEM, over_budget=over_budget)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the rounding bug."}]
    for n in range(steps):
        history += tool_step(n, lines)
    agent.append(history)
    return agent


def estimate(request: Mapping[str, Any]) -> int:
    """The guard's own measure of a request as sent: system prompt, messages and tools, by the
    client's counter (a session never measured: its calibration is the identity)."""
    counter = default_counter()
    messages = [parse_message(m, i) for i, m in enumerate(request["messages"])]
    tools = sum(count_text(json.dumps(t, ensure_ascii=False)) for t in request.get("tools", []))
    return counter.system(request.get("system", "")) + counter.messages(messages) + tools


def stored(agent: SessionHandle) -> tuple[int, list[dict[str, Any]]]:
    window = agent.store.read_window(agent.session_id)
    return window.revision, [item.to_json() for item in window.items]


def guard_count(outcome: str) -> float:
    return REGISTRY.get_sample_value("sessionfold_guarded_requests_total",
                                     {"outcome": outcome}) or 0.0


def test_a_request_past_the_budget_is_sent_under_it_and_the_same_bytes_again(
        client: Client, provider: FakeProvider) -> None:
    agent = grown(client)
    assert agent.info().current_tokens > POLICY.budget_tokens
    before = stored(agent)
    counted = guard_count("guarded")

    agent.call(ask(provider))
    agent.call(ask(provider))  # nothing appended between: the same window, sent again

    first, again = provider.requests[-2], provider.requests[-1]
    assert estimate(first) <= POLICY.guard_tokens < POLICY.budget_tokens
    assert json.dumps(first) == json.dumps(again)  # byte-identical: the cached prefix holds
    assert agent.guarded_requests == 2 and agent.guard_over_budget == 0
    assert guard_count("guarded") == counted + 2
    # The stored window is untouched: same revision, same items, and no fold was recorded.
    assert stored(agent) == before
    assert client.store.records(SID) == []


def test_the_guard_masks_the_oldest_outputs_with_stubs_naming_their_ledger_seqs(
        client: Client, provider: FakeProvider) -> None:
    agent = grown(client)
    agent.call(ask(provider))
    sent = provider.requests[-1]["messages"]
    results = [b for m in sent if isinstance(m["content"], list) for b in m["content"]
               if b["type"] == "tool_result"]
    masked = [i for i, b in enumerate(results) if str(b["content"]).startswith(MASK_TAG)]
    assert masked and masked == list(range(len(masked)))  # oldest first, a prefix of them
    assert len(masked) < len(results)  # only as many as it takes
    # The task and the kept turns (keep_recent_turns=2) go out whole.
    assert sent[0] == {"role": "user", "content": "Fix the rounding bug."}
    assert [b["content"] for b in results[-2:]] == [output(6), output(7)]
    # Step n's output is ledger row 2n + 2 (the task is row 0): the stub names it, with the
    # recall hint, as the store's own stubs do.
    for n in masked:
        assert f"ledger #{2 * n + 2} holds it whole" in results[n]["content"]
        assert f'call sessionfold_recall with seq "{2 * n + 2}"' in results[n]["content"]
    # The seq named is the row holding the original, whole.
    (original,) = agent.recover((2, 2))
    assert original.to_json()["content"][0]["content"] == output(0)


def test_a_guarded_request_is_reported_as_the_stored_windows_size(
        client: Client, provider: FakeProvider, redis_conn: Any) -> None:
    agent = grown(client)
    agent.call(ask(provider))
    keys = Keys.from_settings(client.settings)
    entries = redis_conn.xrange(keys.usage_stream_of(SID))
    events = [UsageEvent.from_fields(fields) for _, fields in entries
              if b"usage.v1" in fields]
    assert len(events) == 1
    # The provider counted the smaller request; the report adds back what the guard left out,
    # so the scheduler and the calibration see the window the store holds.
    assert events[0].prompt_tokens > provider.stats.recent_prompt_tokens[-1]
    assert events[0].revision == agent.info().revision


def test_a_paused_session_is_guarded_too(client: Client, provider: FakeProvider) -> None:
    agent = grown(client)
    client.store.set_paused(SID, True)
    agent.call(ask(provider))
    assert estimate(provider.requests[-1]) <= POLICY.guard_tokens
    assert agent.guarded_requests == 1


def test_a_session_that_opted_out_is_sent_as_stored(client: Client,
                                                   provider: FakeProvider) -> None:
    agent = grown(client, FoldPolicy(budget_tokens=8000, keep_recent_turns=2, guard=False))
    agent.call(ask(provider))
    assert provider.requests[-1]["messages"] == agent.window(recall=True).messages
    assert estimate(provider.requests[-1]) > POLICY.budget_tokens
    assert agent.guarded_requests == agent.guard_over_budget == 0


def test_protected_turns_over_the_budget_are_clipped_inside_so_the_request_fits(
        client: Client, provider: FakeProvider) -> None:
    # Five kept turns of ~1.7k tokens each (outputs clipped at a quarter of the budget on
    # append): nothing outside the keep window is left to mask, so the guard clips inside it,
    # oldest first, the newest output last.
    policy = FoldPolicy(budget_tokens=8000, keep_recent_turns=5)
    agent = grown(client, policy, steps=5, lines=200)
    agent.call(ask(provider))
    sent = provider.requests[-1]
    assert estimate(sent) <= policy.guard_tokens
    assert agent.guarded_requests == 1 and agent.guard_over_budget == 0 == agent.cap_folds
    results = [b["content"] for m in sent["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]
    assert "clipped" in str(results[0]) and MASK_TAG not in str(results[0])
    assert agent.store.records(SID) == []  # nothing stored changed: no fold, no record


def long_thoughts(client: Client, policy: FoldPolicy, *, history: int,
                  words: int = 250, over_budget: OverBudget = "shrink") -> SessionHandle:
    """A session whose history is the model's own long thoughts (nothing to mask or clip)."""
    agent = client.session(SID, policy=policy, system=SYSTEM, over_budget=over_budget)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the rounding bug."}]
    for n in range(history):
        step = tool_step(n, lines=3)
        step[0]["content"].insert(0, {"type": "text", "text": "THOUGHT: " + " ".join(
            f"idea{n}_{k}" for k in range(words))})
        messages += step
    agent.append(messages)
    return agent


def test_the_cap_folds_inline_when_nothing_cheap_gets_the_request_under(
        client: Client, provider: FakeProvider) -> None:
    policy = FoldPolicy(budget_tokens=6000, keep_recent_turns=2)
    agent = long_thoughts(client, policy, history=12)
    counted = guard_count("folded-inline")
    agent.call(ask(provider))
    assert estimate(provider.requests[-1]) <= policy.guard_tokens
    assert agent.cap_folds == 1 and agent.inline_folds == 1
    assert guard_count("folded-inline") == counted + 1
    (record,) = [r for r in agent.store.records(SID) if r.trigger == "overflow"]
    assert record.outcome == "folded"


def huge_thought(n: int) -> list[dict[str, Any]]:
    """A tool step whose reply holds a 10k-token thought (text: the guard may clip it on a
    request of its own)."""
    step = tool_step(n, lines=3)
    step[0]["content"].insert(0, {"type": "text", "text": "THOUGHT: " + " ".join(
        f"idea{n}_{k}" for k in range(2500))})
    return step


def huge_thinking(n: int) -> list[dict[str, Any]]:
    """A tool step whose reply opens with 10k tokens of thinking: never cut (its signature
    would fail), so a request holding it cannot be brought under a smaller budget."""
    step = tool_step(n, lines=3)
    step[0]["content"].insert(0, {"type": "thinking", "signature": "sig", "thinking": " ".join(
        f"idea{n}_{k}" for k in range(2500))})
    return step


def test_a_reply_over_the_budget_is_sent_clipped_and_the_ledger_keeps_it_whole(
        client: Client, provider: FakeProvider) -> None:
    policy = FoldPolicy(budget_tokens=6000, keep_recent_turns=2)
    agent = long_thoughts(client, policy, history=2)
    agent.append(huge_thought(7))  # ledger #5 and #6
    agent.call(ask(provider))
    sent = provider.requests[-1]
    assert estimate(sent) <= policy.guard_tokens
    reply = sent["messages"][5]
    assert "ledger #5 holds the whole message" in json.dumps(reply)
    assert agent.ledger()[5].message is not None
    assert len(json.dumps(agent.ledger()[5].message.to_json())) > 20_000


def test_a_message_that_cannot_fit_raises_before_anything_is_sent(
        client: Client, provider: FakeProvider) -> None:
    policy = FoldPolicy(budget_tokens=6000, keep_recent_turns=2)
    agent = long_thoughts(client, policy, history=2)
    agent.append(huge_thinking(7))  # ledger #5 and #6
    with pytest.raises(BudgetExceededError, match=r"message #5 alone") as raised:
        agent.call(ask(provider))
    assert len(provider.requests) == 0  # nothing was sent
    assert raised.value.seq == 5 and raised.value.budget_tokens == 6000


def test_over_budget_send_sends_the_best_shrink_and_counts_it(
        client: Client, provider: FakeProvider, caplog: pytest.LogCaptureFixture) -> None:
    policy = FoldPolicy(budget_tokens=6000, keep_recent_turns=2)
    agent = long_thoughts(client, policy, history=2)
    agent.append(huge_thinking(7) + tool_step(9, lines=300))
    agent.over_budget = "send"
    stored_messages = agent.window(recall=True).messages
    counted = guard_count("over-budget")
    with caplog.at_level(logging.WARNING, logger="sessionfold.client.session"):
        agent.call(ask(provider))
        agent.call(ask(provider))
    sent = provider.requests[-1]
    assert estimate(sent) > policy.guard_tokens  # over: it was asked for
    assert sent["messages"] != stored_messages  # but shrunk as far as the guard may
    assert agent.guard_over_budget == 2 and agent.cap_folds == 0
    assert guard_count("over-budget") == counted + 2
    warned = [r for r in caplog.records if "over its guard limit" in r.getMessage()]
    assert len(warned) == 1  # logged once per handle, with the figures and the choice
    assert "over_budget='send'" in warned[0].getMessage()


def test_the_recall_tool_rides_only_on_requests_that_hold_something_to_recall(
        client: Client, provider: FakeProvider) -> None:
    agent = grown(client, steps=2)
    agent.call(ask(provider))
    assert provider.requests[-1]["tools"] == []  # nothing edited yet: no definition to pay for
    # A clipped output keeps its head and tail in sight: not yet a reason to offer the tool
    # (its definition leads the cached prefix: offering it rewrites the whole request).
    agent.append(tool_step(30, lines=700))
    agent.call(ask(provider))
    assert "clipped" in json.dumps(provider.requests[-1]["messages"])
    assert provider.requests[-1]["tools"] == []
    agent.append(tool_step(8) + tool_step(9) + tool_step(10) + tool_step(11) + tool_step(12))
    agent.call(ask(provider))  # past the line: the guard masks, and the tool comes with it
    assert [t["name"] for t in provider.requests[-1]["tools"]] == ["sessionfold_recall"]


def test_the_recall_tools_definition_is_taken_off_the_usage_report(
        client: Client, provider: FakeProvider, redis_conn: Any) -> None:
    # A folded window under the budget: it holds a summary, so the tool is offered, and the
    # request is not guarded.
    agent = grown(client)
    assert agent.fold_inline(trigger="manual", target_tokens=3000).outcome == "folded"
    agent.call(ask(provider))
    assert provider.requests[-1]["tools"] and agent.guarded_requests == 0
    keys = Keys.from_settings(client.settings)
    (event,) = [UsageEvent.from_fields(fields) for _, fields in
                redis_conn.xrange(keys.usage_stream_of(SID)) if b"usage.v1" in fields]
    tool = count_text(json.dumps(provider.requests[-1]["tools"][0], ensure_ascii=False))
    assert event.prompt_tokens == provider.stats.recent_prompt_tokens[-1] - tool


def test_a_request_under_the_line_is_sent_as_stored(client: Client,
                                                   provider: FakeProvider) -> None:
    agent = grown(client, steps=2)
    agent.call(ask(provider))
    assert provider.requests[-1]["messages"] == agent.window(recall=True).messages
    assert agent.guarded_requests == agent.guard_over_budget == 0


def test_the_sdk_wrapper_sends_the_guarded_window(client: Client,
                                                 provider: FakeProvider) -> None:
    agent = grown(client)
    history = [e.message.to_json() for e in agent.ledger() if e.message is not None]
    llm = SessionAnthropic(provider.anthropic_client(), agent)
    llm.messages.create(model="claude-test", max_tokens=64, messages=history)
    assert estimate(provider.requests[-1]) <= POLICY.guard_tokens
    assert agent.guarded_requests == 1


def test_the_async_handle_sends_the_guarded_window(client: Client,
                                                  provider: FakeProvider) -> None:
    grown(client)

    async def run() -> int:
        handle = await AsyncClient(client).session(SID, over_budget="shrink")

        async def fn(system: str, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> Any:
            return await asyncio.to_thread(provider, system, messages, tools=tools)

        await handle.call(fn)
        return handle.guarded_requests

    assert asyncio.run(run()) == 1
    assert estimate(provider.requests[-1]) <= POLICY.guard_tokens


def test_the_margin_is_validated_like_the_other_fields() -> None:
    assert FoldPolicy(budget_tokens=10_000).guard_tokens == 9_500
    assert FoldPolicy(budget_tokens=10_000, guard_margin_ratio=0).guard_tokens == 10_000
    with pytest.raises(InvalidPolicyError, match="guard_margin_ratio"):
        FoldPolicy(budget_tokens=10_000, guard_margin_ratio=0.9)


# --- over_budget="cap": a request past the line means the background fold is late ----------------

def test_the_default_cap_folds_a_late_window_inline_once_and_sends_it_whole(
        client: Client, provider: FakeProvider) -> None:
    agent = grown(client, over_budget="cap")
    counted = guard_count("folded-inline")
    agent.call(ask(provider))
    agent.call(ask(provider))  # nothing appended between: no second fold, the same bytes
    first, again = provider.requests[-2], provider.requests[-1]
    assert estimate(first) <= POLICY.guard_tokens
    assert json.dumps(first) == json.dumps(again)
    assert agent.cap_folds == 1 == agent.inline_folds and agent.guarded_requests == 0
    assert guard_count("folded-inline") == counted + 1
    (record,) = agent.store.records(SID)
    assert record.trigger == "overflow" and record.outcome == "folded"
    # What went out is the stored (folded) window itself, not a shrink of the request.
    assert first["messages"] == agent.window(recall=True).messages


def test_a_shrink_handle_sends_the_guarded_request_and_folds_nothing(
        client: Client, provider: FakeProvider) -> None:
    agent = grown(client, over_budget="shrink")
    agent.call(ask(provider))
    assert agent.guarded_requests == 1 and agent.cap_folds == 0 == agent.inline_folds
    assert agent.store.records(SID) == []


def test_an_inline_fold_that_changes_nothing_is_not_tried_again_until_a_fold_lands(
        client: Client, provider: FakeProvider) -> None:
    # keep_recent_turns covers the whole history: nothing can fold, only be masked on a
    # request of its own.
    policy = FoldPolicy(budget_tokens=8000, keep_recent_turns=12)
    agent = grown(client, policy, over_budget="cap")
    agent.call(ask(provider))
    agent.call(ask(provider))
    agent.call(ask(provider))
    assert agent.cap_folds == 1  # once, not once a call
    assert [r.outcome for r in agent.store.records(SID)] == ["nothing-to-fold"]
    assert agent.guarded_requests == 3
    assert estimate(provider.requests[-1]) <= policy.guard_tokens
    # A fold lands (a manual one with a policy that lets it, as a worker's would): the next
    # request past the line may fold inline again.
    agent.store.set_policy(SID, POLICY)
    assert agent.fold_inline(trigger="manual").outcome == "folded"
    agent.append([m for n in range(40, 45) for m in tool_step(n)])
    agent.call(ask(provider))
    assert agent.cap_folds == 2
    assert [r.outcome for r in agent.store.records(SID)] == ["nothing-to-fold", "folded",
                                                            "folded"]

"""The call loop on its own: the decisions of one ``call()`` with no model call and no store.

:class:`~sessionfold.client.call_loop.CallLoop` is driven here by hand, as an adapter drives it,
against a session that records what the loop asked of it (:class:`RecordingSession`): the order
of the steps, the overflow retry, the recall rounds and their bound, the state written down and
read back in "another process" (a new loop on a new session object), and the steps refused out
of turn. The last tests run the same resume against the real client and store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from sessionfold.cli.standin.fakeprovider import FakeProvider, ToolUse
from sessionfold.client import (
    CallLoop,
    CallState,
    Client,
    RaiseError,
    ReturnReply,
    SendRequest,
    connect,
)
from sessionfold.client.call_plan import CallPlan, OverBudget, tool_tokens
from sessionfold.client.recall import ToolCall, anthropic_tool
from sessionfold.client.window_view import WindowView
from sessionfold.core.errors import ContextOverflowError, InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import Trigger
from sessionfold.runtime.fold_procedure import FoldReport
from sessionfold.runtime.settings import Settings

#: Recall offered from the first request (the recording session's views hold no edited item).
POLICY = FoldPolicy(budget_tokens=8000, recall_offer="always", recall_max_rounds=2)
TOO_LONG = "prompt is too long: 9100 tokens > 6000 maximum"


class RecordingSession:
    """A :class:`~sessionfold.client.call_loop.CallSession` with no store: each window
    revision is a number, each fold bumps it, and every request of the loop is written down."""

    session_id = "rec"

    def __init__(self, policy: FoldPolicy = POLICY, *, revision: int = 3) -> None:
        self.policy = policy
        self.revision = revision
        self.log: list[tuple[Any, ...]] = []

    def plan_call(self, *, takes_tools: bool, over_budget: OverBudget | None,
                  cache_breakpoints: bool) -> CallPlan:
        recall = takes_tools and self.policy.recall
        tools = [anthropic_tool()] if recall else []
        self.log.append(("plan", takes_tools))
        return CallPlan(recall=recall, tools=tools, policy=self.policy,
                        cache_breakpoints=cache_breakpoints, extra_tokens=tool_tokens(tools),
                        over_budget=over_budget or "cap", current_tokens=7000)

    def request_view(self, plan: CallPlan) -> WindowView:
        self.log.append(("view", self.revision))
        return WindowView(session_id=self.session_id, system="S", revision=self.revision,
                          last_seq=10 + self.revision, items=[], recall=plan.recall,
                          messages=[{"role": "user", "content": f"rev {self.revision}"}],
                          unsent_tokens=40, tool_tokens=plan.extra_tokens)

    def fold_inline(self, *, trigger: Trigger = "overflow", target_tokens: int | None = None,
                    measured_tokens: int | None = None) -> FoldReport:
        self.log.append(("fold", target_tokens, measured_tokens))
        self.revision += 1
        return FoldReport(self.session_id, "inline", trigger, "folded", "claimed",
                          tokens_after=2500)

    def report_reply(self, reply: Any, *, seq: int, revision: int, unsent_tokens: int) -> None:
        self.log.append(("report", reply["id"], seq, revision, unsent_tokens))

    def request_tokens(self, plan: CallPlan, view: WindowView) -> int:
        return 1234

    def answer_round(self, plan: CallPlan, reply: Any, calls: Sequence[ToolCall],
                     sent_tokens: int | None) -> None:
        self.log.append(("answer", reply["id"], [c.id for c in calls], sent_tokens))
        self.revision += 1  # the exchange is appended


def reply(rid: str, *tools: str) -> dict[str, Any]:
    """A model reply: text, or calls of the named tools."""
    content: list[dict[str, Any]] = [{"type": "text", "text": "ok"}]
    content += [{"type": "tool_use", "id": f"{rid}-{n}", "name": name, "input": {"query": "x"}}
                for n, name in enumerate(tools)]
    return {"id": rid, "content": content}


def recall_only(rid: str) -> dict[str, Any]:
    return reply(rid, "sessionfold_recall")


def drive(loop: CallLoop, model: Callable[[SendRequest], Any]) -> Any:
    """The sync adapter's steps, as :meth:`SessionHandle.call` takes them."""
    step = loop.start()
    while True:
        try:
            answer = model(step)
        except Exception as exc:
            step = loop.retry(exc)
            continue
        done = loop.replied(answer)
        if isinstance(done, ReturnReply):
            return done.reply
        step = done


def scripted(*outcomes: Any) -> tuple[Callable[[SendRequest], Any], list[SendRequest]]:
    """A model that answers each request with the next outcome (an exception is raised)."""
    sent: list[SendRequest] = []
    queue: Iterator[Any] = iter(outcomes)

    def model(step: SendRequest) -> Any:
        sent.append(step)
        outcome = next(queue)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return model, sent


# --- one call's decisions ------------------------------------------------------------------------

def test_a_plain_reply_is_reported_for_the_view_it_was_built_from_and_returned() -> None:
    session = RecordingSession()
    model, sent = scripted(reply("r1"))
    loop = CallLoop.open(session)
    assert drive(loop, model) == reply("r1")
    tools = sent[0].tools()
    assert [t["name"] for t in tools] == ["sessionfold_recall"]
    # What the guard left out is added back, the recall tool's estimate taken off.
    assert session.log == [("plan", True), ("view", 3),
                           ("report", "r1", 13, 3, 40 - tool_tokens(tools))]
    assert loop.state.phase == "done"


def test_an_overflow_folds_inline_to_half_the_smaller_limit_and_sends_once_more() -> None:
    session = RecordingSession()
    model, sent = scripted(RuntimeError(TOO_LONG), reply("r1"))
    assert drive(CallLoop.open(session), model) == reply("r1")
    # The error names a 6,000-token model, below the 8,000 budget: fold to half of that.
    assert ("fold", 3000, 9100) in session.log
    assert [s.view.revision for s in sent] == [3, 4]  # the retry is built from the folded window
    assert session.log[-1] == ("report", "r1", 14, 4, 40 - sent[1].view.tool_tokens)


def test_a_second_overflow_of_one_request_raises_chained_to_the_providers_error() -> None:
    session = RecordingSession()
    second = RuntimeError(TOO_LONG)
    model, sent = scripted(RuntimeError(TOO_LONG), second)
    with pytest.raises(ContextOverflowError, match="folded, 2500 tokens after") as raised:
        drive(CallLoop.open(session), model)
    assert raised.value.__cause__ is second
    assert len(sent) == 2 and sum(1 for e in session.log if e[0] == "fold") == 1


def test_an_error_that_is_not_an_overflow_is_raised_as_it_is_and_nothing_is_reported() -> None:
    session = RecordingSession()
    failure = ConnectionError("reset by peer")
    model, _ = scripted(failure)
    loop = CallLoop.open(session)
    with pytest.raises(ConnectionError) as raised:
        drive(loop, model)
    assert raised.value is failure and raised.value.__cause__ is None
    assert [e[0] for e in session.log] == ["plan", "view"]
    assert loop.state.phase == "done"


def test_recall_only_replies_are_answered_until_the_rounds_run_out() -> None:
    session = RecordingSession()  # recall_max_rounds=2
    model, sent = scripted(recall_only("r1"), recall_only("r2"), recall_only("r3"))
    assert drive(CallLoop.open(session), model) == recall_only("r3")  # the last goes back as is
    answered = [e for e in session.log if e[0] == "answer"]
    assert answered == [("answer", "r1", ["r1-0"], 1234), ("answer", "r2", ["r2-0"], 1234)]
    assert [s.view.revision for s in sent] == [3, 4, 5]  # each round reads the window again
    assert [e[1] for e in session.log if e[0] == "report"] == ["r1", "r2", "r3"]


def test_each_round_has_its_own_overflow_retry() -> None:
    session = RecordingSession()
    model, _ = scripted(RuntimeError(TOO_LONG), recall_only("r1"), RuntimeError(TOO_LONG),
                        reply("r2"))
    assert drive(CallLoop.open(session), model) == reply("r2")
    assert sum(1 for e in session.log if e[0] == "fold") == 2


def test_a_reply_mixing_recall_with_the_agents_tools_goes_back_to_the_agent() -> None:
    session = RecordingSession()
    model, sent = scripted(reply("r1", "sessionfold_recall", "bash"))
    assert drive(CallLoop.open(session), model)["id"] == "r1"
    assert len(sent) == 1 and not any(e[0] == "answer" for e in session.log)


def test_a_call_that_takes_no_tools_is_offered_none_and_answers_no_recall() -> None:
    session = RecordingSession()
    model, sent = scripted(recall_only("r1"))
    assert drive(CallLoop.open(session, takes_tools=False), model) == recall_only("r1")
    assert sent[0].tools() == [] and not sent[0].view.recall
    assert session.log[0] == ("plan", False)


def test_recall_waits_for_an_edited_item_under_the_default_offer() -> None:
    session = RecordingSession(FoldPolicy(budget_tokens=8000))  # recall_offer="edited"
    loop = CallLoop.open(session)
    step = loop.start()
    # Nothing edited in the view: no tool, no hints, and a loop that answers no round.
    assert step.tools() == [] and not step.view.recall and step.view.unsent_tokens == 40
    assert loop.state.tools == () and loop.relays_at_once
    assert loop.replied(recall_only("r1")) == ReturnReply(recall_only("r1"))


def test_over_budget_fold_folds_before_the_first_request_when_past_the_budget() -> None:
    session = RecordingSession(FoldPolicy(budget_tokens=6000))
    CallLoop.open(session, over_budget="fold").start()
    assert session.log[:3] == [("plan", True), ("fold", None, 7000), ("view", 4)]


def test_a_relayed_reply_is_the_calls_whatever_it_holds() -> None:
    session = RecordingSession()
    loop = CallLoop.open(session)
    loop.start()
    assert not loop.relays_at_once
    assert loop.settled_by("bash") and not loop.settled_by("sessionfold_recall")
    assert not loop.settled_by(None)
    done = loop.replied(recall_only("r1"), relayed=True)
    assert done == ReturnReply(recall_only("r1"))
    assert not any(e[0] == "answer" for e in session.log)


def test_steps_out_of_turn_are_refused() -> None:
    loop = CallLoop.open(RecordingSession())
    with pytest.raises(InvalidInputError, match="'new', not 'sending'"):
        loop.replied(reply("r0"))
    loop.start()
    with pytest.raises(InvalidInputError, match="'sending', not 'new'"):
        loop.start()
    loop.replied(reply("r1"))
    with pytest.raises(InvalidInputError, match="'done', not 'sending'"):
        loop.failed(RuntimeError(TOO_LONG))


# --- the state as a value ------------------------------------------------------------------------

def test_a_loop_resumed_from_its_written_state_answers_as_the_first_would_have() -> None:
    first = RecordingSession()
    loop = CallLoop.open(first)
    loop.start()
    assert loop.replied(recall_only("r1")) != ReturnReply(recall_only("r1"))
    written = json.dumps(loop.state.to_json())  # the request goes out; the loop is forgotten

    # Another process: a new session object on the same window, and the state read back.
    elsewhere = RecordingSession(revision=first.revision)
    state = CallState.from_json(json.loads(written))
    assert (state.phase, state.rounds, state.tools) == ("sending", 1, ("sessionfold_recall",))
    assert (state.revision, state.last_seq, state.sent_tokens) == (4, 14, 1234)
    resumed = CallLoop.resume(elsewhere, state)
    step = resumed.replied(recall_only("r2"))  # round 2 of 2: answered
    assert isinstance(step, SendRequest) and resumed.state.rounds == 2
    assert elsewhere.log[1:3] == [("report", "r2", 14, 4, 40 - state.tool_tokens),
                                  ("answer", "r2", ["r2-0"], 1234)]
    # The round count travelled: a third recall-only reply is the call's.
    again = CallLoop.resume(RecordingSession(revision=5),
                            CallState.from_json(resumed.state.to_json()))
    assert again.replied(recall_only("r3")) == ReturnReply(recall_only("r3"))


def test_a_resumed_loop_keeps_the_overflow_retry_it_used() -> None:
    loop = CallLoop.open(RecordingSession())
    loop.start()
    loop.failed(RuntimeError(TOO_LONG))
    state = CallState.from_json(loop.state.to_json())
    assert state.retried
    resumed = CallLoop.resume(RecordingSession(revision=4), state)
    step = resumed.failed(RuntimeError(TOO_LONG))
    assert isinstance(step, RaiseError) and isinstance(step.error, ContextOverflowError)


def test_a_resumed_loop_offers_no_more_tools_than_the_call_began_with() -> None:
    session = RecordingSession(FoldPolicy(budget_tokens=8000))  # the tool waited: none offered
    loop = CallLoop.open(session)
    loop.start()
    resumed = CallLoop.resume(RecordingSession(), CallState.from_json(loop.state.to_json()))
    assert not resumed.plan.recall and resumed.plan.tools == []
    assert resumed.replied(recall_only("r1")) == ReturnReply(recall_only("r1"))


@pytest.mark.parametrize(("raw", "says"), [
    ([], "an object"),
    ({"version": 2}, "version 2"),
    ({"version": 1, "rounds": "1"}, "'rounds' must be a whole number"),
    ({"version": 1, "rounds": -1}, "'rounds' must be 0 or more"),
    ({"version": 1, "retried": 1}, "'retried' must be true or false"),
    ({"version": 1, "phase": "sent"}, "'phase' must be one of"),
    ({"version": 1, "over_budget": "wait"}, "'over_budget' must be null or one of"),
    ({"version": 1, "tools": "sessionfold_recall"}, "'tools' must be a list"),
    ({"version": 1, "round": 1}, "unknown call state field"),
])
def test_a_malformed_state_is_refused_saying_what_is_wrong(raw: Any, says: str) -> None:
    with pytest.raises(InvalidInputError, match=says):
        CallState.from_json(raw)


def test_only_a_loop_with_a_request_out_can_be_resumed() -> None:
    with pytest.raises(InvalidInputError, match="request out"):
        CallLoop.resume(RecordingSession(), CallState())


# --- the same, against the real client and store ---------------------------------------------

@pytest.fixture
def client(make_settings: Callable[..., Settings], database_url: str) -> Iterator[Client]:
    with connect(make_settings(database_url=database_url), migrate=True) as c:
        yield c


def test_a_recall_round_continues_on_another_handle_from_the_written_state(
        client: Client) -> None:
    # As the HTTP API will: one request returns the guarded request, a later one (another
    # handle, maybe another process) takes the model's reply and answers the recall round.
    policy = FoldPolicy(budget_tokens=20_000, recall_offer="always")
    agent = client.session("resumed", policy=policy, system="You reconcile accounts.")
    agent.append([{"role": "user", "content": "Which account is in the config dump?"}])
    provider = FakeProvider(keep_requests=5)
    provider.script_reply(ToolUse("sessionfold_recall", {"seq": "0"}), "It is in row 0.")

    loop = agent.open_call()
    step = loop.start()
    written = json.dumps(loop.state.to_json())
    first = provider(step.view.system, step.view.messages, tools=step.tools())

    other = client.session("resumed")
    resumed = CallLoop.resume(other, CallState.from_json(json.loads(written)))
    step2 = resumed.replied(first)
    assert isinstance(step2, SendRequest)
    assert other.recall_rounds == 1 and other.calls == 1
    # The exchange was appended: the next request ends with the recall answer.
    assert step2.view.revision > step.view.revision
    assert step2.view.messages[-1]["content"][0]["type"] == "tool_result"
    assert "Which account" in json.dumps(step2.view.messages[-1])  # ledger #0, recalled
    final = provider(step2.view.system, step2.view.messages, tools=step2.tools())
    assert resumed.replied(final) == ReturnReply(final)
    assert [e.origin for e in agent.ledger()][-2:] == ["recall", "recall"]

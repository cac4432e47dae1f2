"""The client's call loop, written once and without the model call's I/O (the h11 habit).

One ``call()`` is a short exchange with the model: send the guarded request; when the provider
says "prompt is too long", fold inline and send again, once; when a reply asks only for recall,
answer it from the ledger and send again, at most ``recall_max_rounds`` times; return the first
reply that is not a recall-only one. :class:`CallLoop` says what to do next and is told what
happened. It never calls the model; its adapters do, each in a few lines:

- :meth:`SessionHandle.call <sessionfold.client.session.SessionHandle.call>` (a blocking
  ``fn``);
- :meth:`AsyncSessionHandle.call <sessionfold.client.aio.AsyncSessionHandle.call>` (an awaited
  ``fn``; the loop's steps read and write the store, so they run in a thread);
- the SDK wrappers' streams (:mod:`.stream_rounds`), which read a reply's events until it is
  known not to be a recall-only one.

::

    loop = handle.open_call(takes_tools=True)
    step = loop.start()                     # SendRequest: the request as the guard sends it
    while True:
        try:
            reply = model(step.view.system, step.view.messages, step.tools())
        except Exception as exc:
            step = loop.retry(exc)          # SendRequest again, or the error raised
            continue
        done = loop.replied(reply)          # SendRequest (a recall round), or ReturnReply
        if isinstance(done, ReturnReply):
            return done.reply
        step = done

The store and bus work a step needs (reading and guarding the window, inline folds, the usage
report, answering recall and appending the exchange) is the session's (:class:`CallSession`,
which :class:`~sessionfold.client.session.SessionHandle` is); which of it happens, and in what
order, is decided here only.

**The state is a value.** :attr:`CallLoop.state` (:class:`CallState`) is all the loop carries
from one step to the next: the phase, the recall rounds answered, whether this request's
overflow retry was used, the tools offered, and what the usage report of the request out names
(the view's revision and last seq, what the guard left out). It is written down with
:meth:`CallState.to_json` and read back with :meth:`CallState.from_json`, and
:meth:`CallLoop.resume` continues a loop from it in another process: the request can go out from
one API call and its reply come back in a later one, to any API process. The plan is read from
the store again there (:mod:`.call_plan`), keeping the tools the call began with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol, TypeVar, get_args

from sessionfold.core.errors import ContextOverflowError, InvalidInputError
from sessionfold.core.frame import RECALL_TOOL_NAME
from sessionfold.core.overflow import is_context_overflow, overflow_tokens
from sessionfold.core.window import Trigger
from sessionfold.runtime.fold_procedure import FoldReport
from sessionfold.store import Window

from .call_plan import OVER_BUDGET_CHOICES, CallPlan, OverBudget
from .recall import ToolCall, asks_only_recall, tool_calls
from .window_view import WindowView, view_of

__all__ = [
    "CallLoop",
    "CallSession",
    "CallState",
    "Phase",
    "RaiseError",
    "ReturnReply",
    "SendRequest",
]

#: ``new``: nothing sent yet; ``sending``: a request is out, its reply (or error) awaited;
#: ``done``: a reply was returned or an error raised.
Phase = Literal["new", "sending", "done"]
_PHASES: tuple[str, ...] = get_args(Phase)
_STATE_VERSION = 1


@dataclass(frozen=True)
class CallState:
    """Everything a :class:`CallLoop` carries between steps (see the module doc)."""

    phase: Phase = "new"
    #: Whether the model call takes the tools sessionfold adds (no: no recall for this call).
    takes_tools: bool = True
    #: None: the handle's own choice (resolved when the loop starts).
    over_budget: OverBudget | None = None
    cache_breakpoints: bool = False
    #: Recall rounds answered so far in this call.
    rounds: int = 0
    #: Whether the request out is already the retry after an overflow (one per request).
    retried: bool = False
    #: The names of the tools sessionfold offers this call (the recall tool, or none).
    tools: tuple[str, ...] = ()
    #: What the usage report of the request out names: the window revision and highest seq it
    #: was built from; the calibrated tokens the guard left out of it; the estimate of the
    #: tools sessionfold added to it (taken off the report: the calibration leaves them out).
    revision: int = -1
    last_seq: int = -1
    unsent_tokens: int = 0
    tool_tokens: int = 0
    #: The estimate of the request out as sent (system prompt, rendered items, tools), which
    #: recall answers are sized by; filled when the state is read while recall is offered.
    sent_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, **dataclasses.asdict(self),
                "tools": list(self.tools)}

    @classmethod
    def from_json(cls, raw: object) -> CallState:
        """The state :meth:`to_json` wrote; InvalidInputError, saying what is wrong, for
        anything else (it may come back from an agent over HTTP)."""
        if not isinstance(raw, Mapping):
            raise InvalidInputError(f"a call state is an object, got {type(raw).__name__}")
        if raw.get("version") != _STATE_VERSION:
            raise InvalidInputError(f"a call state of version {raw.get('version')!r:.20}; this "
                                    f"client reads version {_STATE_VERSION}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(str(k)[:40] for k in raw if k not in known and k != "version")
        if unknown:
            raise InvalidInputError(f"unknown call state field(s) {unknown}")
        values = {name: raw[name] for name in known if name in raw}
        _check_state(values)
        if "tools" in values:
            values["tools"] = tuple(values["tools"])
        return cls(**values)


def _check_state(values: Mapping[str, Any]) -> None:
    def wrong(name: str, what: str) -> NoReturn:
        raise InvalidInputError(f"call state field {name!r} must be {what}, got "
                                f"{values[name]!r:.40}")

    for name in ("takes_tools", "cache_breakpoints", "retried"):
        if name in values and not isinstance(values[name], bool):
            wrong(name, "true or false")
    for name in ("rounds", "revision", "last_seq", "unsent_tokens", "tool_tokens",
                 "sent_tokens"):
        value = values.get(name)
        if name in values and not (value is None and name == "sent_tokens") and (
                isinstance(value, bool) or not isinstance(value, int)):
            wrong(name, "a whole number")
    if values.get("rounds", 0) < 0:
        wrong("rounds", "0 or more")
    if "phase" in values and values["phase"] not in _PHASES:
        wrong("phase", f"one of {list(_PHASES)}")
    if values.get("over_budget") not in (None, *OVER_BUDGET_CHOICES):
        wrong("over_budget", f"null or one of {list(OVER_BUDGET_CHOICES)}")
    tools = values.get("tools", [])
    if not isinstance(tools, list | tuple) or not all(isinstance(t, str) for t in tools):
        wrong("tools", "a list of tool names")


# --- what the loop says to do ----------------------------------------------------------------

@dataclass(frozen=True)
class SendRequest:
    """Send this request: ``view`` (the system prompt and messages, as the guard lets them
    out) with ``tools()`` beside the caller's own. Then tell the loop what happened:
    :meth:`CallLoop.replied` or :meth:`CallLoop.failed`."""

    view: WindowView
    offered: tuple[Mapping[str, Any], ...] = ()

    def tools(self) -> list[dict[str, Any]]:
        """The tools sessionfold adds, in the Anthropic shape (fresh copies each time)."""
        return [dict(tool) for tool in self.offered]


@dataclass(frozen=True)
class ReturnReply:
    """Done: ``reply`` is what the call returns."""

    reply: Any


@dataclass(frozen=True)
class RaiseError:
    """Done: raise ``error`` (chained to ``cause`` when there is one; an error of the model
    call that is not an overflow is ``error`` itself, raised as it is)."""

    error: BaseException
    cause: BaseException | None = None

    def throw(self) -> NoReturn:
        if self.cause is None:
            raise self.error
        raise self.error from self.cause


# --- what the loop asks of the session ---------------------------------------------------------

class CallSession(Protocol):
    """The store and bus work the loop has done for it: a
    :class:`~sessionfold.client.session.SessionHandle` is one. None of it calls the model."""

    session_id: str

    def plan_call(self, *, takes_tools: bool, over_budget: OverBudget | None,
                  cache_breakpoints: bool) -> CallPlan:
        """Read the session and decide the call's plan (recall on for it or not)."""
        ...

    def request_view(self, plan: CallPlan) -> WindowView:
        """The view one request sends: the stored window through the pre-send guard and the
        hard cap (which may fold inline, or raise BudgetExceededError: nothing is sent)."""
        ...

    def fold_inline(self, *, trigger: Trigger = "overflow", target_tokens: int | None = None,
                    measured_tokens: int | None = None) -> FoldReport:
        """Fold now, through the workers' claim and commit (the inline claim wins)."""
        ...

    def report_reply(self, reply: Any, *, seq: int, revision: int,
                     unsent_tokens: int) -> None:
        """Count the model call and publish its usage, as measuring the window at
        ``(revision, seq)`` with ``unsent_tokens`` more (or fewer) prompt tokens."""
        ...

    def request_tokens(self, plan: CallPlan, view: WindowView) -> int:
        """The estimate of the request ``view`` as sent (system prompt, items, tools)."""
        ...

    def answer_round(self, plan: CallPlan, reply: Any, calls: Sequence[ToolCall],
                     sent_tokens: int | None) -> None:
        """Answer the recall ``calls`` of ``reply`` (sized by the request that carried them,
        ``sent_tokens``; None: by the store's size) and append the exchange."""
        ...


# --- the loop ------------------------------------------------------------------------------------

_Done = TypeVar("_Done", ReturnReply, RaiseError)


class CallLoop:
    """One ``call()``'s decisions (see the module doc). Not thread-safe: one step at a time."""

    def __init__(self, session: CallSession, state: CallState) -> None:
        self._session = session
        self._state = state
        self._plan: CallPlan | None = None
        #: The request out (in this process; a resumed loop has only its state).
        self._view: WindowView | None = None
        #: The overflow fold of the request out, for the error if the retry overflows too.
        self._overflow_fold: FoldReport | None = None

    @classmethod
    def open(cls, session: CallSession, *, takes_tools: bool = True,
             over_budget: OverBudget | None = None, cache_breakpoints: bool = False) -> CallLoop:
        """A loop for one call, before anything is read or sent (:meth:`start` begins)."""
        return cls(session, CallState(takes_tools=takes_tools, over_budget=over_budget,
                                      cache_breakpoints=cache_breakpoints))

    @classmethod
    def resume(cls, session: CallSession, state: CallState) -> CallLoop:
        """Continue a loop whose request is out, from its written-down ``state`` (maybe in
        another process): its plan is read again, offering the tools the call began with."""
        if state.phase != "sending":
            raise InvalidInputError(f"only a call loop with a request out can be resumed; "
                                    f"this one is {state.phase!r}")
        loop = cls(session, state)
        loop._plan = session.plan_call(takes_tools=True, over_budget=state.over_budget,
                                       cache_breakpoints=state.cache_breakpoints
                                       ).offering(state.tools)
        return loop

    @property
    def state(self) -> CallState:
        """The loop's state as a value (see :class:`CallState`). While recall is offered, the
        estimate of the request out is counted into it (once), so a loop resumed from it sizes
        recall answers as this one would."""
        state = self._state
        if state.phase == "sending" and state.tools and state.sent_tokens is None and (
                self._view is not None):
            state = self._state = dataclasses.replace(
                state, sent_tokens=self._session.request_tokens(self.plan, self._view))
        return state

    @property
    def plan(self) -> CallPlan:
        if self._plan is None:
            raise InvalidInputError("the call loop has not started: call start() first")
        return self._plan

    # --- steps ---------------------------------------------------------------------------------

    def start(self) -> SendRequest:
        """Read the session, fold first if the call asked to and it is over budget, decide
        whether recall is offered: the first request."""
        self._expect("new")
        state = self._state
        session = self._session
        plan = session.plan_call(takes_tools=state.takes_tools, over_budget=state.over_budget,
                                 cache_breakpoints=state.cache_breakpoints)
        self._state = dataclasses.replace(state, over_budget=plan.over_budget)
        if plan.over_budget == "fold" and plan.policy.over_budget(plan.current_tokens):
            session.fold_inline(trigger="overflow", measured_tokens=plan.current_tokens)
        self._plan = plan
        view = session.request_view(plan)
        if plan.recall and not view.edited and plan.policy.recall_offer == "edited":
            # Nothing in the request can be recalled yet: the tool's definition would ride on
            # every early request for nothing (short sessions pay it most). A request whose
            # guard ran with the tool counted is under without it too: render it again only.
            self._plan = plan.without_recall()
            view = _without_tools(view, cache_breakpoints=plan.cache_breakpoints)
        return self._send(view)

    def failed(self, exc: BaseException) -> SendRequest | RaiseError:
        """The request raised ``exc``. After the first "too long" of a request: fold inline
        down to half the budget (half the model's context window when the error names it and
        it is the smaller: the budget was set past what the model takes) and send again. A
        second one raises ContextOverflowError chained to it; any other error is raised as it
        is."""
        self._expect("sending")
        if not is_context_overflow(exc):
            return self._finish(RaiseError(exc))
        if self._state.retried:
            return self._finish(RaiseError(self._still_too_long(exc), cause=exc))
        self._state = dataclasses.replace(self._state, retried=True)
        counted = overflow_tokens(exc)
        limit = self.plan.policy.budget_tokens
        if counted is not None and 0 < counted[1] < limit:
            limit = counted[1]
        self._overflow_fold = self._session.fold_inline(
            trigger="overflow", target_tokens=limit // 2,
            measured_tokens=counted[0] if counted else None)
        return self._send(self._session.request_view(self.plan))

    def retry(self, exc: BaseException) -> SendRequest:
        """:meth:`failed`, for an adapter that raises where the loop says to: the request to
        send again, or the loop's error raised here."""
        after = self.failed(exc)
        if isinstance(after, RaiseError):
            after.throw()
        return after

    def replied(self, reply: Any, *, relayed: bool = False) -> SendRequest | ReturnReply:
        """The request returned ``reply``: its usage is reported; a recall-only reply, while
        rounds are left, is answered from the ledger and the next request is to be sent; any
        other is the call's. ``relayed``: the caller already reads this reply (a stream handed
        over), so it is the call's whatever it holds."""
        self._expect("sending")
        state = self._state
        # A guarded request is reported as the stored window's size; the recall tool's
        # definition, which the calibration leaves out, is taken off.
        self._session.report_reply(reply, seq=state.last_seq, revision=state.revision,
                                   unsent_tokens=state.unsent_tokens - state.tool_tokens)
        calls = None if relayed else self._recall_only(reply)
        if calls is None:
            return self._finish(ReturnReply(reply))
        self._session.answer_round(self.plan, reply, calls, self.state.sent_tokens)
        self._state = dataclasses.replace(self._state, rounds=state.rounds + 1, retried=False)
        return self._send(self._session.request_view(self.plan))

    # --- for streams ---------------------------------------------------------------------------

    @property
    def relays_at_once(self) -> bool:
        """Whether a stream can go to the caller as its events come: no recall is offered, so
        no reply of this call is answered by the client."""
        return not self.plan.recall

    @staticmethod
    def settled_by(tool_name: str | None) -> bool:
        """Whether a reply starting a call of ``tool_name`` is known not to be a recall-only
        one (it calls one of the agent's own tools): its stream can go to the caller."""
        return tool_name is not None and tool_name != RECALL_TOOL_NAME

    # --- inside ----------------------------------------------------------------------------------

    def _recall_only(self, reply: Any) -> list[ToolCall] | None:
        """The recall calls of ``reply`` when it asks only for recall and a round is left."""
        plan = self.plan
        if not plan.recall or self._state.rounds >= plan.policy.recall_max_rounds:
            return None
        calls = tool_calls(reply)
        return calls if asks_only_recall(calls) else None

    def _send(self, view: WindowView) -> SendRequest:
        plan = self.plan
        self._view = view
        self._state = dataclasses.replace(
            self._state, phase="sending", tools=plan.tool_names, revision=view.revision,
            last_seq=view.last_seq, unsent_tokens=view.unsent_tokens,
            tool_tokens=view.tool_tokens, sent_tokens=None)
        return SendRequest(view, tuple(plan.tools))

    def _finish(self, step: _Done) -> _Done:
        self._state = dataclasses.replace(self._state, phase="done")
        self._view = None
        return step

    def _expect(self, phase: Phase) -> None:
        if self._state.phase != phase:
            raise InvalidInputError(f"the call loop is {self._state.phase!r}, not {phase!r}: "
                                    "start() once, then replied() or failed() for each "
                                    "request it says to send")

    def _still_too_long(self, exc: BaseException) -> ContextOverflowError:
        report = self._overflow_fold
        outcome = f"{report.outcome}, {report.tokens_after} tokens after" if report else "none"
        return ContextOverflowError(
            f"session {self._session.session_id!r}: the request is still too long after an "
            f"inline fold ({outcome}); the provider said: {exc}")


def _without_tools(view: WindowView, *, cache_breakpoints: bool) -> WindowView:
    """``view`` rendered again for a request that carries no recall tool (no hints), keeping
    what the guard left out of it."""
    window = Window(session_id=view.session_id, system=view.system, revision=view.revision,
                    items=list(view.items), chars=[])
    again = view_of(window, cache_breakpoints=cache_breakpoints, recall=False)
    return dataclasses.replace(again, unsent_tokens=view.unsent_tokens)

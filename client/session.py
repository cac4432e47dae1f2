"""One session seen by an agent or an app server: :class:`SessionHandle`.

What each part promises:

- :meth:`SessionHandle.window` reads the already-compacted window from the store (one indexed
  query). It never waits for a fold: folds run in the background and land between calls.
- :meth:`SessionHandle.append` and :meth:`SessionHandle.window` take and give the Anthropic
  Messages shape or the OpenAI chat shape; tool results sent one at a time are held until the
  set answering one assistant message is complete (:mod:`.shapes`), unless the handle is made
  with ``hold_tool_results=False`` (the HTTP API's, which keeps nothing between requests: a
  partial set is refused instead). The API appends through such a handle, so its appends
  nudge as an agent's do (below).
- :meth:`SessionHandle.report_usage` publishes the provider's counts on the usage bus for the
  scheduler. It never blocks for long and never raises: with Redis away the publisher buffers a
  little, warns, and the scheduler's store sweep covers what is lost.
- :meth:`SessionHandle.call` sends the window through ``fn(system, messages)``, reports the
  usage, and when the provider rejects the request as too long
  (:func:`~sessionfold.core.overflow.is_context_overflow`) folds inline — trigger ``overflow``,
  forced, down to half the budget, through the same claim/commit procedure as the workers
  (:mod:`sessionfold.runtime.fold_procedure`), where the inline claim wins over a background fold
  in flight — and retries once. A second overflow raises :class:`ContextOverflowError` chained
  to the provider's error.
- **The budget is a hard cap** (:mod:`sessionfold.core.guard`): before each request of
  ``call()`` (its recall rounds, its retry after an overflow, and the SDK wrappers' requests,
  which are made of the same pieces) the handle estimates the request with the session's
  calibration. Past the budget less the policy's ``guard_margin_ratio``, the best shrink of the
  outgoing request alone goes out: the cheap layers (clip, drop recall exchanges, mask old tool
  output, drop thinking), then, if still over, the user messages inside the protected turns
  clipped (the newest last). Deterministic, so the same window is sent as the same bytes again;
  the stored window is left alone (no claim, no commit: it never races a background fold). If
  that is still over, the handle folds inline (trigger ``overflow``, counted in
  :attr:`SessionHandle.cap_folds`) through the workers' commit path and guards again, leaving
  the older history out of the request as a last step; a request still over after that is one
  message (or the system prompt) that cannot fit, and :class:`BudgetExceededError` says which,
  before anything is sent. That is ``over_budget="cap"``, the default. ``"send"`` sends the best
  shrink even when it is over (counted in :attr:`SessionHandle.guard_over_budget`, logged once);
  ``"fold"`` also folds inline before the request whenever the stored window is past the budget.
  Paused sessions are guarded too; ``FoldPolicy(guard=False)`` opts out (and so sends over).
  A guarded request's usage is reported as the stored window's (the provider's count plus what
  the guard left out), so the scheduler and the calibration still see the session's true size
  and the background fold comes.
- **Nudges**: an append that takes the session past its trigger
  (:attr:`~sessionfold.store.results.AppendResult.crossed_trigger`) publishes a
  :class:`~sessionfold.runtime.usage.NudgeEvent`, so the scheduler looks at the session now
  instead of at the next usage report. Like usage reports it never blocks and never raises.
- Summarizer calls made on the agent's path (inline folds) are counted, per handle and per
  client: in a healthy pipeline they stay at zero.
- **Recall** (:mod:`.recall`): when ``fn`` takes a third argument or a ``tools`` keyword, it is
  given the tools to send: ``[sessionfold_recall]`` once the request holds something recall can
  give back (an item sessionfold edited: a clip, a mask stub, a summary...), ``[]`` before that
  and for a session with ``recall=False``: the definition (~300 tokens) rides on no request
  that could not use it. The tool's estimate is added to the guard's size of each request that
  carries it and taken off its usage report, so the calibration never includes it.
  A reply that asks only for recall is answered from the ledger by the client itself: the
  exchange (the reply, and a user message with the answers as tool results) is appended with
  ``recall=True`` and the model is called again, at most ``recall_max_rounds`` times, each
  round's usage reported as usual, so the agent's own loop never sees it; ``call()`` returns
  the first reply that is not a recall-only one. A reply that mixes recall with the agent's own
  tools is returned: :meth:`SessionHandle.tool_results` adds the recall answers to the agent's
  own results for the next user message. A two-argument ``fn`` keeps working: it gets no tool,
  its windows carry no recall hints, and the handle logs once that recall is off for it.

A handle reaches its deployment through the :class:`Connection` it was made by (a
:class:`~sessionfold.client.connection.Client`): the store, the usage publisher, and the inline
fold, which the client runs with its guarded summarizer and counts.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sessionfold.core.errors import (
    BudgetExceededError,
    ContextOverflowError,
    InvalidInputError,
    InvalidMessageError,
)
from sessionfold.core.guard import GuardResult, GuardStage, guard_window
from sessionfold.core.messages import Message, parse_message
from sessionfold.core.overflow import is_context_overflow, overflow_tokens
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, count_text
from sessionfold.core.window import FoldedSpan, Trigger, WindowItem
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport
from sessionfold.runtime.metrics import metrics
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store import AppendResult, LedgerEntry, SessionInfo, SessionStore, Window

from .recall import (
    RecallAnswer,
    RecallRequest,
    ToolCall,
    answer,
    answer_tool_input,
    anthropic_tool,
    asks_only_recall,
    least_answer_tokens,
    parse_seq,
    tool_calls,
)
from .shapes import (
    HeldAppend,
    HeldToolResults,
    OpenAIAppend,
    Shape,
    WindowShape,
    check_system,
    openai_append,
    pairing_hint,
    partial_answer,
    resolve_shape,
)
from .window_view import WindowView, rendered, view_of

__all__ = [
    "AsyncModelCall",
    "Connection",
    "ModelCall",
    "ModelCallWithTools",
    "OverBudget",
    "SessionHandle",
]

log = logging.getLogger(__name__)

#: What ``call()`` does with a request it cannot shrink under the budget (see the module doc):
#: ``cap`` (the default) folds inline and otherwise refuses to send; ``send`` sends the best
#: shrink; ``fold`` also folds inline before any request while the window is past the budget.
OverBudget = Literal["cap", "send", "fold"]
OVER_BUDGET_CHOICES: tuple[str, ...] = ("cap", "send", "fold")
#: ``fn(system, messages)``: one model call; returns the provider's response (with ``.usage``).
ModelCall = Callable[[str, list[dict[str, Any]]], Any]
#: ``fn(system, messages, tools)`` (or ``tools=`` as a keyword): the tools to send beside the
#: agent's own, the recall tool among them.
ModelCallWithTools = Callable[[str, list[dict[str, Any]], list[dict[str, Any]]], Any]
AsyncModelCall = Callable[..., Awaitable[Any]]
#: How a model call takes the tools: as the ``tools`` keyword, as a third argument, or not.
ToolsMode = Literal["keyword", "positional", "none"]


class Connection(Protocol):
    """What a handle needs of the client that made it."""

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> SessionStore: ...

    @property
    def publisher(self) -> UsagePublisher | None: ...

    def run_inline_fold(self, job: FoldJob) -> FoldReport:
        """Run ``job`` on this thread through the fold procedure, with the client's summarizer
        and its guards, and count it."""
        ...

    def nudge(self, session_id: str, revision: int) -> bool:
        """Tell the session's scheduler to read it from the store now; never raises."""
        ...


_MODES: dict[tuple[object, bool], ToolsMode] = {}
_MODES_LOCK = threading.Lock()


def _inspect_mode(fn: Callable[..., Any]) -> ToolsMode:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the old contract
        return "none"
    kinds = inspect.Parameter
    if any(p.name == "tools" and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
           for p in params):
        return "keyword"
    positional = [p for p in params
                  if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 3:
        return "positional"
    if any(p.kind == kinds.VAR_KEYWORD for p in params):
        return "keyword"  # forwards keywords: to the SDK's create(), most likely
    if any(p.kind == kinds.VAR_POSITIONAL for p in params):
        return "positional"
    return "none"


def tools_mode(fn: Callable[..., Any]) -> ToolsMode:
    """How ``fn`` takes the tools to send, read from its signature once per function (a lambda
    made anew on every turn has the same code, so it is inspected once too)."""
    if inspect.ismethod(fn):
        key: tuple[object, bool] = (fn.__func__.__code__, True)
    elif inspect.isfunction(fn):
        key = (fn.__code__, False)
    else:
        return _inspect_mode(fn)  # a partial, a callable object: cheap enough to read again
    mode = _MODES.get(key)
    if mode is None:
        mode = _inspect_mode(fn)
        with _MODES_LOCK:
            _MODES[key] = mode
    return mode


@dataclass(frozen=True)
class CallPlan:
    """What one :meth:`SessionHandle.call` decided before its first request: how ``fn`` takes
    tools, whether recall is on for it, the tools to send and the policy read; and what the
    pre-send guard estimates each request with (the session's calibration, its system prompt's
    estimate, and the estimate of what else is sent that the calibration has not seen)."""

    mode: ToolsMode
    recall: bool
    tools: list[dict[str, Any]]
    policy: FoldPolicy
    cache_breakpoints: bool
    calibration: Calibration = dataclasses.field(default_factory=Calibration)
    system_tokens: int = 0
    #: The estimate of the tools sessionfold adds (the recall tool), which the calibration
    #: leaves out (see :attr:`WindowView.tool_tokens`).
    extra_tokens: int = 0
    over_budget: OverBudget = "cap"

    def invoke(self, fn: Callable[..., Any], view: WindowView) -> Any:
        """Call ``fn`` with ``view``, and the tools if it takes them (a fresh list each time)."""
        if self.mode == "keyword":
            return fn(view.system, view.messages, tools=[dict(t) for t in self.tools])
        if self.mode == "positional":
            return fn(view.system, view.messages, [dict(t) for t in self.tools])
        return fn(view.system, view.messages)


def _content_of(response: Any) -> Any:
    return response.get("content") if isinstance(response, Mapping) else getattr(
        response, "content", None)


def _response_id(response: Any) -> str | None:
    value = response.get("id") if isinstance(response, Mapping) else getattr(response, "id", None)
    return value if isinstance(value, str) and 0 < len(value) <= 200 else None


def _response_usage(response: Any) -> tuple[Any, str | None]:
    """``(usage, model)`` of a provider response: an SDK object or a dict."""
    if isinstance(response, Mapping):
        return response.get("usage"), response.get("model")
    return getattr(response, "usage", None), getattr(response, "model", None)


class SessionHandle:
    """One session seen by an agent or an app server. Use one handle per agent thread."""

    def __init__(self, client: Connection, session_id: str, *,
                 over_budget: OverBudget = "cap", hold_tool_results: bool = True) -> None:
        if over_budget not in OVER_BUDGET_CHOICES:
            raise InvalidInputError(f"over_budget must be one of {list(OVER_BUDGET_CHOICES)}, "
                                    f"got {over_budget!r}")
        self.client = client
        self.session_id = session_id
        self.over_budget: OverBudget = over_budget
        #: Hold a partial set of tool results until the rest arrives (see append()); False:
        #: the store refuses it (tool-pairing), for a caller that keeps nothing between appends.
        self.hold_tool_results = hold_tool_results
        #: Summarizer calls this handle made on the agent's path (inline folds).
        self.summarizer_calls = 0
        self.inline_folds = 0
        #: Model calls made through :meth:`call`, and usage reports that found no usage.
        self.calls = 0
        self.unmeasured = 0
        self.last_fold: FoldReport | None = None
        #: Recall requests this handle answered (in call() and through its helpers), and the
        #: extra model calls call() made to answer them (one per round).
        self.recall_calls = 0
        self.recall_rounds = 0
        self._told_recall_off = False
        #: Requests the pre-send guard shrank; those it could not bring under the budget (sent
        #: over only with ``over_budget="send"``); inline folds the hard cap made (also counted
        #: in ``inline_folds``); nudges published after appends.
        self.guarded_requests = 0
        self.guard_over_budget = 0
        self.cap_folds = 0
        self.nudges = 0
        self._told_over_budget = False
        #: Tool results answering part of the ledger tail's open calls (see append()).
        self._held: HeldToolResults | None = None

    def __repr__(self) -> str:
        return f"SessionHandle({self.session_id!r})"

    @property
    def store(self) -> SessionStore:
        return self.client.store

    def info(self) -> SessionInfo:
        return self.store.get_session(self.session_id)

    def append(self, turns: Sequence[Message | Mapping[str, Any]], *, key: str | None = None,
               shape: Shape = "auto") -> AppendResult:
        """Append messages to the ledger and the window; a retried ``key`` is not appended twice.

        ``turns`` are in the Anthropic Messages shape or the OpenAI chat shape (assistant
        ``tool_calls``, ``tool`` messages, SDK message objects too): ``shape`` says which, and
        ``"auto"`` reads it from the messages where they are unambiguous (:mod:`.shapes`).
        Consecutive ``tool`` messages become one user message of tool results. Results that
        answer only part of the open tool calls of the ledger's last message are *held* by this
        handle, nothing written, and a :class:`~.shapes.HeldAppend` is returned; the append
        that brings the rest writes them all as one user message (under its own ``key``), so a
        turn is never written half answered (:attr:`held_tool_results` shows them); a handle
        made with ``hold_tool_results=False`` lets the store refuse them instead
        (ToolPairingError, saying to send the whole set at once). A ``system`` message must be
        the session's own prompt (it is then left out). An append that takes the session past
        its trigger nudges the scheduler (see the module doc).
        """
        # One message passed alone goes to the store as it is, which says to wrap it in a list
        # (list() would turn it into its keys or fields and blame those instead).
        if isinstance(turns, Mapping | Message | str | bytes):
            return self._nudge_if_crossed(self.store.append(self.session_id, turns, key=key))
        batch = list(turns)
        openai = resolve_shape(batch, shape) == "openai"
        if not openai and self._held is None:
            return self._nudge_if_crossed(self.store.append(self.session_id, batch, key=key))
        return self._nudge_if_crossed(
            self._append_converted(batch, openai_append(batch) if openai else None, key))

    def _nudge_if_crossed(self, result: AppendResult) -> AppendResult:
        """Nudge the scheduler when the append took the session past its trigger (see the
        module doc): it re-reads the session from the store now. Never raises."""
        if not result.crossed_trigger or self.client.publisher is None:
            return result
        self.client.nudge(self.session_id, result.revision)
        self.nudges += 1
        return result

    @property
    def held_tool_results(self) -> list[dict[str, Any]]:
        """The tool results this handle holds until the rest of their set arrives (Anthropic
        ``tool_result`` blocks; see :meth:`append`)."""
        held = self._held
        return [b.model_dump(mode="json", exclude_unset=True) for b in held.blocks] if held else []

    def _append_converted(self, batch: list[Any], converted: OpenAIAppend | None,
                          key: str | None) -> AppendResult:
        """An append in the OpenAI shape (``converted``), or one that meets held results: the
        grouping rule of :mod:`.shapes`."""
        messages = converted.messages if converted is not None else [
            parse_message(m, i) for i, m in enumerate(batch)]
        info: SessionInfo | None = None
        if converted is not None and converted.system is not None:
            info = self.info()
            check_system(converted.system, info.system)
        held = self._held  # (never set on a handle that does not hold)
        tail = self._open_calls(info) if self.hold_tool_results and (held is not None or (
            converted is not None and converted.opens_with_results)) else None
        if held is not None and (tail is None or tail[0] != held.seq):
            log.warning("session %s: dropped held tool results %s: the ledger moved on past "
                        "the tool calls they answered", self.session_id, list(held.answered))
            held = self._held = None
        if held is not None:
            messages = held.merged_into(messages)
        if tail is not None and len(messages) == 1:
            partial = partial_answer(messages[0], tail[0], tail[1])
            if partial is not None:
                self._held = partial
                return HeldAppend(tail[0] + 1, tail[0], tail[2], held=partial.answered,
                                  owed=partial.owed)
        try:
            result = self.store.append(self.session_id, messages, key=key)
        except InvalidMessageError as exc:
            if converted is None:
                raise
            readdressed = converted.readdress(exc, shift=len(held.blocks) if held else 0)
            if not self.hold_tool_results:  # a partial set met the store: say the rule
                readdressed = pairing_hint(readdressed, converted)
            raise readdressed from None
        self._held = None
        return result

    def _open_calls(self, info: SessionInfo | None) -> tuple[int, tuple[str, ...], int] | None:
        """``(seq, open tool call ids, revision)`` of the ledger's last message when it made
        tool calls; None otherwise."""
        info = info or self.info()
        if info.ledger_len == 0:
            return None
        tail = self.store.read_ledger(self.session_id, info.ledger_len - 1)
        last = tail[-1] if tail else None
        if last is None or last.message is None or not last.message.tool_use_ids():
            return None
        return last.seq, tuple(last.message.tool_use_ids()), info.revision

    def window(self, *, cache_breakpoints: bool = False, recall: bool = False,
               shape: WindowShape = "anthropic") -> WindowView:
        """The window as it stands (already compacted); never waits for a fold.

        ``recall=True`` renders it for a request that carries the recall tool (the agent sends
        :func:`~sessionfold.client.recall.anthropic_tool` itself): stubs, seams and frames say
        how to recall what they stand for. Without it, no hint, and a recall exchange still in
        the window reads as the line a dropped one leaves.

        ``shape="openai"``: ``messages`` are the ``messages=`` of a chat completion, the system
        prompt first (:mod:`.shapes`; ``cache_breakpoints`` are the Messages API's and are
        refused with it).
        """
        return view_of(self.store.read_window(self.session_id),
                       cache_breakpoints=cache_breakpoints, recall=recall, shape=shape)

    # --- recall ------------------------------------------------------------------------------

    def recall(self, *, seq: int | str | None = None, query: str | None = None,
               offset: int = 0) -> RecallAnswer:
        """What the recall tool answers for this session now (as the model would get it).

        ``seq`` as the window names rows (``12``, ``"#12"``, ``"12-30"``, ``"#12–#30"``), with
        ``offset`` into the first row's text; or ``query``. InvalidInputError for a malformed
        request (the model's are answered as an error result instead). Counted like the
        model's.
        """
        request = RecallRequest(seq=parse_seq(seq) if seq is not None else None, query=query,
                                offset=offset)
        result = answer(self.store, self.session_id, request)
        self._count_recall([result])
        return result

    def answer_recall(self, response: Any) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks answering the recall calls of ``response`` (a model reply,
        the SDK's object or its JSON), in order; [] when it makes none. Counted."""
        calls = [call for call in tool_calls(response) if call.is_recall]
        return [result.tool_result(call.id)
                for call, result in zip(calls, self._answer(calls), strict=True)]

    def tool_results(self, response: Any,
                     own_results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The content of the next user message after ``response``: a ``tool_result`` for
        every tool call it made, in the order it made them -- the agent's own (``own_results``)
        and the answers to its recall calls -- then any other blocks of ``own_results`` (text).

        For a reply that mixed recall with the agent's own tools (``call()`` returns those to
        the agent). InvalidInputError when ``own_results`` misses one of the agent's calls or
        answers a call the reply did not make.
        """
        calls = tool_calls(response)
        own: dict[str, dict[str, Any]] = {}
        rest: list[dict[str, Any]] = []
        for raw in own_results:
            block = _block_dict(raw)
            if block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
                own[block["tool_use_id"]] = block
            else:
                rest.append(block)
        theirs = {call.id for call in calls if not call.is_recall}
        unknown = sorted(set(own) - theirs)
        if unknown:
            raise InvalidInputError(f"own_results answer tool call(s) {unknown} that the reply "
                                    "did not make (or that are recall calls)")
        missing = [f"{call.name} ({call.id})" for call in calls
                   if not call.is_recall and call.id not in own]
        if missing:
            raise InvalidInputError("own_results has no tool_result for the reply's call(s) "
                                    + ", ".join(missing))
        recalls = [call for call in calls if call.is_recall]
        answers = dict(zip((c.id for c in recalls), self._answer(recalls), strict=True))
        return [*(answers[call.id].tool_result(call.id) if call.is_recall else own[call.id]
                  for call in calls), *rest]

    def _answer(self, calls: Sequence[ToolCall],
                info: SessionInfo | None = None) -> list[RecallAnswer]:
        """Answer recall ``calls`` in order; each answer is sized by the room the ones before
        it left: each takes the ``tool_result`` block it goes out as, in the provider's tokens
        (the calibration's slope: the estimator's count alone, and the text alone, let many
        answers to one reply take the next request past the budget). Counted."""
        info = info or self.info()
        slope = max(info.calibration.a if info.calibration.samples else 1.0, 0.0)
        counter = self.store.counter
        # Every call gets an answer: those still to come hold back at least a no-room one each.
        least = math.ceil(least_answer_tokens(info, counter) * slope)
        answers: list[RecallAnswer] = []
        for k, call in enumerate(calls):
            pending = least * (len(calls) - k - 1)
            sized = dataclasses.replace(info, current_tokens=info.current_tokens + pending)
            result = answer_tool_input(self.store, self.session_id, call.input, info=sized,
                                       share=len(calls))
            answers.append(result)
            block = counter.message(parse_message(
                {"role": "user", "content": [result.tool_result(call.id)]}))
            grown = math.ceil(block * slope)  # the block holds the answer's text
            info = dataclasses.replace(info, current_tokens=info.current_tokens + grown)
        self._count_recall(answers)
        return answers

    def _answer_basis(self, plan: CallPlan, sent: WindowView | None,
                      response: Any) -> SessionInfo:
        """The session with the size its recall answers are sized by: the larger of the size
        the store knows and the request just sent as it went out (the system prompt, the
        window as rendered, with its recall hints and as the guard let it out, the tool
        definitions the calibration has not seen yet) plus the model's recall call, which the
        exchange appends. The store's size alone leaves out the hints, the call and, until a
        usage report is read back, the tools: answers sized by it took the request after them
        past the budget (B1, 16k, with the recall tool)."""
        info = self.info()
        if sent is None:
            return info
        counter = self.store.counter
        estimate = plan.system_tokens + plan.extra_tokens + sum(
            counter.message(rendered(item, recall=sent.recall)) for item in sent.items)
        try:
            estimate += counter.message(parse_message(
                {"role": "assistant", "content": _content_of(response)}))
        except InvalidMessageError:
            estimate += count_text(json.dumps(_content_of(response), default=str))
        basis = max(info.current_tokens, plan.calibration.predict(estimate))
        return dataclasses.replace(info, current_tokens=basis)

    def _count_recall(self, answers: Sequence[RecallAnswer]) -> None:
        self.recall_calls += len(answers)
        counter = metrics()
        for result in answers:
            counter.record_recall(result.kind, result.outcome)
            log.debug("session %s: recall %s -> %s (%s tokens)", self.session_id, result.kind,
                      result.outcome, result.tokens)

    def ledger(self, start: int = 0, end: int | None = None) -> list[LedgerEntry]:
        return self.store.read_ledger(self.session_id, start, end)

    def recover(self, span: FoldedSpan | WindowItem | tuple[int, int]) -> list[Message]:
        """The originals behind a folded span (a span, a summary item, or ``(start, end)``)."""
        if isinstance(span, tuple):
            start, end = span
        else:
            start, end = span.start_seq, span.end_seq
        return self.store.recover(self.session_id, start, end)

    def report_usage(self, usage: Any, *, seq: int, revision: int,
                     model: str | None = None) -> bool:
        """Publish one call's usage (anthropic ``Usage`` or a dict). Never raises.

        True when the event reached Redis now; False when it was buffered, dropped, or unusable
        (a report of zero tokens is flagged, not sent: sessionfold does not guess).
        """
        return self._report_usage(usage, seq=seq, revision=revision, model=model)

    def _report_usage(self, usage: Any, *, seq: int, revision: int, model: str | None,
                      unsent_tokens: int = 0) -> bool:
        """:meth:`report_usage`; ``unsent_tokens``: what the pre-send guard left out of the
        request (calibrated tokens), added back so the report measures the stored window, less
        the tools sessionfold added (which the calibration leaves out): it may be negative."""
        try:
            event = UsageEvent.from_usage(self.session_id, usage, seq=seq, revision=revision,
                                          model=model)
        except Exception as exc:  # a malformed report must not fail the agent's turn
            log.warning("usage report for %s not sent: %s", self.session_id, exc)
            return False
        if unsent_tokens and event.prompt_tokens > 0:
            # The report names the stored window's (revision, seq): it must measure that window,
            # not the guarded request, or the session would look smaller than it is (no
            # background fold would come) and the calibration would learn a false offset.
            event = _adjusted(event, unsent_tokens)
        if event.prompt_tokens == 0:
            self.unmeasured += 1
            if self.unmeasured == 1:
                log.warning("session %s: the provider reported zero prompt tokens; its size is "
                            "not measured (set measure='estimate' in its policy if that is "
                            "expected)", self.session_id)
            return False
        publisher = self.client.publisher
        if publisher is None:
            return False
        try:
            return publisher.publish(event)
        except Exception:  # the publisher never raises; belt and braces for the agent's sake
            log.warning("usage report for %s failed", self.session_id, exc_info=True)
            return False

    def fold_inline(self, *, trigger: Trigger = "overflow", target_tokens: int | None = None,
                    measured_tokens: int | None = None) -> FoldReport:
        """Fold now, on this thread, through the runtime's procedure (the inline claim wins).

        On a lost race it re-reads the session, stops if it is already under target, and
        otherwise re-plans once.
        """
        job = FoldJob(session_id=self.session_id, job_id=f"inline-{uuid.uuid4().hex}",
                      trigger=trigger, force=True, target_tokens=target_tokens,
                      measured_tokens=measured_tokens,
                      lease_s=self.client.settings.task_time_limit_s, replan=True)
        report = self.client.run_inline_fold(job)
        self.inline_folds += 1
        self.summarizer_calls += report.summarizer_calls
        self.last_fold = report
        log.info("inline %s fold of %s: %s (%s summarizer calls)", trigger, self.session_id,
                 report.outcome, report.summarizer_calls)
        return report

    # --- call(): the pieces shared by the sync and async flavours ----------------------------

    def _plan_call(self, fn: Callable[..., Any], over_budget: OverBudget | None,
                   cache_breakpoints: bool) -> tuple[CallPlan, WindowView]:
        """Read the session once: fold first if asked to and over budget, decide whether
        recall is on for ``fn`` and offered to this call; the plan and the first view."""
        choice = over_budget or self.over_budget
        if choice not in OVER_BUDGET_CHOICES:
            raise InvalidInputError(f"over_budget must be one of {list(OVER_BUDGET_CHOICES)}, "
                                    f"got {choice!r}")
        info = self.info()
        if choice == "fold" and info.policy.over_budget(info.current_tokens):
            self.fold_inline(trigger="overflow", measured_tokens=info.current_tokens)
        mode = tools_mode(fn)
        if mode == "none" and info.policy.recall and not self._told_recall_off:
            self._told_recall_off = True
            log.info("session %s: the model call takes no tools (fn(system, messages)), so "
                     "recall is off for it: take a third argument or tools= to offer "
                     "sessionfold_recall", self.session_id)
        recall = mode != "none" and info.policy.recall
        tools = [anthropic_tool()] if recall else []
        plan = CallPlan(mode=mode, recall=recall, tools=tools, policy=info.policy,
                        cache_breakpoints=cache_breakpoints, calibration=info.calibration,
                        system_tokens=info.system_tokens, extra_tokens=_tool_tokens(tools),
                        over_budget=choice)
        view = self._view(plan)
        if recall and not view.edited and info.policy.recall_offer == "edited":
            # Nothing in the request can be recalled yet: the tool's definition would ride on
            # every early request for nothing (short sessions pay it most). A request whose
            # guard ran with the tool counted is under without it too: render it again only.
            plan = dataclasses.replace(plan, recall=False, tools=[], extra_tokens=0)
            view = view_of(dataclasses.replace(self._window_of(view), items=view.items),
                           cache_breakpoints=cache_breakpoints, recall=False)
        return plan, view

    @staticmethod
    def _window_of(view: WindowView) -> Window:
        return Window(session_id=view.session_id, system=view.system, revision=view.revision,
                      items=list(view.items), chars=[])

    def _view(self, plan: CallPlan) -> WindowView:
        """The view one request sends: the stored window, through the pre-send guard and,
        under ``over_budget="cap"``/``"fold"``, the hard cap (see the module doc)."""
        window = self.store.read_window(self.session_id)
        if not plan.policy.guard:
            return self._render(window, None, plan)
        guarded = self._guard(window, plan, "clip-protected")
        if guarded.outcome == "over-budget" and plan.over_budget != "send":
            # Nothing cheap gets it under: fold on the agent's path, through the workers'
            # claim and commit (the inline claim wins over a background fold in flight), then
            # guard the folded window with every stage.
            self.cap_folds += 1
            metrics().record_guard("folded-inline")
            self.fold_inline(trigger="overflow", measured_tokens=guarded.tokens_before)
            window = self.store.read_window(self.session_id)
            guarded = self._guard(window, plan, "drop-history")
            if guarded.outcome == "over-budget":
                raise self._too_large(guarded, plan)
        if guarded.outcome == "over-budget":
            self._sent_over(guarded, plan)
        return self._render(window, guarded, plan)

    def _render(self, window: Window, guarded: GuardResult | None, plan: CallPlan) -> WindowView:
        if guarded is None or guarded.outcome == "under":
            view = view_of(window, cache_breakpoints=plan.cache_breakpoints, recall=plan.recall)
            return dataclasses.replace(view, tool_tokens=plan.extra_tokens)
        view = view_of(dataclasses.replace(window, items=guarded.items, chars=[]),
                       cache_breakpoints=plan.cache_breakpoints, recall=plan.recall)
        return dataclasses.replace(view, unsent_tokens=guarded.unsent_tokens,
                                   tool_tokens=plan.extra_tokens)

    def _guard(self, window: Window, plan: CallPlan, last_stage: GuardStage) -> GuardResult:
        """Run the pre-send guard on ``window`` (see the module doc) and count what it did."""
        result = guard_window(window.items, plan.policy, plan.calibration,
                              system_tokens=plan.system_tokens, extra_tokens=plan.extra_tokens,
                              counter=self.store.counter, originals=self._original,
                              last_stage=last_stage, recall=plan.recall)
        if result.outcome == "guarded":
            self.guarded_requests += 1
            metrics().record_guard("guarded")
            log.debug("session %s: guarded request at revision %d, %d -> %d tokens (limit %d; "
                      "%s)", self.session_id, window.revision, result.tokens_before,
                      result.tokens_after, result.limit_tokens, ", ".join(result.layers))
        return result

    def _sent_over(self, result: GuardResult, plan: CallPlan) -> None:
        """Count (and log once) a request sent over the budget under ``over_budget="send"``."""
        self.guard_over_budget += 1
        metrics().record_guard("over-budget")
        if self._told_over_budget:
            return
        self._told_over_budget = True
        log.warning("session %s: a request of about %d tokens goes out over its guard limit of "
                    "%d (budget %d, margin %.0f%%): shrunk as far as the guard may (%s), it is "
                    "still %d tokens, the largest item left #%s at %d tokens; sent so because "
                    "over_budget='send' (logged once per handle; counted in guard_over_budget)",
                    self.session_id, result.tokens_before, result.limit_tokens,
                    plan.policy.budget_tokens, plan.policy.guard_margin_ratio * 100,
                    ", ".join(result.layers) or "nothing applied", result.tokens_after,
                    result.largest_seq, result.largest_tokens)

    def _too_large(self, result: GuardResult, plan: CallPlan) -> BudgetExceededError:
        """The error of a request no shrink gets under the budget (nothing was sent)."""
        system = plan.calibration.predict(plan.system_tokens) if plan.system_tokens else 0
        if result.largest_seq is None or system >= result.largest_tokens:
            what = f"the system prompt alone is about {system} tokens"
            seq = None
        else:
            what = (f"message #{result.largest_seq} alone is about {result.largest_tokens} "
                    "tokens even clipped (assistant messages, images and binary documents "
                    "are never cut)")
            seq = result.largest_seq
        metrics().record_guard("over-budget")
        return BudgetExceededError(
            f"session {self.session_id!r}: the request is about {result.tokens_after} tokens "
            f"after every shrink the guard may make and an inline fold, over the budget of "
            f"{plan.policy.budget_tokens} (limit {result.limit_tokens}): {what}. Nothing was "
            "sent; raise budget_tokens, or pass over_budget='send' to send it anyway",
            tokens=result.tokens_after, budget_tokens=plan.policy.budget_tokens, seq=seq)

    def _original(self, seq: int) -> Message | None:
        """The ledger message at ``seq`` (None once discarded): read only when the guard masks
        or re-clips an output clipped before, so its stub names the original's size."""
        rows = self.store.read_ledger(self.session_id, seq, seq + 1)
        return rows[0].message if rows else None

    def _after_overflow(self, exc: BaseException, plan: CallPlan) -> WindowView:
        """Fold down to half the budget after the provider said "too long" (half the model's
        context window when the error names it and it is the smaller: the budget was set past
        what the model takes); the new view."""
        counted = overflow_tokens(exc)
        limit = self.info().policy.budget_tokens
        if counted is not None and 0 < counted[1] < limit:
            limit = counted[1]
        self.fold_inline(trigger="overflow", target_tokens=limit // 2,
                         measured_tokens=counted[0] if counted else None)
        return self._view(plan)

    def _recall_round(self, plan: CallPlan, response: Any, rounds: int,
                      sent: WindowView | None = None) -> WindowView | None:
        """When ``response`` asks only for recall and rounds are left: answer it, append the
        exchange (``recall=True``) and return the view to call the model with again. None:
        ``response`` is the one to return.

        ``sent``: the view the request was built from; the answers are then sized so that the
        request carrying them stays within the budget (:meth:`_answer_basis`)."""
        if not plan.recall or rounds >= plan.policy.recall_max_rounds:
            return None
        calls = tool_calls(response)
        if not asks_only_recall(calls):
            return None
        answers = self._answer(calls, self._answer_basis(plan, sent, response))
        exchange = [{"role": "assistant", "content": _content_of(response)},
                    {"role": "user", "content": [a.tool_result(c.id)
                                                 for c, a in zip(calls, answers, strict=True)]}]
        reply_id = _response_id(response)
        self._nudge_if_crossed(self.store.append(
            self.session_id, exchange, recall=True,
            key=f"recall-{reply_id}" if reply_id else None))
        self.recall_rounds += 1
        return self._view(plan)

    def _still_too_long(self, exc: BaseException) -> ContextOverflowError:
        report = self.last_fold
        outcome = f"{report.outcome}, {report.tokens_after} tokens after" if report else "none"
        return ContextOverflowError(
            f"session {self.session_id!r}: the request is still too long after an inline fold "
            f"({outcome}); the provider said: {exc}")

    def _after_call(self, response: Any, view: WindowView) -> None:
        self.calls += 1
        usage, model = _response_usage(response)
        if usage is None:
            self.unmeasured += 1
            if self.unmeasured == 1:
                log.warning("session %s: the model call returned no usage to report",
                            self.session_id)
            return
        # A guarded request is reported as the stored window's size; the recall tool's
        # definition, which the calibration leaves out, is taken off.
        self._report_usage(usage, seq=view.last_seq, revision=view.revision, model=model,
                           unsent_tokens=view.unsent_tokens - view.tool_tokens)

    def call(self, fn: ModelCall | ModelCallWithTools, *, over_budget: OverBudget | None = None,
             cache_breakpoints: bool = False) -> Any:
        """Send the window through ``fn(system, messages[, tools])``; fold inline and retry on
        overflow; answer recall-only replies from the ledger (see the module doc).

        Returns what ``fn`` returned for the last request: the first reply that is not a
        recall-only one (or the last one, after ``recall_max_rounds`` rounds). Errors of ``fn``
        other than an overflow propagate as they are; a second overflow raises
        ContextOverflowError chained to the provider's error.
        """
        plan, view = self._plan_call(fn, over_budget, cache_breakpoints)
        rounds = 0
        while True:
            response = self._send(fn, plan, view)
            next_view = self._recall_round(plan, response, rounds, view)
            if next_view is None:
                return response
            view, rounds = next_view, rounds + 1

    def _send(self, fn: Callable[..., Any], plan: CallPlan, view: WindowView) -> Any:
        """One request (and its retry after an inline fold on overflow), its usage reported."""
        try:
            response = plan.invoke(fn, view)
        except Exception as exc:
            if not is_context_overflow(exc):
                raise
            view = self._after_overflow(exc, plan)
            try:
                response = plan.invoke(fn, view)
            except Exception as again:
                if is_context_overflow(again):
                    raise self._still_too_long(again) from again
                raise
        self._after_call(response, view)
        return response


def _adjusted(event: UsageEvent, tokens: int) -> UsageEvent:
    """``event`` measuring ``tokens`` more (or fewer) prompt tokens: added to its uncached
    input, or taken from it and then from its cache reads and writes, never below 0 (only the
    prompt's total is read by the scheduler and the calibration)."""
    if tokens >= 0:
        return dataclasses.replace(event, input_tokens=event.input_tokens + tokens)
    left = -tokens
    parts = []
    for value in (event.input_tokens, event.cache_read_input_tokens,
                  event.cache_creation_input_tokens):
        take = min(value, left)
        parts.append(value - take)
        left -= take
    return dataclasses.replace(event, input_tokens=parts[0], cache_read_input_tokens=parts[1],
                               cache_creation_input_tokens=parts[2])


def _tool_tokens(tools: Sequence[Mapping[str, Any]]) -> int:
    """The estimate of the tool definitions sessionfold adds to a request (see
    :attr:`WindowView.tool_tokens`)."""
    return sum(count_text(json.dumps(tool, ensure_ascii=False)) for tool in tools)


def _block_dict(raw: Any) -> dict[str, Any]:
    """A content block the agent built (a dict, or a pydantic/SDK block) as a plain dict."""
    if isinstance(raw, Mapping):
        return dict(raw)
    dump = getattr(raw, "model_dump", None)
    if callable(dump):
        dumped = dump(mode="json", exclude_none=True)
        if isinstance(dumped, dict):
            return dumped
    raise InvalidInputError(f"a tool result is a content block (an object), got "
                            f"{type(raw).__name__}")

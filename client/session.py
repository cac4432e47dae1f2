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
  to the provider's error. These steps, and the recall rounds below, are the call loop's
  (:mod:`.call_loop`, written once without the model call); ``call()`` is its blocking adapter,
  and the handle does the store and bus work the loop asks for.
- **The budget is a hard cap** (:mod:`sessionfold.core.guard`, :mod:`.request_guard`): before
  each request of ``call()`` (its recall rounds, its retry after an overflow, and the SDK
  wrappers' requests, which go through the same loop) the handle estimates the request with the
  session's calibration. Past the budget less the policy's ``guard_margin_ratio`` the
  background fold is late, and under ``over_budget="cap"`` (the default) the handle folds
  inline (trigger ``overflow``, counted in :attr:`SessionHandle.cap_folds`) through the workers'
  commit path, then guards the folded window: what is still over is shrunk on the request
  alone, by the cheap layers (clip, drop recall exchanges, mask old tool output, drop
  thinking), then the user messages inside the protected turns clipped (the newest last), then
  the older history left out; a request still over after that is one message (or the system
  prompt) that cannot fit, and :class:`BudgetExceededError` says which, before anything is
  sent. The guard is deterministic, so the same window is sent as the same bytes again.
  ``"shrink"`` sends the request-only shrink whenever it fits (no summarizer call on the
  agent's path; folding inline only when it does not fit); ``"send"`` sends the best shrink
  even when it is over (counted in :attr:`SessionHandle.guard_over_budget`, logged once);
  ``"fold"`` also folds inline before the request whenever the stored window is past the
  budget. Paused sessions are guarded too; ``FoldPolicy(guard=False)`` opts out (and so
  sends over). A guarded request's usage is reported as the stored window's (the provider's
  count plus what the guard left out), so the scheduler and the calibration still see the
  session's true size and the background fold comes.
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

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sessionfold.core.errors import InvalidInputError, InvalidMessageError
from sessionfold.core.messages import Message, parse_message
from sessionfold.core.window import FoldedSpan, Trigger, WindowItem
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport
from sessionfold.runtime.metrics import metrics
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.store import AppendResult, LedgerEntry, SessionInfo, SessionStore

from .call_loop import CallLoop, ReturnReply
from .call_plan import CallPlan, OverBudget, check_over_budget, tool_tokens
from .model_call import ModelCall, ModelCallWithTools, invoke, tools_mode
from .recall import (
    RecallAnswer,
    RecallRequest,
    ToolCall,
    answer,
    anthropic_tool,
    parse_seq,
    tool_calls,
)
from .recall_round import answer_basis, answer_calls, recall_exchange, reply_id
from .request_guard import RequestGuard
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
from .usage_report import response_usage, with_prompt_tokens
from .window_view import WindowView, rendered, view_of

__all__ = ["Connection", "SessionHandle"]

log = logging.getLogger(__name__)


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

    def await_window_change(self, session_id: str, revision: int, tokens: int,
                            timeout_s: float) -> bool:
        """Wait for the background fold on its way to move the window past ``revision``."""
        ...


class SessionHandle:
    """One session seen by an agent or an app server. Use one handle per agent thread."""

    def __init__(self, client: Connection, session_id: str, *,
                 over_budget: OverBudget = "cap", hold_tool_results: bool = True) -> None:
        self.client = client
        self.session_id = session_id
        self.over_budget: OverBudget = check_over_budget(over_budget)
        #: Hold a partial set of tool results until the rest arrives (see append()); False:
        #: the store refuses it (tool-pairing), for a caller that keeps nothing between appends.
        self.hold_tool_results = hold_tool_results
        #: Summarizer calls this handle made on the agent's path (inline folds).
        self.summarizer_calls = 0
        self.inline_folds = 0
        #: Requests past the guard's line that waited for the background fold on its way, and
        #: the seconds they waited (:meth:`await_background_fold`).
        self.fold_waits = 0
        self.fold_wait_s = 0.0
        #: Model calls made through :meth:`call`, and usage reports that found no usage.
        self.calls = 0
        self.unmeasured = 0
        self.last_fold: FoldReport | None = None
        #: Recall requests this handle answered (in call() and through its helpers), and the
        #: extra model calls call() made to answer them (one per round).
        self.recall_calls = 0
        self.recall_rounds = 0
        #: The answers of the latest recall this handle made (a round, a helper call), in
        #: order: what the HTTP API reports of a step (kept short: only the latest).
        self.last_recall: list[RecallAnswer] = []
        self._told_recall_off = False
        #: Nudges published after appends.
        self.nudges = 0
        #: The pre-send guard and hard cap of this handle's requests (and their counts).
        self._requests = RequestGuard(self)
        #: Tool results answering part of the ledger tail's open calls (see append()).
        self._held: HeldToolResults | None = None

    def __repr__(self) -> str:
        return f"SessionHandle({self.session_id!r})"

    @property
    def guarded_requests(self) -> int:
        """Requests the pre-send guard shrank."""
        return self._requests.guarded_requests

    @property
    def guard_over_budget(self) -> int:
        """Requests the guard could not bring under the budget (sent over only with
        ``over_budget="send"``)."""
        return self._requests.guard_over_budget

    @property
    def cap_folds(self) -> int:
        """Inline folds the hard cap made (also counted in ``inline_folds``)."""
        return self._requests.cap_folds

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
        """Answer recall ``calls`` in order, sized together (:func:`~.recall_round.answer_calls`;
        ``info``: the session with the size to size them by, read when not given). Counted."""
        answers = answer_calls(self.store, self.session_id, calls, info or self.info(),
                               self.store.counter)
        self._count_recall(answers)
        return answers

    def _count_recall(self, answers: Sequence[RecallAnswer]) -> None:
        self.recall_calls += len(answers)
        self.last_recall = list(answers)
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
            event = with_prompt_tokens(event, unsent_tokens)
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
                    measured_tokens: int | None = None,
                    if_revision: int | None = None) -> FoldReport:
        """Fold now, on this thread, through the runtime's procedure (the inline claim wins).

        On a lost race it re-reads the session, stops if it is already under target, and
        otherwise re-plans once. ``if_revision``: fold only the window at that revision (what
        ``measured_tokens`` measured); one a fold replaced since is left as it is (outcome
        ``stale``), for the caller to measure again.
        """
        job = FoldJob(session_id=self.session_id, job_id=f"inline-{uuid.uuid4().hex}",
                      trigger=trigger, force=True, target_tokens=target_tokens,
                      measured_tokens=measured_tokens, if_revision=if_revision,
                      lease_s=self.client.settings.task_time_limit_s, replan=True)
        report = self.client.run_inline_fold(job)
        self.inline_folds += 1
        self.summarizer_calls += report.summarizer_calls
        self.last_fold = report
        log.info("inline %s fold of %s: %s (%s summarizer calls)", trigger, self.session_id,
                 report.outcome, report.summarizer_calls)
        return report

    def await_background_fold(self, revision: int, tokens: int) -> bool:
        """Wait (at most the settings' ``guard_wait_s``) for the background fold on its way to
        land on the window read at ``revision``, for a request of ``tokens``; True if the
        window moved. Counted in :attr:`fold_waits` and :attr:`fold_wait_s` (see
        :mod:`.request_guard`)."""
        started = time.monotonic()
        moved = self.client.await_window_change(self.session_id, revision, tokens,
                                                self.client.settings.guard_wait_s)
        self.fold_waits += 1
        self.fold_wait_s += time.monotonic() - started
        if moved:
            metrics().record_guard("waited")
        return moved

    # --- call(): the sync adapter of the call loop, and the loop's session side ---------------

    def open_call(self, *, takes_tools: bool = True, over_budget: OverBudget | None = None,
                  cache_breakpoints: bool = False) -> CallLoop:
        """A :class:`~.call_loop.CallLoop` for one call on this session, not started: what
        :meth:`call`, the async handle and the SDK wrappers' streams drive. ``takes_tools``:
        the model call is given the tools sessionfold adds (else recall is off for it)."""
        return CallLoop.open(self, takes_tools=takes_tools, over_budget=over_budget,
                             cache_breakpoints=cache_breakpoints)

    def call(self, fn: ModelCall | ModelCallWithTools, *, over_budget: OverBudget | None = None,
             cache_breakpoints: bool = False) -> Any:
        """Send the window through ``fn(system, messages[, tools])``; fold inline and retry on
        overflow; answer recall-only replies from the ledger (see the module doc).

        Returns what ``fn`` returned for the last request: the first reply that is not a
        recall-only one (or the last one, after ``recall_max_rounds`` rounds). Errors of ``fn``
        other than an overflow propagate as they are; a second overflow raises
        ContextOverflowError chained to the provider's error.
        """
        mode = tools_mode(fn)
        loop = self.open_call(takes_tools=mode != "none", over_budget=over_budget,
                              cache_breakpoints=cache_breakpoints)
        step = loop.start()
        while True:
            try:
                reply = invoke(fn, mode, step)
            except Exception as exc:
                step = loop.retry(exc)
                continue
            done = loop.replied(reply)
            if isinstance(done, ReturnReply):
                return done.reply
            step = done

    # The loop's session side (:class:`~.call_loop.CallSession`): store and bus work, no model.

    def plan_call(self, *, takes_tools: bool, over_budget: OverBudget | None,
                  cache_breakpoints: bool) -> CallPlan:
        """Read the session once and plan one call: the over-budget choice, and whether
        recall is on for it (the model call takes the tools and the policy has recall on)."""
        choice = check_over_budget(over_budget or self.over_budget)
        info = self.info()
        if not takes_tools and info.policy.recall and not self._told_recall_off:
            self._told_recall_off = True
            log.info("session %s: the model call takes no tools (fn(system, messages)), so "
                     "recall is off for it: take a third argument or tools= to offer "
                     "sessionfold_recall", self.session_id)
        recall = takes_tools and info.policy.recall
        tools = [anthropic_tool()] if recall else []
        return CallPlan(recall=recall, tools=tools, policy=info.policy,
                        cache_breakpoints=cache_breakpoints, calibration=info.calibration,
                        system_tokens=info.system_tokens, extra_tokens=tool_tokens(tools),
                        over_budget=choice, current_tokens=info.current_tokens)

    def request_view(self, plan: CallPlan) -> WindowView:
        """The view one request sends: the stored window through the pre-send guard and the
        hard cap (:mod:`.request_guard`)."""
        return self._requests.view(plan)

    def request_tokens(self, plan: CallPlan, view: WindowView) -> int:
        """The estimate of the request ``view`` as sent: the system prompt, the items as
        rendered (with their recall hints), the tools sessionfold adds."""
        counter = self.store.counter
        return plan.system_tokens + plan.extra_tokens + sum(
            counter.message(rendered(item, recall=view.recall)) for item in view.items)

    def report_reply(self, reply: Any, *, seq: int, revision: int, unsent_tokens: int) -> None:
        """Count one model call of :meth:`call` and publish its usage (see
        :meth:`_report_usage` for ``unsent_tokens``)."""
        self.calls += 1
        usage, model = response_usage(reply)
        if usage is None:
            self.unmeasured += 1
            if self.unmeasured == 1:
                log.warning("session %s: the model call returned no usage to report",
                            self.session_id)
            return
        self._report_usage(usage, seq=seq, revision=revision, model=model,
                           unsent_tokens=unsent_tokens)

    def answer_round(self, plan: CallPlan, reply: Any, calls: Sequence[ToolCall],
                     sent_tokens: int | None) -> None:
        """Answer a recall-only ``reply`` from the ledger, sized by the request that carried
        it (:mod:`.recall_round`), and append the exchange with ``recall=True``."""
        basis = answer_basis(self.info(), plan, sent_tokens, reply, self.store.counter)
        answers = self._answer(calls, basis)
        key = reply_id(reply)
        self._nudge_if_crossed(self.store.append(
            self.session_id, recall_exchange(reply, calls, answers), recall=True,
            key=f"recall-{key}" if key else None))
        self.recall_rounds += 1


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

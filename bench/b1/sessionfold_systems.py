"""sessionfold in B1, in process: ``sessionfold.core.compact.fold_window`` on a ledger + window.

Two systems (``-inprocess``, beside the pipeline's in :mod:`b1.pipeline_systems`), one engine,
one policy (``FoldPolicy(budget_tokens=budget)``: trigger 0.85, target 0.6, keep 4 turns,
layers mask-tool-results → drop-thinking → summarize, clip-oversized on append):

- ``sessionfold-inline-inprocess``: before each call, if the window is over the trigger, fold
  it there (the agent waits for the summarizer, like the peers do).
- ``sessionfold-background-inprocess``: after each call the usage is "reported"; over the
  trigger, a fold starts on a real thread of its own from a snapshot of the window, and its edit
  is committed onto the window as it stands when the fold finishes -- the agent has appended
  and called in the meantime and never waited. The commit is the store's: the items the fold
  planned on must still be there (appends only add after them), they are replaced, later items
  are untouched. Past the budget the agent sends anyway (the client's ``over_budget="send"``);
  only a request over the model's context window (200 k) would fold inline (forced, to half
  the budget), as the client's overflow fallback does.

This is the *in-process* path: no Redis, Celery or database, so it measures the fold engine and
the background timing, not the pipeline's own overheads (``bench/RESULTS.md`` says which path
produced each table).

The summarizer is sessionfold's real ``AnthropicSummarizer`` (its real prompt, markers and usage
parsing) talking through ``httpx2.MockTransport`` to the shared fake summarizer: at most 300
tokens, the identifiers the request asks it to keep (``must_keep``) listed first within that cap
(a span denser in identifiers than that loses some, as it would with a model).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import httpx2
from sessionfold.cli.standin.batches import BatchDesk
from sessionfold.core.clip import clip_oversized
from sessionfold.core.compact import FoldResult, FoldVisit, fold_window
from sessionfold.core.messages import Message, parse_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import FoldEdit, Trigger, WindowItem
from sessionfold.runtime.providers.anthropic import AnthropicSummarizer
from sessionfold.runtime.providers.prompt import PromptParts, parse_prompt

from .counting import Counter, Request
from .fakes import FakeSummarizer
from .replay import Env
from .transcripts import Transcript

__all__ = [
    "CONTEXT_WINDOW",
    "SessionfoldBackground",
    "SessionfoldInline",
    "batch_desk",
    "describe_policy",
    "fake_summarizer",
    "make_policy",
    "messages_api_reply",
    "summarizer_material",
]

#: The scripted model's context window: a request over it would be rejected (overflow).
CONTEXT_WINDOW = 200_000
SUMMARIZER_MODEL = "b1-fake-summarizer"


def _prompt(content: str) -> PromptParts:
    parts = parse_prompt(content)
    if parts is None:
        raise ValueError("no transcript block in the summarizer prompt: is this a request of "
                         "sessionfold's summarizer?")
    return parts


def summarizer_material(content: str) -> str:
    """The conversation in the user message of sessionfold's summarizer: the previous summary
    and the transcript, between their nonce markers (the instruction and the must-keep list
    around them are not material), read by the prompt's own parser."""
    return _prompt(content).material


def messages_api_reply(fake: FakeSummarizer, body: Mapping[str, Any], *,
                       batch: bool = False) -> dict[str, Any]:
    """The Messages API answer of the fake summarizer to a ``messages.create`` body: the digest
    of the material, the identifiers the request asks it to keep (``must_keep``) listed first
    -- as a model following the instruction would -- but all within the digest's 300-token cap:
    a span denser in identifiers than a summary can hold loses some, as it would with a model.
    ``batch``: the body came in a Message Batch (the call is billed at the batch rate)."""
    content = "\n\n".join(str(m["content"]) for m in body["messages"])
    prompt = "\n\n".join([str(body.get("system", "")), content])
    parts = _prompt(content)
    text = fake.summarize(prompt, parts.material, must_keep=list(parts.must_keep), batch=batch)
    return {"id": "msg_b1", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": fake.counter.text(prompt, cache=False),
                      "output_tokens": fake.counter.text(text, cache=False)}}


def fake_summarizer(fake: FakeSummarizer, *,
                    batches: BatchDesk | None = None) -> AnthropicSummarizer:
    """sessionfold's own summarizer, answered by the shared fake through a mock transport.

    ``batches``: Message Batches as well, served by the stand-in's batch desk (made with
    :func:`batch_desk`), whose batched requests the fake answers as batch calls."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        if batches is not None and batches.owns(request.url.path):
            answer = batches.handle(request.method, request.url.path, request.content,
                                    request.headers.get("content-type"))
            return httpx2.Response(answer.status, content=answer.content,
                                   headers={"content-type": answer.content_type})
        return httpx2.Response(200, json=messages_api_reply(fake, json.loads(request.content)))

    return AnthropicSummarizer(api_key="b1-fake", base_url="http://b1.invalid",
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
                               model=SUMMARIZER_MODEL)


def batch_desk(fake: FakeSummarizer, *, delay_s: float,
               clock: Callable[[], float]) -> BatchDesk:
    """The stand-in's batch APIs in front of the fake summarizer: a batch ends ``delay_s`` (on
    ``clock``) after it was sent, its requests answered then as batch calls."""

    def answer(path: str, body: Mapping[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        return 200, {}, messages_api_reply(fake, body, batch=True)

    return BatchDesk(answer, delay_s=delay_s, clock=clock)


def _commit(items: list[WindowItem], edit: FoldEdit) -> list[WindowItem]:
    """The store's commit, in memory: the planned items must all still be there."""
    replaced = {id(item) for item in edit.replaced}
    present = {id(item) for item in items}
    if not replaced <= present:
        raise RuntimeError("a fold's planned items changed under it (no concurrent fold runs)")
    kept = [item for item in items if id(item) not in replaced]
    return sorted([*kept, *edit.inserted], key=lambda item: item.start_seq)


class _Session:
    """A ledger and its window, with the fold engine; ``background`` picks when folds run."""

    def __init__(self, transcript: Transcript, policy: FoldPolicy, env: Env, *,
                 background: bool) -> None:
        self.system = transcript.system
        self.policy = policy
        self.summarizer = fake_summarizer(env.summarizer)
        self.counter: Counter = env.counter
        self.background = background
        self.ledger: list[Message] = []
        self.items: list[WindowItem] = []
        self.latched: set[str] = set()
        # Guards ``items`` and ``latched``: the fold thread commits while the agent appends.
        self.lock = threading.Lock()
        self.fold: threading.Thread | None = None
        self.error: BaseException | None = None

    # --- the agent's side ---------------------------------------------------------------------

    def append(self, raw: Mapping[str, Any]) -> None:
        seq = len(self.ledger)
        message = parse_message(dict(raw), seq)
        self.ledger.append(message)
        item = clip_oversized(WindowItem(start_seq=seq, end_seq=seq, message=message), None,
                              self.policy.max_item_tokens)
        with self.lock:
            self.items.append(item)

    def request(self) -> Request:
        self._raise_fold_error()
        if not self.background:
            self._visit(trigger="threshold")
        request = self._request()
        if self.counter.request(request) > CONTEXT_WINDOW:
            # The provider would reject it: the client folds inline (forced) and retries once.
            self._wait_for_fold()
            self._visit(trigger="overflow", force=True, target=self.policy.budget_tokens // 2)
            request = self._request()
        return request

    def reported(self, request: Request, tokens: int) -> None:
        if not self.background or tokens <= self.policy.trigger_tokens:
            return
        if self.fold is not None and self.fold.is_alive():
            return  # one fold in flight per session (the scheduler's lock)
        self.fold = threading.Thread(target=self._fold_in_background, name="b1-fold",
                                     daemon=True)
        self.fold.start()

    def finish(self) -> None:
        self._wait_for_fold()
        self._raise_fold_error()

    def retained(self) -> list[dict[str, Any]]:
        return [m.to_json() for m in self.ledger]

    # --- folding ------------------------------------------------------------------------------

    def _request(self) -> Request:
        with self.lock:
            items = list(self.items)
        return Request(self.system, [item.message.to_json() for item in items])

    def _visit(self, *, trigger: Trigger, force: bool = False,
               target: int | None = None) -> None:
        with self.lock:
            snapshot, latched = list(self.items), set(self.latched)
        result: FoldResult = fold_window(snapshot, FoldVisit(self.policy, self.summarizer,
                                         system=self.system, trigger=trigger, force=force,
                                         target_tokens=target, latched=latched))
        with self.lock:
            self.latched.update(r.fingerprint for r in result.record.refusals
                                if r.fingerprint is not None)
            if result.changed:
                self.items = _commit(self.items, result.edit)

    def _fold_in_background(self) -> None:
        try:
            self._visit(trigger="threshold")
        except BaseException as exc:  # surfaced on the agent's next call, never swallowed
            self.error = exc

    def _wait_for_fold(self) -> None:
        if self.fold is not None:
            self.fold.join()

    def _raise_fold_error(self) -> None:
        if self.error is not None:
            raise RuntimeError("a background fold failed") from self.error


def make_policy(budget: int, overrides: Mapping[str, Any]) -> FoldPolicy:
    """The policy every sessionfold system runs with: the defaults, or ``--policy`` overrides."""
    return FoldPolicy(budget_tokens=budget, **dict(overrides))


def describe_policy(policy: FoldPolicy, overrides: Mapping[str, Any]) -> str:
    named = ", ".join(f"{k}={v}" for k, v in overrides.items())
    return (f"FoldPolicy(budget_tokens={policy.budget_tokens}{', ' + named if named else ''}) "
            f"[trigger {policy.trigger_tokens}, target {policy.target_tokens}, keep "
            f"{policy.keep_recent_turns} turns, clip over {policy.max_item_tokens}]")


class SessionfoldInline:
    name = "sessionfold-inline-inprocess"

    def __init__(self, overrides: Mapping[str, Any] | None = None) -> None:
        self.overrides = dict(overrides or {})

    def describe(self, budget: int) -> str:
        policy = make_policy(budget, self.overrides)
        return ("in-process fold_window before the call when over the trigger, "
                + describe_policy(policy, self.overrides))

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript, make_policy(budget, self.overrides), env, background=False)


class SessionfoldBackground:
    name = "sessionfold-background-inprocess"

    def __init__(self, overrides: Mapping[str, Any] | None = None) -> None:
        self.overrides = dict(overrides or {})

    def describe(self, budget: int) -> str:
        policy = make_policy(budget, self.overrides)
        return ("in-process fold_window on a background thread after an over-trigger usage "
                "report, " + describe_policy(policy, self.overrides))

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        return _Session(transcript, make_policy(budget, self.overrides), env, background=True)

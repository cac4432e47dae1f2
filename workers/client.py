"""The client that agents and app servers use: turns in, usage out, compacted windows back.

::

    client = connect()                         # settings from the environment (embedded defaults)
    agent = client.session("agent-7", policy=FoldPolicy(budget_tokens=64_000), system=SYSTEM)
    agent.append([{"role": "user", "content": task}], key="task")
    reply = agent.call(lambda system, messages: anthropic_client.messages.create(
        model=MODEL, max_tokens=4096, system=system, messages=messages))
    agent.append([{"role": "assistant", "content": reply.content}], key="turn-1")

    view = client.session("agent-7").window()  # an app server: the window as it stands now

What each part promises:

- :meth:`SessionHandle.window` reads the already-compacted window from the store (one indexed
  query). It never waits for a fold: folds run in the background and land between calls.
- :meth:`SessionHandle.report_usage` publishes the provider's counts on the usage bus for the
  scheduler. It never blocks for long and never raises: with Redis away the publisher buffers a
  little, warns, and the scheduler's store sweep covers what is lost.
- :meth:`SessionHandle.call` sends the window through ``fn(system, messages)``, reports the
  usage, and when the provider rejects the request as too long
  (:func:`~sessionfold.core.overflow.is_context_overflow`) folds inline — trigger ``overflow``,
  forced, down to half the budget, through the same claim/commit procedure as the workers
  (:mod:`.folding`), where the inline claim wins over a background fold in flight — and retries
  once. A second overflow raises :class:`ContextOverflowError` chained to the provider's error.
  Within the budget it never waits on a summarizer; past the budget it sends anyway
  (``over_budget="send"``, the default: a background fold is on its way) or folds inline first
  (``over_budget="fold"``).
- Summarizer calls made on the agent's path (inline folds) are counted, per handle and per
  client: in a healthy pipeline they stay at zero.

:class:`AsyncClient` / :class:`AsyncSessionHandle` are the asyncio flavour: the blocking store
calls run in a thread (``asyncio.to_thread``) and ``fn`` is awaited.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sessionfold.core.errors import (
    ContextOverflowError,
    InvalidInputError,
    RedisUnavailableError,
    SessionNotFoundError,
)
from sessionfold.core.messages import Message
from sessionfold.core.overflow import is_context_overflow, overflow_tokens
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import Summarizer
from sessionfold.core.window import FoldedSpan, Trigger, WindowItem
from sessionfold.store import AppendResult, LedgerEntry, SessionInfo, SessionStore

from .folding import FoldJob, FoldReport, make_summarizer, run_fold
from .redis_conn import EmbeddedRedis
from .usagebus import UsageEvent, UsagePublisher

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "AsyncClient",
    "AsyncSessionHandle",
    "Client",
    "OverBudget",
    "SessionHandle",
    "WindowView",
    "connect",
    "database_url_for",
    "place_cache_breakpoints",
]

log = logging.getLogger(__name__)

OverBudget = Literal["send", "fold"]
#: ``fn(system, messages)``: one model call; returns the provider's response (with ``.usage``).
ModelCall = Callable[[str, list[dict[str, Any]]], Any]
AsyncModelCall = Callable[[str, list[dict[str, Any]]], Awaitable[Any]]

_CACHE_CONTROL = {"type": "ephemeral"}
# Blocks the Messages API does not let carry cache_control.
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class WindowView:
    """A session's window as read: ready to send, with what a usage report must name.

    ``messages`` are JSON (Anthropic shape) for the SDK; ``revision`` and ``last_seq`` (the
    highest ledger seq in the window, -1 when empty) go into the usage report of a call built
    from this view.
    """

    session_id: str
    system: str
    revision: int
    last_seq: int
    messages: list[dict[str, Any]]
    items: list[WindowItem] = field(repr=False)

    @property
    def tokens(self) -> int:
        """Estimate of the items (uncalibrated, system prompt excluded)."""
        return sum(item.tokens or 0 for item in self.items)


def place_cache_breakpoints(messages: Sequence[Mapping[str, Any]],
                            head: int) -> list[dict[str, Any]]:
    """Copies of ``messages`` with ``cache_control`` after message ``head`` and after the last.

    ``head`` ends the stable head of the window (the task and the summary that leads the folded
    history): it is unchanged until the next fold. The marker on the last message caches the
    growing conversation from call to call; the head marker still hits when more than the
    provider's look-back of blocks was appended between two calls. The marker goes on the last
    block that may carry one (not on thinking blocks). Inputs are not modified.
    """
    out = [dict(m) for m in messages]
    for index in sorted({head, len(out) - 1}):
        if 0 <= index < len(out):
            out[index] = _with_marker(out[index])
    return out


def _with_marker(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        blocks = [dict(b) if isinstance(b, Mapping) else b for b in content]
    else:
        return message
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if isinstance(block, dict) and block.get("type") not in _UNCACHEABLE:
            blocks[i] = {**block, "cache_control": dict(_CACHE_CONTROL)}
            return {**message, "content": blocks}
    return message


def _stable_head(items: Sequence[WindowItem]) -> int:
    """Index of the last item of the stable head: the last summary/notice, else the first item."""
    last_folded = max((i for i, item in enumerate(items) if item.kind != "message"), default=0)
    return last_folded


def _view(window: Any, *, cache_breakpoints: bool) -> WindowView:
    items = list(window.items)
    messages = [item.message.to_json() for item in items]
    if cache_breakpoints and messages:
        messages = place_cache_breakpoints(messages, _stable_head(items))
    return WindowView(session_id=window.session_id, system=window.system,
                      revision=window.revision, last_seq=items[-1].end_seq if items else -1,
                      messages=messages, items=items)


def _response_usage(response: Any) -> tuple[Any, str | None]:
    """``(usage, model)`` of a provider response: an SDK object or a dict."""
    if isinstance(response, Mapping):
        return response.get("usage"), response.get("model")
    return getattr(response, "usage", None), getattr(response, "model", None)


class Client:
    """A connection to one sessionfold deployment: the store, the usage bus, a summarizer.

    Thread-safe; share one per process. ``summarizer`` (for inline folds) defaults to the one
    the settings name, made on first use.
    """

    def __init__(self, settings: Settings, store: SessionStore,
                 publisher: UsagePublisher | None, *, redis_url: str | None = None,
                 summarizer: Summarizer | None = None,
                 embedded: EmbeddedRedis | None = None) -> None:
        self.settings = settings
        self.store = store
        self.publisher = publisher
        #: The Redis the usage bus is on (an embedded server's socket URL without REDIS_URL).
        self.redis_url = redis_url or settings.redis_url
        self._summarizer = summarizer
        self._embedded = embedded
        self._lock = threading.Lock()
        self._summarizer_calls = 0
        self._inline_folds = 0

    def __repr__(self) -> str:
        return f"Client({self.store!r})"

    @property
    def summarizer(self) -> Summarizer:
        with self._lock:
            if self._summarizer is None:
                self._summarizer = make_summarizer(self.settings)
            return self._summarizer

    @property
    def summarizer_calls(self) -> int:
        """Summarizer calls made on agents' paths (inline folds) through this client."""
        return self._summarizer_calls

    @property
    def inline_folds(self) -> int:
        return self._inline_folds

    def session(self, session_id: str, policy: FoldPolicy | None = None,
                system: str | None = None, *, over_budget: OverBudget = "send") -> SessionHandle:
        """A handle on one session; with ``policy`` it is created when absent.

        An existing session takes a new ``policy`` if one is given. Its system prompt is fixed at
        creation: a different ``system`` raises InvalidInputError rather than silently sending
        the old one. Without ``policy`` an absent session raises SessionNotFoundError.
        """
        if over_budget not in ("send", "fold"):
            raise InvalidInputError(f"over_budget must be 'send' or 'fold', got {over_budget!r}")
        try:
            info = self.store.get_session(session_id)
        except SessionNotFoundError:
            if policy is None:
                raise SessionNotFoundError(
                    f"no session {session_id!r}; pass policy= to create it") from None
            info = self.store.create_session(session_id, policy, system or "", exist_ok=True)
        else:
            if policy is not None and policy != info.policy:
                self.store.set_policy(session_id, policy)
        if system is not None and system != info.system:
            raise InvalidInputError(
                f"session {session_id!r} exists with another system prompt; a session's system "
                "prompt is fixed when it is created")
        return SessionHandle(self, session_id, over_budget=over_budget)

    def _count_inline(self, report: FoldReport) -> None:
        with self._lock:
            self._inline_folds += 1
            self._summarizer_calls += report.summarizer_calls

    def close(self) -> None:
        """Flush buffered usage, close connections, stop an embedded Redis this client started."""
        if self.publisher is not None:
            self.publisher.close()
        self.store.close()
        if self._embedded is not None:
            self._embedded.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionHandle:
    """One session seen by an agent or an app server. Use one handle per agent thread."""

    def __init__(self, client: Client, session_id: str, *,
                 over_budget: OverBudget = "send") -> None:
        self.client = client
        self.session_id = session_id
        self.over_budget: OverBudget = over_budget
        #: Summarizer calls this handle made on the agent's path (inline folds).
        self.summarizer_calls = 0
        self.inline_folds = 0
        #: Model calls made through :meth:`call`, and usage reports that found no usage.
        self.calls = 0
        self.unmeasured = 0
        self.last_fold: FoldReport | None = None

    def __repr__(self) -> str:
        return f"SessionHandle({self.session_id!r})"

    @property
    def store(self) -> SessionStore:
        return self.client.store

    def info(self) -> SessionInfo:
        return self.store.get_session(self.session_id)

    def append(self, turns: Sequence[Message | Mapping[str, Any]], *,
               key: str | None = None) -> AppendResult:
        """Append messages to the ledger and the window; a retried ``key`` is not appended twice."""
        return self.store.append(self.session_id, list(turns), key=key)

    def window(self, *, cache_breakpoints: bool = False) -> WindowView:
        """The window as it stands (already compacted); never waits for a fold."""
        return _view(self.store.read_window(self.session_id),
                     cache_breakpoints=cache_breakpoints)

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
        try:
            event = UsageEvent.from_usage(self.session_id, usage, seq=seq, revision=revision,
                                          model=model)
        except Exception as exc:  # a malformed report must not fail the agent's turn
            log.warning("usage report for %s not sent: %s", self.session_id, exc)
            return False
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
        """Fold now, on this thread, through the workers' procedure (the inline claim wins).

        On a lost race it re-reads the session, stops if it is already under target, and
        otherwise re-plans once.
        """
        job = FoldJob(session_id=self.session_id, job_id=f"inline-{uuid.uuid4().hex}",
                      trigger=trigger, force=True, target_tokens=target_tokens,
                      measured_tokens=measured_tokens,
                      lease_s=self.client.settings.task_time_limit_s, replan=True)
        report = run_fold(self.store, self.client.summarizer, job)
        self.inline_folds += 1
        self.summarizer_calls += report.summarizer_calls
        self.last_fold = report
        self.client._count_inline(report)
        log.info("inline %s fold of %s: %s (%s summarizer calls)", trigger, self.session_id,
                 report.outcome, report.summarizer_calls)
        return report

    # --- call(): the pieces shared by the sync and async flavours ----------------------------

    def _before_call(self, over_budget: OverBudget | None, cache_breakpoints: bool) -> WindowView:
        mode = over_budget or self.over_budget
        if mode == "fold":
            info = self.info()
            if info.current_tokens > info.policy.budget_tokens:
                self.fold_inline(trigger="overflow", measured_tokens=info.current_tokens)
        return self.window(cache_breakpoints=cache_breakpoints)

    def _after_overflow(self, exc: BaseException, cache_breakpoints: bool) -> WindowView:
        """Fold down to half the budget after the provider said "too long"; the new view."""
        counted = overflow_tokens(exc)
        budget = self.info().policy.budget_tokens
        self.fold_inline(trigger="overflow", target_tokens=budget // 2,
                         measured_tokens=counted[0] if counted else None)
        return self.window(cache_breakpoints=cache_breakpoints)

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
        self.report_usage(usage, seq=view.last_seq, revision=view.revision, model=model)

    def call(self, fn: ModelCall, *, over_budget: OverBudget | None = None,
             cache_breakpoints: bool = False) -> Any:
        """Send the window through ``fn(system, messages)``; fold inline and retry on overflow.

        Returns what ``fn`` returned. Errors of ``fn`` other than an overflow propagate as they
        are; a second overflow raises ContextOverflowError chained to the provider's error.
        """
        view = self._before_call(over_budget, cache_breakpoints)
        try:
            response = fn(view.system, view.messages)
        except Exception as exc:
            if not is_context_overflow(exc):
                raise
            view = self._after_overflow(exc, cache_breakpoints)
            try:
                response = fn(view.system, view.messages)
            except Exception as again:
                if is_context_overflow(again):
                    raise self._still_too_long(again) from again
                raise
        self._after_call(response, view)
        return response


def database_url_for(settings: Settings) -> str:
    """``DATABASE_URL``, else the embedded SQLite file ``<data dir>/sessionfold.db``.

    The same file ``sessionfold up`` runs the pipeline on, wherever the data dir is.
    """
    return settings.database_url or f"sqlite:///{settings.data_dir / 'sessionfold.db'}"


def connect(settings: Settings | None = None, *, migrate: bool | None = None) -> Client:
    """A :class:`Client` for the deployment the settings (default: the environment) name.

    Without ``REDIS_URL`` it uses the embedded Redis server of the data dir (attaching to one
    that runs, starting one otherwise); without ``DATABASE_URL`` the SQLite store. ``migrate``:
    apply the store's migrations (default: only for SQLite, the embedded case; PostgreSQL is
    migrated by ``sessionfold migrate``). If Redis cannot be reached the client still works;
    usage reports are then buffered and dropped, with a warning.
    """
    if settings is None:
        from .settings import Settings

        settings = Settings()
    store = SessionStore.from_url(database_url_for(settings))
    if migrate is None:
        migrate = store.engine.dialect.name == "sqlite"
    if migrate:
        store.migrate()
    else:
        store.check_schema()
    url = settings.redis_url
    embedded: EmbeddedRedis | None = None
    if not url:
        embedded = EmbeddedRedis(settings.data_dir / "redis")
        try:
            url = embedded.start()
        except RedisUnavailableError as exc:
            log.warning("no usage bus: %s; usage reports will be dropped", exc)
            embedded = None
    publisher = UsagePublisher.from_settings(settings, url) if url else None
    if embedded is not None and not embedded.owned:
        embedded = None  # attached to another process's server: not ours to stop
    return Client(settings, store, publisher, redis_url=url, embedded=embedded)


# --- asyncio ---------------------------------------------------------------------------------

class AsyncClient:
    """The asyncio flavour of :class:`Client`: blocking store work runs in a thread."""

    def __init__(self, client: Client) -> None:
        self.sync = client

    @classmethod
    async def connect(cls, settings: Settings | None = None, *,
                      migrate: bool | None = None) -> AsyncClient:
        return cls(await asyncio.to_thread(connect, settings, migrate=migrate))

    @property
    def summarizer_calls(self) -> int:
        return self.sync.summarizer_calls

    async def session(self, session_id: str, policy: FoldPolicy | None = None,
                      system: str | None = None, *,
                      over_budget: OverBudget = "send") -> AsyncSessionHandle:
        handle = await asyncio.to_thread(self.sync.session, session_id, policy, system,
                                         over_budget=over_budget)
        return AsyncSessionHandle(handle)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSessionHandle:
    """The asyncio flavour of :class:`SessionHandle` (``fn`` of :meth:`call` is awaited)."""

    def __init__(self, handle: SessionHandle) -> None:
        self.sync = handle
        self.session_id = handle.session_id

    @property
    def summarizer_calls(self) -> int:
        return self.sync.summarizer_calls

    async def info(self) -> SessionInfo:
        return await asyncio.to_thread(self.sync.info)

    async def append(self, turns: Sequence[Message | Mapping[str, Any]], *,
                     key: str | None = None) -> AppendResult:
        return await asyncio.to_thread(self.sync.append, turns, key=key)

    async def window(self, *, cache_breakpoints: bool = False) -> WindowView:
        return await asyncio.to_thread(self.sync.window, cache_breakpoints=cache_breakpoints)

    async def ledger(self, start: int = 0, end: int | None = None) -> list[LedgerEntry]:
        return await asyncio.to_thread(self.sync.ledger, start, end)

    async def recover(self, span: FoldedSpan | WindowItem | tuple[int, int]) -> list[Message]:
        return await asyncio.to_thread(self.sync.recover, span)

    async def report_usage(self, usage: Any, *, seq: int, revision: int,
                           model: str | None = None) -> bool:
        return await asyncio.to_thread(self.sync.report_usage, usage, seq=seq,
                                       revision=revision, model=model)

    async def fold_inline(self, *, trigger: Trigger = "overflow",
                          target_tokens: int | None = None,
                          measured_tokens: int | None = None) -> FoldReport:
        return await asyncio.to_thread(self.sync.fold_inline, trigger=trigger,
                                       target_tokens=target_tokens,
                                       measured_tokens=measured_tokens)

    async def call(self, fn: AsyncModelCall, *, over_budget: OverBudget | None = None,
                   cache_breakpoints: bool = False) -> Any:
        """:meth:`SessionHandle.call` with an async ``fn``."""
        h = self.sync
        view = await asyncio.to_thread(h._before_call, over_budget, cache_breakpoints)
        try:
            response = await fn(view.system, view.messages)
        except Exception as exc:
            if not is_context_overflow(exc):
                raise
            view = await asyncio.to_thread(h._after_overflow, exc, cache_breakpoints)
            try:
                response = await fn(view.system, view.messages)
            except Exception as again:
                if is_context_overflow(again):
                    raise h._still_too_long(again) from again
                raise
        await asyncio.to_thread(h._after_call, response, view)
        return response

"""The asyncio flavour of the client: :class:`AsyncClient` and :class:`AsyncSessionHandle`.

The blocking store calls run in a thread (``asyncio.to_thread``) and the model call ``fn`` of
:meth:`AsyncSessionHandle.call` is awaited; everything else is the synchronous client's,
recall included (``fn`` may take the tools as the synchronous one does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sessionfold.core.messages import Message
from sessionfold.core.overflow import is_context_overflow
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import FoldedSpan, Trigger, WindowItem
from sessionfold.runtime.fold_procedure import FoldReport
from sessionfold.runtime.settings import Settings
from sessionfold.store import AppendResult, LedgerEntry, SessionInfo

from .connection import Client, connect
from .recall import RecallAnswer
from .session import AsyncModelCall, CallPlan, OverBudget, SessionHandle
from .shapes import Shape, WindowShape
from .window_view import WindowView

__all__ = ["AsyncClient", "AsyncSessionHandle"]


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
                      over_budget: OverBudget = "cap") -> AsyncSessionHandle:
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

    @property
    def recall_calls(self) -> int:
        return self.sync.recall_calls

    @property
    def recall_rounds(self) -> int:
        return self.sync.recall_rounds

    @property
    def guarded_requests(self) -> int:
        return self.sync.guarded_requests

    @property
    def guard_over_budget(self) -> int:
        return self.sync.guard_over_budget

    @property
    def nudges(self) -> int:
        return self.sync.nudges

    async def info(self) -> SessionInfo:
        return await asyncio.to_thread(self.sync.info)

    async def append(self, turns: Sequence[Message | Mapping[str, Any]], *,
                     key: str | None = None, shape: Shape = "auto") -> AppendResult:
        """:meth:`SessionHandle.append`: either shape, tool results held by the same rule."""
        return await asyncio.to_thread(self.sync.append, turns, key=key, shape=shape)

    @property
    def held_tool_results(self) -> list[dict[str, Any]]:
        return self.sync.held_tool_results

    async def window(self, *, cache_breakpoints: bool = False, recall: bool = False,
                     shape: WindowShape = "anthropic") -> WindowView:
        return await asyncio.to_thread(self.sync.window, cache_breakpoints=cache_breakpoints,
                                       recall=recall, shape=shape)

    async def recall(self, *, seq: int | str | None = None, query: str | None = None,
                     offset: int = 0) -> RecallAnswer:
        return await asyncio.to_thread(self.sync.recall, seq=seq, query=query, offset=offset)

    async def answer_recall(self, response: Any) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sync.answer_recall, response)

    async def tool_results(self, response: Any,
                           own_results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sync.tool_results, response, own_results)

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
        """:meth:`SessionHandle.call` with an async ``fn`` (recall rounds included)."""
        h = self.sync
        plan, view = await asyncio.to_thread(h._plan_call, fn, over_budget, cache_breakpoints)
        rounds = 0
        while True:
            response = await self._send(fn, plan, view)
            next_view = await asyncio.to_thread(h._recall_round, plan, response, rounds, view)
            if next_view is None:
                return response
            view, rounds = next_view, rounds + 1

    async def _send(self, fn: AsyncModelCall, plan: CallPlan, view: WindowView) -> Any:
        h = self.sync
        try:
            response = await plan.invoke(fn, view)
        except Exception as exc:
            if not is_context_overflow(exc):
                raise
            view = await asyncio.to_thread(h._after_overflow, exc, plan)
            try:
                response = await plan.invoke(fn, view)
            except Exception as again:
                if is_context_overflow(again):
                    raise h._still_too_long(again) from again
                raise
        await asyncio.to_thread(h._after_call, response, view)
        return response

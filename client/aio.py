"""The asyncio flavour of the client: :class:`AsyncClient` and :class:`AsyncSessionHandle`.

The blocking store calls run in a thread (``asyncio.to_thread``) and the model call ``fn`` of
:meth:`AsyncSessionHandle.call` is awaited; everything else is the synchronous client's: the
same call loop (:mod:`.call_loop`), recall included (``fn`` may take the tools as the
synchronous one does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.window import FoldedSpan, Trigger, WindowItem
from sessionfold.runtime.fold_procedure import FoldReport
from sessionfold.runtime.settings import Settings
from sessionfold.store import AppendResult, LedgerEntry, SessionInfo

from .call_loop import CallLoop, ReturnReply
from .call_plan import OverBudget
from .connection import Client, connect
from .model_call import AsyncModelCall, invoke, tools_mode
from .recall import RecallAnswer
from .session import SessionHandle
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

    def open_call(self, *, takes_tools: bool = True, over_budget: OverBudget | None = None,
                  cache_breakpoints: bool = False) -> CallLoop:
        """:meth:`SessionHandle.open_call`: a call loop, not started (its steps read and write
        the store: run them in a thread)."""
        return self.sync.open_call(takes_tools=takes_tools, over_budget=over_budget,
                                   cache_breakpoints=cache_breakpoints)

    async def call(self, fn: AsyncModelCall, *, over_budget: OverBudget | None = None,
                   cache_breakpoints: bool = False) -> Any:
        """:meth:`SessionHandle.call` with an async ``fn`` (recall rounds included): the same
        loop, its steps in a thread."""
        mode = tools_mode(fn)
        loop = self.open_call(takes_tools=mode != "none", over_budget=over_budget,
                              cache_breakpoints=cache_breakpoints)
        step = await asyncio.to_thread(loop.start)
        while True:
            try:
                reply = await invoke(fn, mode, step)
            except Exception as exc:
                step = await asyncio.to_thread(loop.retry, exc)
                continue
            done = await asyncio.to_thread(loop.replied, reply)
            if isinstance(done, ReturnReply):
                return done.reply
            step = done

"""The streaming adapters of the call loop: the rounds before the stream the caller reads.

A streamed request is the call loop's (:mod:`.call_loop`) like any other; what differs is when
a reply is known. With recall off the stream goes to the caller at once, as its events come.
With recall on, a reply's events are read (and kept) until it is known not to be a recall-only
one -- at the first call of one of the agent's own tools, or at its end -- so a recall round is
answered and the next stream opened without the caller seeing any of it. The stream the caller
gets reports its usage to the loop when read to its end (:meth:`Opened.finish`).

An overflow is refused before a stream's first event, so the inline fold and the one retry
happen while opening it. :func:`open_rounds` and :func:`open_rounds_async` are the same steps,
blocking and awaited; the decisions are the loop's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from .call_loop import CallLoop, ReturnReply, SendRequest

__all__ = ["AsyncAttempt", "Attempt", "Opened", "SyncAttempt", "drain", "drain_async",
           "open_rounds", "open_rounds_async"]


class Attempt(Protocol):
    """One streamed request as the rounds need it."""

    def tool_call(self, event: Any) -> str | None:
        """The name of the tool whose call ``event`` starts, if it starts one."""
        ...

    def reply(self) -> Any:
        """The reply, once every event was read: with ``content`` (Anthropic blocks), ``id``,
        ``usage`` and ``model``, as the handle reads replies."""
        ...


class SyncAttempt(Attempt, Protocol):
    def __next__(self) -> Any: ...

    def close(self) -> None: ...


class AsyncAttempt(Attempt, Protocol):
    async def next(self) -> Any: ...

    async def close(self) -> None: ...


@dataclass
class Opened:
    """The attempt the caller reads, the events already read from it, and the loop it is the
    last request of; ``done``: it was read to its end while being looked at (its usage went
    out already, and the events read are all there is)."""

    attempt: Any
    loop: CallLoop
    read: list[Any] = field(default_factory=list)
    done: bool = False

    def finish(self) -> Any:
        """The reply, once the caller has read the stream to its end: its usage reported
        (unless it was while being looked at)."""
        reply = self.attempt.reply()
        if not self.done:
            self.loop.replied(reply, relayed=True)
            self.done = True
        return reply

    async def finish_async(self) -> Any:
        reply = self.attempt.reply()
        if not self.done:
            await asyncio.to_thread(self.loop.replied, reply, relayed=True)
            self.done = True
        return reply


def drain(attempt: SyncAttempt) -> Iterator[Any]:
    while True:
        try:
            yield next(attempt)
        except StopIteration:
            return


async def drain_async(attempt: AsyncAttempt) -> AsyncIterator[Any]:
    while True:
        try:
            event = await attempt.next()
        except StopAsyncIteration:
            return
        yield event


def open_rounds(loop: CallLoop, start: Callable[[SendRequest], SyncAttempt]) -> Opened:
    """Open streams as ``loop`` says until one is not a recall-only reply (or the rounds are
    used up): the one the caller reads."""
    step = loop.start()
    while True:
        try:
            attempt = start(step)
        except Exception as exc:
            step = loop.retry(exc)
            continue
        if loop.relays_at_once:
            return Opened(attempt, loop)
        try:
            read: list[Any] = []
            for event in drain(attempt):
                read.append(event)
                if loop.settled_by(attempt.tool_call(event)):
                    return Opened(attempt, loop, read)
            done = loop.replied(attempt.reply())
        except BaseException:
            attempt.close()
            raise
        if isinstance(done, ReturnReply):
            return Opened(attempt, loop, read, done=True)
        attempt.close()
        step = done


async def open_rounds_async(loop: CallLoop,
                            start: Callable[[SendRequest], Awaitable[AsyncAttempt]]) -> Opened:
    """:func:`open_rounds`, awaited: the loop's steps run in a thread (they use the store)."""
    step = await asyncio.to_thread(loop.start)
    while True:
        try:
            attempt = await start(step)
        except Exception as exc:
            step = await asyncio.to_thread(loop.retry, exc)
            continue
        if loop.relays_at_once:
            return Opened(attempt, loop)
        try:
            read: list[Any] = []
            while True:  # not `async for` over a generator left open when the reply settles
                try:
                    event = await attempt.next()
                except StopAsyncIteration:
                    break
                read.append(event)
                if loop.settled_by(attempt.tool_call(event)):
                    return Opened(attempt, loop, read)
            done = await asyncio.to_thread(loop.replied, attempt.reply())
        except BaseException:
            await attempt.close()
            raise
        if isinstance(done, ReturnReply):
            return Opened(attempt, loop, read, done=True)
        await attempt.close()
        step = done

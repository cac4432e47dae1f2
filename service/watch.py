"""Long-poll waiters: one listener per API process, fanned out in process with asyncio.

A waiting app server holds an asyncio future here, never a thread nor a database connection.
The process learns of window changes in one place:

- **PostgreSQL**: one connection of its own ``LISTEN``s on :data:`~sessionfold.store.notify.
  CHANNEL`; the store ``NOTIFY``s in the very transaction of every append, fold commit and delete
  (:mod:`sessionfold.store.notify`), so a change is heard once it is committed, never before.
  After every (re)connect the listener re-reads the states of every session waited on, which
  covers what was committed while it was away.
- **SQLite** (no NOTIFY): every ``poll_interval_s`` one batched query reads the states of every
  session waited on (:meth:`SessionStore.window_states`), however many wait on each.

A waiter registers *before* reading the session's state, so a change committed between that read
and the wait is still heard (as a notification or by the next poll) and never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import anyio.to_thread
from sessionfold.core.errors import SessionfoldError
from sessionfold.store import SessionStore
from sessionfold.store.notify import CHANNEL, WindowState, parse_change

from .etags import ETag, Until, changed

__all__ = ["WaitResult", "WindowWatcher", "libpq_url"]

log = logging.getLogger(__name__)

#: Reconnect backoff of the PostgreSQL listener (seconds, doubling up to the cap).
_RECONNECT_MIN_S = 0.2
_RECONNECT_MAX_S = 5.0


@dataclass(eq=False)
class _Waiter:
    after: ETag
    until: Until
    future: asyncio.Future[WindowState | None] = field(repr=False)


@dataclass(frozen=True, slots=True)
class WaitResult:
    """What a wait came to: ``changed`` (else it timed out) and the state then (None: deleted)."""

    changed: bool
    state: WindowState | None


def libpq_url(store: SessionStore) -> str | None:
    """The store's PostgreSQL URL as libpq spells it (None on SQLite)."""
    url = store.engine.url
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class WindowWatcher:
    """Wakes long-polls when their session's window changes (see the module doc)."""

    def __init__(self, store: SessionStore, *, poll_interval_s: float = 0.15,
                 listen_url: str | None = None) -> None:
        self._store = store
        self._poll_interval_s = poll_interval_s
        self._listen_url = listen_url
        self._waiters: dict[str, set[_Waiter]] = {}
        self._known: dict[str, WindowState] = {}
        self._task: asyncio.Task[None] | None = None
        #: PostgreSQL: whether the LISTEN connection is up (``/healthz`` reports it).
        self.listening = False

    @classmethod
    def for_store(cls, store: SessionStore, *, poll_interval_s: float) -> WindowWatcher:
        return cls(store, poll_interval_s=poll_interval_s, listen_url=libpq_url(store))

    @property
    def mode(self) -> str:
        return "listen" if self._listen_url else "poll"

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return sum(len(w) for w in self._waiters.values())

    async def start(self) -> None:
        loop = self._listen() if self._listen_url else self._poll()
        self._task = asyncio.create_task(loop, name=f"sessionfold-window-{self.mode}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.cancel()

    async def wait(self, sid: str, after: ETag, until: Until, timeout_s: float) -> WaitResult:
        """Wait up to ``timeout_s`` for ``sid``'s window to move past ``after``.

        Answers at once when it already has (or when ``timeout_s`` is 0).
        """
        waiter = _Waiter(after, until, asyncio.get_running_loop().create_future())
        self._waiters.setdefault(sid, set()).add(waiter)
        try:
            states = await anyio.to_thread.run_sync(self._store.window_states, [sid])
            state = self._learn(sid, states.get(sid))
            if changed(state, after, until):
                return WaitResult(True, state)
            if timeout_s <= 0:
                return WaitResult(False, state)
            try:
                return WaitResult(True, await asyncio.wait_for(waiter.future, timeout_s))
            except TimeoutError:
                return WaitResult(False, self._known.get(sid, state))
        finally:
            waiters = self._waiters.get(sid)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[sid]
                    self._known.pop(sid, None)

    # --- what the process hears --------------------------------------------------------------

    def _learn(self, sid: str, state: WindowState | None) -> WindowState | None:
        """Record ``state`` as ``sid``'s latest; an append notification (fold revision unknown,
        -1) keeps the fold revision known for the same incarnation."""
        if state is None:
            self._known.pop(sid, None)
            return None
        if state.fold_revision < 0:
            known = self._known.get(sid)
            fold_revision = known.fold_revision if known is not None \
                and known.incarnation == state.incarnation else 0
            state = WindowState(state.incarnation, state.revision, fold_revision)
        known = self._known.get(sid)
        if known is not None and known.incarnation == state.incarnation \
                and known.revision > state.revision:
            return known  # a late notification: never go back
        self._known[sid] = state
        return state

    def _dispatch(self, sid: str, state: WindowState | None) -> None:
        waiters = self._waiters.get(sid)
        if not waiters:
            return
        state = self._learn(sid, state)
        for waiter in waiters:
            if not waiter.future.done() and changed(state, waiter.after, waiter.until):
                waiter.future.set_result(state)

    async def _resync(self) -> None:
        """Read the state of every session waited on (one batched query) and wake who moved."""
        sids = list(self._waiters)
        if not sids:
            return
        states = await anyio.to_thread.run_sync(self._store.window_states, sids)
        for sid in sids:
            self._dispatch(sid, states.get(sid))

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            try:
                await self._resync()
            except SessionfoldError as exc:  # the store is away: waiters time out meanwhile
                log.warning("long-poll: cannot read window states: %s", exc)

    async def _listen(self) -> None:
        assert self._listen_url is not None
        # Imported here: only a PostgreSQL store has a listener, and psycopg is the postgres
        # extra (an API on SQLite runs without it).
        import psycopg

        backoff = _RECONNECT_MIN_S
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self._listen_url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    backoff = _RECONNECT_MIN_S
                    log.info("long-poll: listening on %s", CHANNEL)
                    await self._resync()  # what was committed while nobody listened
                    async for note in conn.notifies():
                        change = parse_change(note.payload)
                        if change is not None:
                            self._dispatch(change.session_id, change.state)
            except (psycopg.Error, OSError, SessionfoldError) as exc:
                log.warning("long-poll: listener connection lost (%s); reconnecting in %.1f s",
                            exc, backoff)
            finally:
                self.listening = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _RECONNECT_MAX_S)

"""Windows encoded once per revision, however many requests read them.

When a fold lands on a session that 5,000 app servers wait on, 5,000 responses go out with the
same bytes. :class:`EncodedWindows` keeps the JSON body of each window by ``(store id,
incarnation, revision, cache breakpoints, shape)`` (an LRU bounded in bytes) and lets only one
read of a session per rendering be in flight at a time: the others await it (single flight)
instead of reading the store and encoding the same window again.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from sessionfold.client.shapes import WindowShape
from sessionfold.client.window_view import view_of
from sessionfold.store import SessionStore, Window
from sessionfold.store.notify import WindowState

from .etags import ETag, etag_of
from .tenancy import split_store_id

__all__ = ["EncodedWindow", "EncodedWindows", "encode_window"]

_Key = tuple[str, int, int, bool, WindowShape]
#: What one read in flight renders: the session, cache breakpoints and shape.
_Flight = tuple[str, bool, WindowShape]


@dataclass(frozen=True, slots=True)
class EncodedWindow:
    """A window's response body (JSON bytes) and the state it was read at."""

    body: bytes
    state: WindowState
    shape: WindowShape = "anthropic"

    @property
    def etag(self) -> ETag:
        return etag_of(self.state, self.shape)


def encode_window(window: Window, state: WindowState, *, cache_breakpoints: bool,
                  shape: WindowShape = "anthropic") -> bytes:
    """The body of ``GET /v1/sessions/{id}/window`` (the ``WindowOut`` model, written by hand:
    this is the hot path, and pydantic's validation would only re-check what the store made)."""
    view = view_of(window, cache_breakpoints=cache_breakpoints, shape=shape)
    body: dict[str, Any] = {
        "session_id": split_store_id(window.session_id)[1],
        "system": view.system,
        "revision": state.revision,
        "fold_revision": state.fold_revision,
        "incarnation": f"{state.incarnation:x}",
        "etag": str(etag_of(state, shape)),
        "shape": shape,
        "last_seq": view.last_seq,
        "tokens": view.tokens,
        "items": [{"start_seq": i.start_seq, "end_seq": i.end_seq, "kind": i.kind,
                   "tokens": i.tokens} for i in view.items],
        "messages": view.messages,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class EncodedWindows:
    """The encoded-window cache of one API process (see the module doc)."""

    def __init__(self, store: SessionStore, *, max_bytes: int = 64 << 20) -> None:
        self._store = store
        self._max_bytes = max_bytes
        self._bytes = 0
        self._cache: OrderedDict[_Key, EncodedWindow] = OrderedDict()
        self._inflight: dict[_Flight, asyncio.Future[EncodedWindow]] = {}
        #: Store reads made (the rest were served from the cache or a read in flight).
        self.reads = 0

    def cached(self, sid: str, state: WindowState, cache_breakpoints: bool,
               shape: WindowShape = "anthropic") -> EncodedWindow | None:
        key = (sid, state.incarnation, state.revision, cache_breakpoints, shape)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
        return hit

    async def get(self, sid: str, state: WindowState | None, *, cache_breakpoints: bool,
                  shape: WindowShape = "anthropic") -> EncodedWindow:
        """The window of ``sid`` at ``state`` or newer (``state`` None: whatever is newest),
        rendered in ``shape``.

        Raises what the store raises (SessionNotFoundError for a deleted session).
        """
        if state is not None:
            hit = self.cached(sid, state, cache_breakpoints, shape)
            if hit is not None:
                return hit
        flight = (sid, cache_breakpoints, shape)
        running = self._inflight.get(flight)
        if running is not None:
            # A read already on its way started before this call: it is at least as new as
            # ``state`` unless it raced the change, which the revision check below catches.
            found = await asyncio.shield(running)
            if state is None or _covers(found.state, state):
                return found
        future: asyncio.Future[EncodedWindow] = asyncio.get_running_loop().create_future()
        self._inflight[flight] = future
        try:
            encoded = await anyio.to_thread.run_sync(self._read, sid, cache_breakpoints, shape)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting on it
            raise
        finally:
            if self._inflight.get(flight) is future:
                del self._inflight[flight]
        future.set_result(encoded)
        self._put((sid, encoded.state.incarnation, encoded.state.revision, cache_breakpoints,
                   shape), encoded)
        return encoded

    def _read(self, sid: str, cache_breakpoints: bool, shape: WindowShape) -> EncodedWindow:
        window, state = self._store.read_window_state(sid)
        self.reads += 1
        body = encode_window(window, state, cache_breakpoints=cache_breakpoints, shape=shape)
        return EncodedWindow(body, state, shape)

    def _put(self, key: _Key, encoded: EncodedWindow) -> None:
        if len(encoded.body) > self._max_bytes // 4:
            return  # one huge window must not flush everything else
        old = self._cache.pop(key, None)
        if old is not None:
            self._bytes -= len(old.body)
        self._cache[key] = encoded
        self._bytes += len(encoded.body)
        while self._bytes > self._max_bytes and self._cache:
            _, evicted = self._cache.popitem(last=False)
            self._bytes -= len(evicted.body)


def _covers(found: WindowState, wanted: WindowState) -> bool:
    return found.incarnation != wanted.incarnation or found.revision >= wanted.revision

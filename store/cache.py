"""A process-local cache of decoded window items, so a window read fetches and decodes only what
is new since this process last read the session.

A window item row is never updated in place: an append inserts it, a fold deletes it and inserts
its replacement with a new version (the committing revision). So ``(session id, incarnation,
start_seq, version)`` names one immutable item for ever, and a decoded
:class:`~sessionfold.core.window.WindowItem` (frozen) can be reused by every later read that
finds the same row. (The incarnation is random per created session: versions restart when an id
is deleted and created again.)

Beyond single items the cache remembers, per session, the latest revision whose items it holds
*all* of (``known``). An item still in the window with a version at or below that revision existed
at that revision (versions only grow, and a deleted item never comes back), so its content is
already here: the read query leaves its text out, and an app server polling a session transfers
and decodes only the items appended or folded since its last read. An item evicted since is
fetched again by a second query in the same transaction.

Nothing ever needs invalidating: a stale entry is never asked for again and is evicted, oldest
first, when the cache is full. Every read still runs its query, so what a read returns is what
the database holds at that moment.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from sessionfold.core.errors import InvalidInputError
from sessionfold.core.window import WindowItem

__all__ = ["DEFAULT_ITEMS", "ItemCache", "ItemKey"]

#: About 50 MB of decoded items for typical agent messages (~1 kB each).
DEFAULT_ITEMS = 50_000

ItemKey = tuple[str, int, int, int]  # session id, incarnation, start_seq, version


class ItemCache:
    """Decoded window items by key, evicted oldest first; ``capacity=0`` turns it off."""

    def __init__(self, capacity: int = DEFAULT_ITEMS) -> None:
        if capacity < 0:
            raise InvalidInputError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        # Eviction drops the oldest insert (no LRU bookkeeping on the read path; an evicted item
        # that is still read is simply fetched again). OrderedDict, not dict: a plain dict
        # leaves a dummy slot per deleted entry at its front until it resizes, so finding the
        # oldest with next(iter()) scans every dummy: in a worker at capacity that was ~1 ms
        # per 300-item window read (bench/RESULTS.md, "Fold CPU a fourth time").
        self._items: OrderedDict[ItemKey, WindowItem] = OrderedDict()
        # session id → (incarnation, revision)
        self._known: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def known(self, sid: str) -> tuple[int, int] | None:
        """(incarnation, revision) of the latest full window of ``sid`` held, if any."""
        return self._known.get(sid) if self.capacity else None

    def get_many(self, keys: Sequence[ItemKey]) -> list[WindowItem | None]:
        items = self._items
        return [items.get(key) for key in keys]

    def put_window(self, sid: str, incarnation: int, revision: int,
                   entries: Iterable[tuple[ItemKey, WindowItem]]) -> None:
        """Add the newly decoded items of a full window read at ``revision``."""
        if not self.capacity:
            return
        with self._lock:
            items = self._items
            for key, item in entries:
                items[key] = item
            held = self._known.pop(sid, None)
            # Two threads may finish reads of one session out of order: keep the later revision.
            if held is not None and held[0] == incarnation and held[1] > revision:
                revision = held[1]
            self._known[sid] = (incarnation, revision)
            while len(items) > self.capacity:
                items.popitem(last=False)
            while len(self._known) > max(1000, self.capacity // 10):
                self._known.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._known.clear()

"""Which partition a session belongs to: one stable hash of its id, shared by every process.

A fleet's runtime state is split into a fixed number of partitions (``Settings.partitions``):
each session's usage stream, its Redis keys (one Redis Cluster hash slot per partition) and the
scheduler that watches it are chosen by :func:`partition_of`. The store keeps the same hash so
that a scheduler's sweep asks only for its own partitions' sessions::

    session_hash("agent-7")          # 0 <= h < 2**31, the same in every process and release
    partition_of("agent-7", 16)      # session_hash("agent-7") % 16

Why a hash of our own rather than Python's ``hash()`` (salted per process) or the database's
(``hashtext`` exists in PostgreSQL only): agents, schedulers and the store must agree on it, on
every machine and forever, since a session's partition decides where its events go. BLAKE2b is
in the standard library and has no bias worth a thought at this size; 31 bits fit a signed
32-bit column on every backend and leave ``% partitions`` exact.
"""

from __future__ import annotations

import hashlib

from sessionfold.core.errors import InvalidInputError

__all__ = ["HASH_BITS", "partition_of", "session_hash"]

#: Width of :func:`session_hash`: fits a signed 32-bit integer column on every backend.
HASH_BITS = 31
_MASK = (1 << HASH_BITS) - 1


def session_hash(session_id: str) -> int:
    """A stable 31-bit hash of ``session_id`` (its UTF-8 bytes; lone surrogates kept)."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK


def partition_of(session_id: str, partitions: int) -> int:
    """The partition of ``session_id`` among ``partitions`` (0-based)."""
    if partitions < 1:
        raise InvalidInputError(f"the partition count must be at least 1, got {partitions}")
    return session_hash(session_id) % partitions

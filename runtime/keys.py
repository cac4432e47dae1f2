"""Every Redis key and stream name sessionfold uses. No other module spells a key.

All keys share one prefix (default ``sessionfold:``, ``SESSIONFOLD_KEY_PREFIX``), so several
deployments or test runs can share a Redis server, and ``SCAN MATCH <prefix>*`` finds all of
one's state::

    keys = Keys("sessionfold:", partitions=16)
    keys.partition_of("s1")        # 9   (sessionfold.store.partitions: a hash of the id)
    keys.usage_stream(9)           # 'sessionfold:usage:{p9}'          partition 9's usage bus
    keys.measured("s1")            # 'sessionfold:measured:{p9}:s1'    last accepted usage
    keys.fold_lock("s1")           # 'sessionfold:lock:fold:{p9}:s1'   one fold job in flight
    keys.last_calls(9)             # 'sessionfold:calls:{p9}:last'     partition 9's last calls
    keys.pending_batches(9)        # 'sessionfold:batches:{p9}:pending' its batch folds
    keys.partition_lease(9)        # 'sessionfold:partition:{p9}:lease' which scheduler owns it

**Partitions and Redis Cluster.** Sessions are split into ``partitions`` by a stable hash of
their id (:func:`~sessionfold.store.partitions.partition_of`); each partition has its own usage
stream and one scheduler owns it at a time (:mod:`sessionfold.workers.partitions`). Every
per-session key carries its partition's hash tag ``{pN}``, so on Redis Cluster all keys of one
partition live in one hash slot and a script may touch many of them in one call (the
scheduler's batched compare-and-set passes one partition's keys per call). The tag is derived
from the partition, never from the raw session id, which may itself contain ``{…}``: the tag
comes before the id, and Redis hashes the first ``{…}`` of a key. For the same reason the prefix
may not contain braces. The partition count is fixed for a deployment's life: changing it moves
sessions to other streams and keys (see deploy/README.md for the procedure).

Session ids and job ids are used verbatim inside keys (Redis keys are binary safe); they are
never parsed back out of a key except by :meth:`Keys.session_of_lock`.

A session id deleted and created again names a new session. What each per-session key does
then:

- ``summarizer_spend``: keyed by the session's incarnation as well, so the new session's spend
  starts at 0 (a cap must not carry over);
- ``measured``: its hash holds the session's creation time (``born``), and the scheduler ignores
  a hash written for an earlier session of the id;
- ``fold_lock``: kept. It only saves work (the store's claim decides), and a job of the deleted
  session releases it when it ends (its commit is refused) or it expires (``lock_ttl_s``): the
  new session's first fold waits at most that long;
- ``fold_attempts``: per job id, not per session; job ids are never reused;
- ``last_calls``: one member per session id: the new session's first call sets its time (an
  idle sweep that meets the deleted one finds no session and drops the member).
- ``pending_batches``: a member names the incarnation its batch fold was sent for: the
  collection finds the deleted session (or the new one) and cancels the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sessionfold.core.errors import InvalidInputError
from sessionfold.store.partitions import partition_of

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["DEFAULT_PARTITIONS", "DEFAULT_PREFIX", "FOLD_QUEUE", "Keys"]

DEFAULT_PREFIX = "sessionfold:"
#: Partitions of a deployment unless set (``SESSIONFOLD_PARTITIONS``): room for 16 schedulers.
DEFAULT_PARTITIONS = 16
#: The Celery queue fold jobs go to (kombu's ``global_keyprefix`` adds the deployment prefix).
FOLD_QUEUE = "sessionfold.fold"


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one deployment (one prefix)."""

    prefix: str = DEFAULT_PREFIX
    #: Name of the usage streams below the prefix.
    stream: str = "usage"
    #: How many partitions sessions are split into (fixed for a deployment's life).
    partitions: int = DEFAULT_PARTITIONS

    def __post_init__(self) -> None:
        if not self.prefix:
            raise InvalidInputError(
                "the Redis key prefix must not be empty: it separates deployments")
        if not self.stream:
            raise InvalidInputError("the usage stream name must not be empty")
        if any(c in "{}" for c in self.prefix + self.stream):
            # Redis Cluster hashes the first {...} of a key: a brace here would take the place
            # of the partition's hash tag and split a partition's keys over several slots.
            raise InvalidInputError("the Redis key prefix and stream name must not contain { or }: "
                             f"keys carry a hash tag of their own, got {self.prefix!r}")
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) \
                or self.partitions < 1:
            raise InvalidInputError(f"the partition count must be an integer >= 1, "
                             f"got {self.partitions!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> Keys:
        return cls(prefix=settings.key_prefix, stream=settings.usage_stream,
                   partitions=settings.partitions)

    # --- partitions ------------------------------------------------------------------------
    def partition_of(self, session_id: str) -> int:
        """The partition a session belongs to (a stable hash of its id, never the id itself)."""
        return partition_of(_id(session_id), self.partitions)

    def tag(self, partition: int) -> str:
        """The Redis Cluster hash tag of a partition: all its keys share one slot."""
        if not 0 <= partition < self.partitions:
            raise InvalidInputError(f"partition {partition} is not in 0..{self.partitions - 1}")
        return f"{{p{partition}}}"

    def partition_lease(self, partition: int) -> str:
        """String naming the scheduler that owns a partition now (``SET NX PX``)."""
        return f"{self.prefix}partition:{self.tag(partition)}:lease"

    def schedulers(self) -> str:
        """Sorted set of live schedulers, scored by when their heartbeat runs out (ms)."""
        return f"{self.prefix}schedulers"

    # --- usage bus and scheduler -----------------------------------------------------------
    def usage_stream(self, partition: int) -> str:
        """The Stream of one partition: agents ``XADD`` to their session's, its owner reads it."""
        return f"{self.prefix}{self.stream}:{self.tag(partition)}"

    def usage_stream_of(self, session_id: str) -> str:
        """The usage stream a session's events go to."""
        return self.usage_stream(self.partition_of(session_id))

    def usage_streams(self) -> list[str]:
        """Every partition's usage stream, in partition order."""
        return [self.usage_stream(p) for p in range(self.partitions)]

    def measured(self, session_id: str) -> str:
        """Hash of the newest usage accepted for a session (born, revision, seq, tokens)."""
        return f"{self.prefix}measured:{self._tagged(session_id)}"

    def last_calls(self, partition: int) -> str:
        """Sorted set of a partition's sessions scored by their last call's time (unix seconds):
        the scheduler's idle sweep reads the ones idle past their cache's lifetime."""
        return f"{self.prefix}calls:{self.tag(partition)}:last"

    # --- fold jobs -------------------------------------------------------------------------
    def fold_lock(self, session_id: str) -> str:
        """String holding the token of the one fold job in flight for a session."""
        return f"{self.prefix}lock:fold:{self._tagged(session_id)}"

    def fold_lock_pattern(self) -> str:
        """``SCAN MATCH`` pattern of every fold lock (the sessions with a fold pending)."""
        return f"{_glob_escape(self.prefix)}lock:fold:*"

    def session_of_lock(self, key: str | bytes) -> str:
        """The session id inside a :meth:`fold_lock` key."""
        text = key.decode() if isinstance(key, bytes) else key
        head = f"{self.prefix}lock:fold:"
        tag, sep, sid = text[len(head):].partition("}:")
        if not text.startswith(head) or not sep or not tag.startswith("{p"):
            raise InvalidInputError(f"not a fold lock key of prefix {self.prefix!r}: {text!r}")
        return sid

    def pending_batches(self, partition: int) -> str:
        """Sorted set of a partition's batch folds waiting on a provider's batch API (members:
        :class:`~sessionfold.runtime.batch_folds.BatchTicket` JSON), scored by when the next
        look at each is due (unix seconds). Kept apart from the session row, so that a batch
        whose session was deleted is still found, and cancelled."""
        return f"{self.prefix}batches:{self.tag(partition)}:pending"

    def fold_attempts(self, job_id: str) -> str:
        """Counter of deliveries of one fold job (Celery redelivers after a lost worker)."""
        return f"{self.prefix}job:attempts:{_id(job_id)}"

    # --- summarizer guards -----------------------------------------------------------------
    def summarizer_slots(self) -> str:
        """Sorted set of summarizer calls in flight (the global concurrency cap)."""
        return f"{self.prefix}summarizer:slots"

    def summarizer_spend(self, session_id: str, incarnation: int) -> str:
        """What the summarizer has spent on a session, in USD (the per-session spend cap).

        Keyed by the session's incarnation too: a session deleted and created again under the
        same id is a new session and starts at 0 (the old key expires by itself). The
        incarnation comes first, so the id, which may hold colons, stays the key's tail (after
        the partition's hash tag, like every per-session key).
        """
        if isinstance(incarnation, bool) or not isinstance(incarnation, int):
            raise InvalidInputError(f"an incarnation must be an integer, got {incarnation!r}")
        tag = self.tag(self.partition_of(session_id))
        return f"{self.prefix}summarizer:spend:{tag}:{incarnation}:{session_id}"

    # --- Celery ------------------------------------------------------------------------------
    def celery_prefix(self) -> str:
        """Prefix for kombu's ``global_keyprefix`` and the result backend's keys."""
        return f"{self.prefix}celery:"

    def _tagged(self, session_id: str) -> str:
        # The tag before the id: Redis hashes the first {...}, and the id may contain braces.
        return f"{self.tag(self.partition_of(session_id))}:{session_id}"

    def all_pattern(self) -> str:
        """``SCAN MATCH`` pattern of every key of this prefix."""
        return _glob_escape(self.prefix) + "*"


def _id(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(
            f"an id inside a Redis key must be a non-empty string, got {value!r}")
    return value


def _glob_escape(text: str) -> str:
    # SCAN MATCH treats these as glob syntax; a prefix is literal.
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)

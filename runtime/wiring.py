"""Every connection a sessionfold process makes, built from its :class:`Settings`, in one place.

Settings come from the environment once, at an entry point (the ``sessionfold`` command, the
Celery app, :func:`sessionfold.client.connect`), and are passed down as an object. This module
turns them into connections, so that each of these decisions is made here and nowhere else::

    store = open_store(settings)                    # migrated if SQLite, else schema checked
    with redis_url_for(settings) as url:            # REDIS_URL, or the embedded server's URL
        ...
    summarizer = make_summarizer(settings)          # a cheap model's provider, or the offline one
    offer = batch_offer(settings, summarizer)       # its provider's batch API, or None
    guard = summarizer_guard(settings, redis, summarizer, inline=False)

- **The store**: ``DATABASE_URL``, else the SQLite file ``<data dir>/sessionfold.db``
  (:attr:`Settings.store_url`). The embedded SQLite store is migrated when it is opened (a fresh
  machine runs with no setup); any other database is only checked, since upgrading a shared
  PostgreSQL is an operator's act (``sessionfold migrate``): :func:`open_store`.
- **Redis**: ``REDIS_URL``, else the embedded server of the data dir, attached to when a
  process of the same data dir runs one and started otherwise: :func:`open_redis`,
  :func:`redis_url_for`.
- **The summarizer with its guards**: the provider the settings name (:func:`make_summarizer`),
  behind the global summarizer slots and the per-session spend cap, for background folds and
  an agent's inline folds alike (:func:`summarizer_guard`, see
  :mod:`~sessionfold.runtime.summarizer_guard`).
- **The usage publisher** an agent reports on: :func:`usage_publisher`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from sessionfold.core.errors import RedisUnavailableError
from sessionfold.core.summarizers import ExtractiveSummarizer, Summarizer
from sessionfold.store import SessionStore

from .batch_folds import BatchOffer
from .keys import Keys
from .providers import DEFAULT_CONTEXT_TOKENS
from .providers.batch_api import BatchCapable
from .providers.optional import openai_summarizer_class
from .redis_conn import EmbeddedRedis, RedisClient, agent_path_client
from .settings import Settings
from .slots import SummarizerSlots
from .spend import SpendCap
from .summarizer_guard import SummarizerGuard
from .usage import UsagePublisher

__all__ = [
    "RedisEndpoint",
    "batch_offer",
    "embedded_redis",
    "inline_redis_client",
    "make_summarizer",
    "open_redis",
    "open_store",
    "redis_url_for",
    "store_url",
    "summarizer_guard",
    "usage_publisher",
]

log = logging.getLogger(__name__)

#: Extra life of a summarizer slot past the summarizer's own timeout: a holder that died
#: without releasing it frees it this long after its call would have timed out.
SLOT_MARGIN_S = 30.0


# --- the store -------------------------------------------------------------------------------

def store_url(settings: Settings) -> str:
    """``DATABASE_URL``, else the embedded SQLite file ``<data dir>/sessionfold.db``.

    The same file ``sessionfold up`` runs the pipeline on, wherever the data dir is.
    """
    return settings.store_url


def open_store(settings: Settings, *, migrate: bool | None = None,
               item_cache: int | None = None) -> SessionStore:
    """The store the settings name.

    ``item_cache``: decoded window items the store keeps (None: the store's default, right for
    app servers that read the same sessions again; a fold worker passes 0, see
    :class:`~sessionfold.workers.runtime.WorkerRuntime`).

    ``migrate``: None (the default) migrates the embedded SQLite store and checks the schema of
    any other (:class:`~sessionfold.core.errors.SchemaError` says to run ``sessionfold migrate``);
    True always migrates, False only checks (a worker: its parent migrated or checked already).
    """
    store = (SessionStore.from_url(store_url(settings)) if item_cache is None
             else SessionStore.from_url(store_url(settings), item_cache=item_cache))
    try:
        if migrate is None:
            migrate = store.engine.dialect.name == "sqlite"
        if migrate:
            store.migrate()
        else:
            store.check_schema()
    except BaseException:
        store.close()
        raise
    return store


# --- Redis -------------------------------------------------------------------------------------

def embedded_redis(settings: Settings) -> EmbeddedRedis:
    """The embedded Redis server of the data dir (``<data dir>/redis``), not started."""
    return EmbeddedRedis(settings.data_dir / "redis")


@dataclass
class RedisEndpoint:
    """The Redis a process talks to: ``url``, and the embedded server behind it, if any.

    ``server`` is None with ``REDIS_URL``; otherwise the embedded server, which this process
    either started (:attr:`owned`: :meth:`close` stops it) or attached to (another process of
    the same data dir runs it: :meth:`close` leaves it running).
    """

    url: str
    server: EmbeddedRedis | None = None

    @property
    def embedded(self) -> bool:
        return self.server is not None

    @property
    def owned(self) -> bool:
        return self.server is not None and self.server.owned

    def close(self) -> None:
        """Stop the embedded server if this process started it; nothing otherwise."""
        if self.server is not None:
            self.server.stop()


def open_redis(settings: Settings, *, running_only: bool = False) -> RedisEndpoint:
    """``REDIS_URL``, else the embedded server of the data dir (attached to, or started).

    ``running_only``: attach to an embedded server some other process runs, never start one
    (a command that needs a running pipeline); RedisUnavailableError when none runs. Starting
    the embedded server may also raise RedisUnavailableError.
    """
    if settings.redis_url:
        return RedisEndpoint(settings.redis_url)
    server = embedded_redis(settings)
    url = server.start()
    if running_only and server.owned:
        server.stop()
        raise RedisUnavailableError(
            "no pipeline is running on the embedded defaults: start `sessionfold up` first, "
            "or set REDIS_URL")
    return RedisEndpoint(url, server)


@contextlib.contextmanager
def redis_url_for(settings: Settings, *, running_only: bool = False) -> Iterator[str]:
    """:func:`open_redis` for the block: an embedded server started here stops at its end."""
    endpoint = open_redis(settings, running_only=running_only)
    try:
        yield endpoint.url
    finally:
        endpoint.close()


def inline_redis_client(settings: Settings, url: str) -> RedisClient:
    """A Redis client for the guards of an agent's inline folds: short timeouts, no retries.

    An agent never waits long on Redis: with Redis away an inline fold goes without the
    summarizer rather than stall (see :mod:`~sessionfold.runtime.summarizer_guard`).
    """
    return agent_path_client(url, settings.usage_socket_timeout_s)


def usage_publisher(settings: Settings, url: str) -> UsagePublisher:
    """The publisher an agent reports usage on (its own agent-path connection)."""
    return UsagePublisher.from_settings(settings, url)


# --- the summarizer ----------------------------------------------------------------------------

def make_summarizer(settings: Settings) -> Summarizer:
    """The summarizer the settings name: a cheap model through Anthropic's Messages API or an
    OpenAI-compatible chat completions server, or the offline extractive one.

    The bare provider, without guards (see :func:`summarizer_guard`). Its client is built with
    ``max_retries=0``: the Celery task owns retries, their count and their cap (and the SDKs
    would honour a retry-after without an upper bound). ``ANTHROPIC_BASE_URL`` /
    ``OPENAI_BASE_URL`` point it at another endpoint (a gateway, a vLLM or Ollama server, the
    scripted provider in tests). The OpenAI provider needs the ``sessionfold[openai]`` extra.
    """
    kind = settings.summarizer_kind
    if kind == "offline":
        return ExtractiveSummarizer()
    context = settings.summarizer_context_tokens or DEFAULT_CONTEXT_TOKENS[kind]
    if kind == "anthropic":
        from .providers.anthropic import AnthropicSummarizer  # import cost: ~1 s

        key = settings.anthropic_api_key
        return AnthropicSummarizer(api_key=key.get_secret_value() if key else None,
                                   base_url=settings.anthropic_base_url,
                                   model=settings.summarizer_model,
                                   timeout=settings.summarizer_timeout_s,
                                   context_tokens=context)
    summarizer_class = openai_summarizer_class("summarizer 'openai'")
    openai_key = settings.openai_api_key
    return summarizer_class(api_key=openai_key.get_secret_value() if openai_key else None,
                            base_url=settings.openai_base_url, model=settings.summarizer_model,
                            timeout=settings.summarizer_timeout_s, context_tokens=context)


def batch_offer(settings: Settings, summarizer: Summarizer) -> BatchOffer | None:
    """The batch API of ``summarizer``'s provider (Anthropic's Message Batches, OpenAI's Batch
    API), with the settings' expected delay and longest wait; None for a summarizer without
    one (the offline one). Background folds are offered it only with ``batch_folds`` on; the
    collection of batches sent earlier uses it either way."""
    if not isinstance(summarizer, BatchCapable):
        return None
    return BatchOffer(summarizer, delay_s=settings.batch_delay_s,
                      max_wait_s=settings.batch_max_wait_s)


def summarizer_guard(settings: Settings, client: RedisClient, summarizer: Summarizer, *,
                     inline: bool) -> SummarizerGuard:
    """``summarizer`` behind the guards every fold meets: the global summarizer slots and the
    per-session spend cap, both in the Redis ``client`` is on.

    ``inline``: for an agent's inline fold, which never waits for a slot (none free: it folds
    with the cheap layers and says why); a background fold waits up to a quarter of its soft
    time limit (at most 10 s) and then fails with a transient error that Celery retries.
    """
    slots = SummarizerSlots(
        client, Keys.from_settings(settings).summarizer_slots(),
        settings.summarizer_max_concurrency,
        ttl_s=settings.summarizer_timeout_s + SLOT_MARGIN_S,
        wait_s=0.0 if inline else min(10.0, settings.task_soft_time_limit_s / 4))
    spend = SpendCap(client, settings.session_spend_cap_usd, ttl_s=settings.measured_ttl_s,
                     prices=settings.price_table())
    return SummarizerGuard(summarizer, slots, spend, Keys.from_settings(settings),
                           wait_for_slot=not inline)

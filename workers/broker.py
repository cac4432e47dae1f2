"""Celery's Redis broker transport, with one Redis client per channel instead of one per call.

kombu's Redis channel (kombu 5.7) builds a new :class:`redis.Redis` object for every broker
command it sends outside its blocking read: each task event published (a Celery worker sends
three per fold job: received, started, succeeded), each acknowledgement, each message it takes
into its unacknowledged set. The commands themselves go over the channel's shared connection
pool either way; what is new each time is the client object, and redis-py's constructor (its
response-callback tables, retry policy, keyword checks) is most of the cost of such a call:
about a quarter of a fold worker's consumer CPU (bench/RESULTS.md, "Fold CPU: Celery's work
for a job").

:class:`Transport` is kombu's transport with one change: a channel asked for a client with
none in hand gets the one it built before, as long as that was built on the connection pool
the channel uses now (kombu drops its pools after a fork or a lost connection; a new pool gets a
new client). A :class:`redis.Redis` holds no connection between commands and is safe to share
between threads, so nothing else changes: the same commands, keys and pool.

:func:`~sessionfold.workers.celery_app.make_celery` installs it for a ``redis://`` broker. Other
spellings keep kombu's own transport: ``rediss://`` (kombu turns TLS on from that scheme) and
``redis+socket://`` (the embedded server, where kombu reads the transport from the URL).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport", "uses_shared_client"]


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, keeping the client it builds for commands outside the poll."""

    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()  # type: ignore[no-untyped-call]
        yield shared

    def close(self) -> None:
        self._shared_client = None
        super().close()  # type: ignore[no-untyped-call]


class _RedisScheme(type):
    """Renders the class as ``redis``: kombu writes a connection's URL with its transport as
    the scheme (the worker's banner and log lines, Flower's broker page), and a class given as
    the transport would otherwise print as ``<class '…'>://…``."""

    def __str__(cls) -> str:
        return "redis"


class Transport(kombu_redis.Transport, metaclass=_RedisScheme):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


def uses_shared_client(broker: str) -> bool:
    """Whether ``broker`` (a kombu URL) is served by :class:`Transport`: plain ``redis://``."""
    return broker.split("://", 1)[0].lower() == "redis"

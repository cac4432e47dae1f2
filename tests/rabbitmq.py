"""A private RabbitMQ virtual host per test: the machine's broker, isolated like the Redis prefix.

RabbitMQ runs on these machines at 127.0.0.1:5672 (guest/guest; CI starts it with
``rabbitmq-server -detached``). A test that runs the fold pipeline on it gets a fresh virtual
host, so queues, exchanges and unacknowledged messages of one test never meet another's, and the
host is deleted (with everything in it) when the test ends::

    with rabbitmq_vhost() as url:        # 'amqp://guest:guest@127.0.0.1:5672/sftest-1a2b3c'
        settings = make_settings(broker_url=url)

Made with ``rabbitmqctl`` (the management plugin, with its HTTP API, may be off); without a
reachable broker the helper skips locally and fails under CI, like the other real services.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator

from pipeline_harness import unavailable

HOST, PORT = "127.0.0.1", 5672


def _listening() -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, PORT), timeout=2):
        return True
    return False


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A fresh virtual host on the local RabbitMQ for the block; yields its amqp:// URL."""
    if shutil.which("rabbitmqctl") is None or not _listening():
        unavailable(f"RabbitMQ is not reachable at {HOST}:{PORT}")
    vhost = f"sftest-{uuid.uuid4().hex[:10]}"
    _ctl("add_vhost", vhost)
    try:
        _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{HOST}:{PORT}/{vhost}"
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            _ctl("delete_vhost", vhost)

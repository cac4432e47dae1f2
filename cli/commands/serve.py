"""``sessionfold serve``: the HTTP API (:mod:`sessionfold.service`) under uvicorn.

::

    sessionfold serve [--host 127.0.0.1] [--port 8080] [--workers N]

The port is bound here, before anything starts: a busy port (or an address this host does not
have) ends the command with a one-line reason and exit status 2, and takes no other process
down. Every ``/v1`` request needs an API key; with none in the store the command says so
loudly (every request would be refused), wherever it listens. There is no anonymous mode, so a
non-loopback address exposes nothing without a key.

With ``--workers N`` uvicorn runs N processes on the one socket; each builds its app from the
environment (:func:`app_from_env`), joins the host's metrics and runs its own long-poll listener.

uvicorn runs the service's own HTTP protocol (:mod:`sessionfold.service.protocol`), which bounds
a request's head (``SESSIONFOLD_API_MAX_HEADER_BYTES``); the app bounds its body
(``SESSIONFOLD_API_MAX_BODY_BYTES``) and checks the key before reading it.
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionfold.runtime.settings import Settings

__all__ = ["app_from_env", "register"]

log = logging.getLogger(__name__)

#: Pending connections the kernel queues (long-polls of thousands of app servers reconnect
#: together after a fold).
BACKLOG = 4096


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser(
        "serve", help="run the HTTP API (sessions, windows, long-poll, usage, folds)",
        description="Serve the HTTP API on the store and Redis the environment names "
                    "(DATABASE_URL, REDIS_URL; the embedded defaults otherwise). Requests need "
                    "an API key: make one with `sessionfold keys create TENANT`. Exit 2 when "
                    "the port cannot be bound.")
    serve.add_argument("--host", default=None,
                       help="address to listen on (default SESSIONFOLD_API_HOST, else "
                            "127.0.0.1)")
    serve.add_argument("--port", type=int, default=None,
                       help="port (default SESSIONFOLD_API_PORT, else 8080)")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="API processes on the one port (default 1)")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(handler=_serve)


def app_from_env() -> Any:
    """The app of one API process, settings from the environment (uvicorn's factory)."""
    from sessionfold.runtime.settings import Settings
    from sessionfold.service import create_app

    return create_app(Settings())


def _bind(host: str, port: int) -> socket.socket:
    from sessionfold.core.errors import InvalidInputError
    from sessionfold.runtime.settings import env_name

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InvalidInputError(
                f"port {port} on {host} is in use by another program; choose another with "
                f"--port or {env_name('api_port')}") from None
        raise InvalidInputError(f"cannot listen on {host} port {port}: {exc.strerror or exc}"
                                ) from None
    sock.set_inheritable(True)
    return sock


def _check_keys(settings: Settings, host: str) -> int:
    """How many live API keys the store holds; warns loudly when there are none."""
    from sessionfold.runtime.wiring import open_store

    from ..hosts import is_loopback

    store = open_store(settings)
    try:
        live = [k for k in store.list_api_keys() if k.revoked_at is None]
    finally:
        store.close()
    if not live:
        where = "on a non-loopback address, " if not is_loopback(host) else ""
        log.warning("sessionfold serve: %sno API key exists: every /v1 request will be refused "
                    "(401) until one is made with `sessionfold keys create TENANT`", where)
        print(f"sessionfold serve: WARNING: no API key exists ({where}every /v1 request is "
              "refused); make one with `sessionfold keys create TENANT`", file=sys.stderr,
              flush=True)
    return len(live)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from sessionfold.core.errors import InvalidInputError
    from sessionfold.runtime.settings import Settings, redact_url
    from sessionfold.service.protocol import server_options
    from uvicorn.supervisors import Multiprocess

    settings = Settings()
    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    if not 1 <= port <= 65535:
        raise InvalidInputError(f"--port must be 1 to 65535, got {port}")
    if args.workers < 1:
        raise InvalidInputError(f"--workers must be at least 1, got {args.workers}")
    sock = _bind(host, port)  # first: a busy port ends the command before anything starts
    keys = _check_keys(settings, host)
    config = uvicorn.Config("sessionfold.cli.commands.serve:app_from_env", factory=True,
                            workers=args.workers, backlog=BACKLOG, access_log=args.access_log,
                            log_level=logging.getLogger().getEffectiveLevel(),
                            timeout_graceful_shutdown=5, host=host, port=port,
                            **server_options(settings))
    shown = f"[{host}]" if ":" in host else host
    print(f"sessionfold serve: http://{shown}:{port} ({args.workers} process"
          f"{'es' if args.workers > 1 else ''}, store {redact_url(settings.store_url)}, "
          f"{keys} API key{'s' if keys != 1 else ''})", flush=True)
    try:
        if args.workers == 1:
            uvicorn.Server(config).run(sockets=[sock])
        else:
            Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
    return 0

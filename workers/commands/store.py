"""``sessionfold migrate``, ``sessionfold export SESSION``, ``sessionfold inspect SESSION``.

::

    sessionfold migrate                       # create or upgrade the store's schema
    sessionfold export agent-7 > agent-7.json # the whole session as one JSON object
    sessionfold inspect agent-7               # the window for a person, with fold seams

All three use the store every other entry point uses (:func:`~sessionfold.workers.client.
database_url_for`): ``DATABASE_URL``, else the SQLite file ``<data dir>/sessionfold.db``
(``SESSIONFOLD_DATA_DIR``, default ``./.sessionfold``). ``--database-url`` overrides both.

``export`` prints ``{"session", "system", "policy", "revision", "ledger": [{"seq", "message"}],
"window": [{"start_seq", "end_seq", "kind", "message"}], "spans": [...], "records": [...]}``.
An unknown session exits 2; a database without the schema exits 1 and says to run
``sessionfold migrate``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from sessionfold.store import SessionStore
from sessionfold.store.engine import normalize_url

from ..client import database_url_for
from ..settings import Settings

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``migrate``, ``export`` and ``inspect`` subcommands."""
    url_help = ("database URL (default: $DATABASE_URL, else the SQLite file "
                "sessionfold.db in the data dir, ./.sessionfold unless SESSIONFOLD_DATA_DIR)")

    migrate = subparsers.add_parser(
        "migrate", help="create or upgrade the session store's schema",
        description="Apply the session store's pending schema migrations (Alembic) to the "
                    "database. Safe to run again: an up-to-date schema is left as it is.")
    migrate.add_argument("--database-url", metavar="URL", help=url_help)
    migrate.set_defaults(handler=_migrate)

    export = subparsers.add_parser(
        "export", help="print one session (ledger, window, spans, records) as JSON",
        description='Print {"session", "system", "policy", "revision", "ledger", "window", '
                    '"spans", "records"} of one session as one JSON object.')
    export.add_argument("session", metavar="SESSION", help="session id")
    export.add_argument("--database-url", metavar="URL", help=url_help)
    export.add_argument("--indent", type=int, default=None, metavar="N",
                        help="indent the JSON by N spaces (default: one line)")
    export.set_defaults(handler=_export)

    inspect = subparsers.add_parser(
        "inspect", help="show a session's window for a person, with fold seams",
        description="Print a session's window one item per line; each folded range is framed "
                    "by a seam naming the ledger seqs behind it and the span that folded them.")
    inspect.add_argument("session", metavar="SESSION", help="session id")
    inspect.add_argument("--database-url", metavar="URL", help=url_help)
    inspect.add_argument("--width", type=int, default=100, metavar="N",
                         help="line width of the previews (default 100)")
    inspect.add_argument("--full", action="store_true",
                         help="print each item's text in full instead of a one-line preview")
    inspect.set_defaults(handler=_inspect)


def _open(args: argparse.Namespace) -> SessionStore:
    # Settings read the environment here, at the entry point, and only when no URL was given.
    url = args.database_url or database_url_for(Settings())
    return SessionStore.from_url(normalize_url(url))


def _migrate(args: argparse.Namespace) -> int:
    with _open(args) as store:
        reached = store.migrate()
        where = store.engine.url.render_as_string(hide_password=True)
    print(f"sessionfold migrate: {where} is at schema revision {reached}")
    return 0


def _export(args: argparse.Namespace) -> int:
    with _open(args) as store:
        data = store.export(args.session)
    try:
        json.dump(data, sys.stdout, ensure_ascii=False, indent=args.indent)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`| head`): not an error. Point stdout at devnull so the
        # interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _inspect(args: argparse.Namespace) -> int:
    with _open(args) as store:
        text = store.inspect(args.session, width=max(40, args.width), full=args.full)
    sys.stdout.write(text)
    return 0

"""``sessionfold migrate``, ``export SESSION``, ``inspect SESSION``, ``reindex [SESSION]``.

::

    sessionfold migrate                       # create or upgrade the store's schema
    sessionfold export agent-7 > agent-7.json # the whole session as one JSON object
    sessionfold inspect agent-7               # the window for a person, with fold seams
    sessionfold reindex                       # index ledgers written before the search index

All four use the store every other entry point uses (:attr:`~sessionfold.runtime.settings.
Settings.store_url`): ``DATABASE_URL``, else the SQLite file ``<data dir>/sessionfold.db``
(``SESSIONFOLD_DATA_DIR``, default ``./.sessionfold``). ``--database-url`` overrides both.

``export`` prints ``{"session", "system", "policy", "revision",
"ledger": [{"seq", "origin", "message"}],
"window": [{"start_seq", "end_seq", "kind", "message"}], "spans": [...], "records": [...]}``.
An unknown session exits 2; a database without the schema exits 1 and says to run
``sessionfold migrate``.

``migrate`` says when sessions hold ledger rows the search index has not seen (ledgers written
before migration 0005): ``reindex`` indexes them in short batches beside live agents, and can
be stopped and run again at any time. With a SESSION it reindexes that session whatever its
flag says.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.store.engine import normalize_url
from sessionfold.store.search import MAX_REINDEX_BATCH

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``migrate``, ``export``, ``inspect`` and ``reindex`` subcommands."""
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

    reindex = subparsers.add_parser(
        "reindex", help="index ledger rows the search index has not seen (after an upgrade)",
        description="Index the ledger rows the recall search index lacks: of SESSION, or of "
                    "every session written before the index existed. Short transactions of "
                    "--batch rows each, safe beside running agents; run it again at any time.")
    reindex.add_argument("session", metavar="SESSION", nargs="?", default=None,
                         help="one session id (default: every session flagged as pending)")
    reindex.add_argument("--batch", type=_batch, default=500, metavar="N",
                         help="ledger rows read per batch (1 to 10000, default 500)")
    reindex.add_argument("--database-url", metavar="URL", help=url_help)
    reindex.set_defaults(handler=_reindex)


def _batch(text: str) -> int:
    """A batch size (argparse turns the error into a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_REINDEX_BATCH:
        raise argparse.ArgumentTypeError(f"from 1 to {MAX_REINDEX_BATCH}, got {value}")
    return value


def _open(args: argparse.Namespace) -> SessionStore:
    # Settings read the environment here, at the entry point, and only when no URL was given.
    url = args.database_url
    if not url:
        settings = Settings()
        if settings.database_url is None:
            log.info("sessionfold %s: %s", args.command, settings.embedded_data())
        url = settings.store_url
    return SessionStore.from_url(normalize_url(url))


def _migrate(args: argparse.Namespace) -> int:
    with _open(args) as store:
        reached = store.migrate()
        where = store.engine.url.render_as_string(hide_password=True)
        pending = store.unindexed_sessions()
    print(f"sessionfold migrate: {where} is at schema revision {reached}")
    if pending:
        print(f"sessionfold migrate: {pending:,} session(s) hold ledger rows written before "
              "the search index; run `sessionfold reindex` to make them searchable by recall "
              "(safe while agents run)")
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


def _reindex(args: argparse.Namespace) -> int:
    with _open(args) as store:
        indexed = store.reindex(sid=args.session, batch=args.batch)
        pending = store.unindexed_sessions()
    which = f"session {args.session!r}" if args.session else "the store"
    print(f"sessionfold reindex: {indexed:,} ledger row(s) of {which} indexed"
          + (f"; {pending:,} session(s) still pending" if pending else ""))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    with _open(args) as store:
        text = store.inspect(args.session, width=max(40, args.width), full=args.full)
    sys.stdout.write(text)
    return 0

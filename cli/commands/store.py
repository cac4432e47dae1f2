"""``sessionfold migrate``, ``list``, ``export SESSION``, ``inspect SESSION``, ``reindex``.

::

    sessionfold migrate                       # create or upgrade the store's schema
    sessionfold list                          # every session: sizes, budget, last fold, paused
    sessionfold export agent-7 > agent-7.json # the whole session as one JSON object
    sessionfold inspect agent-7               # the window for a person, with fold seams
    sessionfold reindex                       # index ledgers written before the search index

All five use the store every other entry point uses (:attr:`~sessionfold.runtime.settings.
Settings.store_url`): ``DATABASE_URL``, else the SQLite file ``<data dir>/sessionfold.db``
(``SESSIONFOLD_DATA_DIR``, default ``./.sessionfold``). ``--database-url`` overrides both.

``export`` prints ``{"session", "system", "policy", "revision",
"ledger": [{"seq", "origin", "message"}],
"window": [{"start_seq", "end_seq", "kind", "message"}], "spans": [...], "records": [...]}``.
An unknown session exits 2; a database without the schema exits 1 and says to run
``sessionfold migrate``.

``list`` prints one line per session in id order (the id every other command takes, its
tenant when the HTTP API made it, ledger messages, window tokens as the budget counts them, the
budget, when it last folded, paused), at most ``--limit``; ``--json`` prints ``{"sessions":
[{"id", "tenant", "ledger_messages", "current_tokens", "budget_tokens", "last_fold_at",
"paused"}], "next_after"}``, ``next_after`` being the ``--after`` of the next page (null: done).

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
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionfold.store import SessionInfo, SessionStore

__all__ = ["register"]

log = logging.getLogger(__name__)

#: The most sessions one ``list`` prints (the HTTP API pages by the same figure).
MAX_LIST_LIMIT = 1000
#: The store's largest reindex batch (``sessionfold.store.search.MAX_REINDEX_BATCH``), written
#: out for the help so that ``--help`` imports no store (tests/cli/test_cli_lazy.py checks it).
HELP_MAX_REINDEX_BATCH = 10_000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``migrate``, ``list``, ``export``, ``inspect`` and ``reindex`` subcommands."""
    url_help = ("database URL (default: $DATABASE_URL, else the SQLite file "
                "sessionfold.db in the data dir, ./.sessionfold unless SESSIONFOLD_DATA_DIR)")

    migrate = subparsers.add_parser(
        "migrate", help="create or upgrade the session store's schema",
        description="Apply the session store's pending schema migrations (Alembic) to the "
                    "database. Safe to run again: an up-to-date schema is left as it is.")
    migrate.add_argument("--database-url", metavar="URL", help=url_help)
    migrate.set_defaults(handler=_migrate)

    listing = subparsers.add_parser(
        "list", help="list sessions: sizes, budget, last fold, paused",
        description="Print one line per session, in id order: its id (what inspect, export, "
                    "pause... take), its tenant (sessions made through the HTTP API), ledger "
                    "messages, window tokens as the budget counts them (the last reported "
                    "prompt plus what was appended since), budget tokens, when it last folded "
                    "(UTC) and whether it is paused.")
    listing.add_argument("--limit", type=_limit, default=100, metavar="N",
                         help=f"at most N sessions (1 to {MAX_LIST_LIMIT}, default 100)")
    listing.add_argument("--after", default=None, metavar="ID",
                         help="start after this id (the next page; the command says which)")
    listing.add_argument("--json", action="store_true",
                         help='print {"sessions": [...], "next_after"} as one JSON object')
    listing.add_argument("--database-url", metavar="URL", help=url_help)
    listing.set_defaults(handler=_list)

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
                         help=f"ledger rows read per batch (1 to {HELP_MAX_REINDEX_BATCH}, "
                              "default 500)")
    reindex.add_argument("--database-url", metavar="URL", help=url_help)
    reindex.set_defaults(handler=_reindex)


def _limit(text: str) -> int:
    """A page size for ``list`` (argparse turns the error into a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_LIST_LIMIT:
        raise argparse.ArgumentTypeError(f"from 1 to {MAX_LIST_LIMIT}, got {value}")
    return value


def _batch(text: str) -> int:
    """A batch size (argparse turns the error into a usage error)."""
    from sessionfold.store.search import MAX_REINDEX_BATCH

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_REINDEX_BATCH:
        raise argparse.ArgumentTypeError(f"from 1 to {MAX_REINDEX_BATCH}, got {value}")
    return value


def _open(args: argparse.Namespace) -> SessionStore:
    from sessionfold.runtime.settings import Settings
    from sessionfold.store import SessionStore
    from sessionfold.store.engine import normalize_url

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


def _list(args: argparse.Namespace) -> int:
    with _open(args) as store:
        found = store.list_sessions(limit=args.limit, after=args.after)
        folded = store.last_fold_times(info.id for info in found)
    rows = [_listed(info, folded.get(info.id)) for info in found]
    next_after = found[-1].id if len(found) == args.limit else None
    if args.json:
        json.dump({"sessions": rows, "next_after": next_after}, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print("sessionfold list: no sessions" + (f" after {args.after!r}" if args.after else ""),
              file=sys.stderr)
        return 0
    sys.stdout.write(_table(rows))
    if next_after is not None:
        print(f"sessionfold list: more after these: sessionfold list --after {next_after}",
              file=sys.stderr)
    return 0


def _listed(info: SessionInfo, last_fold: datetime | None) -> dict[str, Any]:
    """One session as ``list --json`` prints it."""
    from sessionfold.service.tenancy import split_store_id

    tenant, _ = split_store_id(info.id)
    return {"id": info.id, "tenant": tenant, "ledger_messages": info.ledger_len,
            "current_tokens": info.current_tokens, "budget_tokens": info.policy.budget_tokens,
            "last_fold_at": last_fold.isoformat() if last_fold else None,
            "paused": info.paused}


_COLUMNS = ("SESSION", "TENANT", "LEDGER", "WINDOW TOKENS", "BUDGET", "LAST FOLD (UTC)",
            "PAUSED")


def _table(rows: list[dict[str, Any]]) -> str:
    """The sessions as aligned columns (numbers right-aligned), one line each."""
    cells = [[r["id"], r["tenant"] or "-", f"{r['ledger_messages']:,}",
              f"{r['current_tokens']:,}", f"{r['budget_tokens']:,}",
              r["last_fold_at"][:19].replace("T", " ") if r["last_fold_at"] else "never",
              "yes" if r["paused"] else "no"] for r in rows]
    widths = [max(len(c) for c in column) for column in zip(_COLUMNS, *cells, strict=True)]
    numeric = {2, 3, 4}
    lines = []
    for line in [list(_COLUMNS), *cells]:
        lines.append("  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
                     .rstrip())
    return "\n".join(lines) + "\n"

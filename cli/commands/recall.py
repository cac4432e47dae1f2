"""``sessionfold recall SESSION``: what the recall tool would answer the session's model now.

::

    sessionfold recall agent-7 --seq 12-30          # ledger rows, as the window names them
    sessionfold recall agent-7 --seq 2 --offset 40000   # page through a long original
    sessionfold recall agent-7 --query ACCT-90417   # search the session's own ledger
    sessionfold recall agent-7 --query ACCT-90417 --json

It runs the same code the client runs for the model (:func:`sessionfold.client.recall.answer`),
on the store every entry point uses (``DATABASE_URL``, else the SQLite file of the data dir;
``--database-url`` overrides both), and prints the text of the tool result as the model would
read it, sized by the room the window has now. ``--json`` prints ``{"kind", "outcome", "tokens",
"next_seq", "next_offset", "text"}``. A malformed seq or query, an offset with a query, or an
unknown session exits 2 with the reason on one line. Nothing is written and nothing is counted:
an operator's look is not the model's recall.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessionfold.store import SessionStore

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``recall`` subcommand."""
    recall = subparsers.add_parser(
        "recall", help="print what the recall tool would answer a session's model",
        description="Print what sessionfold_recall would answer the model of SESSION now: "
                    "ledger rows by seq (as stubs, seams and frames name them), or the "
                    "matches of a query over the session's own ledger.")
    recall.add_argument("session", metavar="SESSION", help="session id")
    ask = recall.add_mutually_exclusive_group(required=True)
    ask.add_argument("--seq", metavar="A[-B]",
                     help='a ledger row or range: 12, "#12", 12-30, "#12–#30"')
    ask.add_argument("--query", metavar="TEXT",
                     help="words or identifiers to search the session's ledger for")
    recall.add_argument("--offset", type=int, default=0, metavar="N",
                        help="with --seq: the character of the first row's text to start at")
    recall.add_argument("--json", action="store_true",
                        help="print the answer as one JSON object instead of its text")
    recall.add_argument("--database-url", metavar="URL",
                        help="database URL (default: $DATABASE_URL, else the SQLite file "
                             "sessionfold.db in the data dir)")
    recall.set_defaults(handler=_recall)


def _open(args: argparse.Namespace) -> SessionStore:
    from sessionfold.runtime.settings import Settings
    from sessionfold.store import SessionStore
    from sessionfold.store.engine import normalize_url

    # Settings read the environment here, at the entry point, and only when no URL was given.
    url = args.database_url
    if not url:
        settings = Settings()
        if settings.database_url is None:
            log.info("sessionfold recall: %s", settings.embedded_data())
        url = settings.store_url
    return SessionStore.from_url(normalize_url(url))


def _recall(args: argparse.Namespace) -> int:
    from sessionfold.client.recall import RecallRequest, answer, parse_seq

    # Checked before the store is opened: bad input costs no connection (InvalidInputError
    # becomes one line and exit 2 in main).
    request = RecallRequest(seq=parse_seq(args.seq) if args.seq is not None else None,
                            query=args.query, offset=args.offset)
    with _open(args) as store:
        result = answer(store, args.session, request)
    if args.json:
        json.dump(result.to_json(), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.text + "\n")
    return 0

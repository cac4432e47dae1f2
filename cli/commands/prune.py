"""``sessionfold prune [--dry-run] [--batch N]``: apply the store's retention rules once.

::

    sessionfold prune --dry-run        # what the rules would delete, per table; nothing deleted
    sessionfold prune                  # delete it, in short transactions of --batch rows

The rules are the settings ``SESSIONFOLD_RETAIN_APPEND_KEYS_S``, ``…_RETAIN_VISIT_RECORDS``,
``…_RETAIN_VISIT_RECORDS_S`` and ``…_RETAIN_DEAD_LETTERS_S`` (see
:mod:`sessionfold.store.pruning` for what each keeps and what is never deleted). The scheduler
already runs the same prune every ``SESSIONFOLD_PRUNE_INTERVAL_S``; this command is for a store
without a scheduler, a cron job or Kubernetes CronJob (with ``SESSIONFOLD_PRUNE_INTERVAL_S=0``),
or a look before a first run. Safe beside running agents and workers, and to stop (Ctrl-C) and
run again at any time. Exit 0 after printing one line per table; a bad setting exits 2 naming
the variable; a database without the schema exits 1.
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["register"]

log = logging.getLogger(__name__)

#: The store's largest prune batch (``sessionfold.store.pruning.MAX_PRUNE_BATCH``), written out
#: for the help so that ``--help`` imports no store (tests/cli/test_cli_lazy.py checks it).
HELP_MAX_PRUNE_BATCH = 10_000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``prune`` subcommand."""
    prune = subparsers.add_parser(
        "prune", help="delete old append keys, no-op visit records and dead letters",
        description="Apply the store's retention rules (SESSIONFOLD_RETAIN_* settings): delete "
                    "append keys and dead letters past their age and no-op visit records "
                    "beyond each session's newest ones. Folded records, and records a span "
                    "names, are never deleted. Short transactions of --batch rows each, safe "
                    "beside running agents; run it again at any time.")
    prune.add_argument("--dry-run", action="store_true",
                       help="count what would be deleted; delete nothing")
    prune.add_argument("--batch", type=_batch, default=None, metavar="N",
                       help=f"rows deleted per transaction (1 to {HELP_MAX_PRUNE_BATCH}, "
                            "default $SESSIONFOLD_PRUNE_BATCH, else 1000)")
    prune.add_argument("--database-url", metavar="URL",
                       help="database URL (default: $DATABASE_URL, else the SQLite file "
                            "sessionfold.db in the data dir, ./.sessionfold unless "
                            "SESSIONFOLD_DATA_DIR)")
    prune.set_defaults(handler=_prune)


def _batch(text: str) -> int:
    """A batch size (argparse turns the error into a usage error)."""
    from sessionfold.store.pruning import MAX_PRUNE_BATCH

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_PRUNE_BATCH:
        raise argparse.ArgumentTypeError(f"from 1 to {MAX_PRUNE_BATCH}, got {value}")
    return value


def _prune(args: argparse.Namespace) -> int:
    from sessionfold.runtime.settings import Settings
    from sessionfold.store import SessionStore
    from sessionfold.store.engine import normalize_url

    # The rules are settings: read once, here, at the entry point (a bad one exits 2).
    settings = Settings()
    url = args.database_url or settings.store_url
    if not args.database_url and settings.database_url is None:
        log.info("sessionfold prune: %s", settings.embedded_data())
    batch = args.batch if args.batch is not None else settings.prune_batch
    with SessionStore.from_url(normalize_url(url)) as store:
        report = store.prune(settings.retention_rules(), batch=batch, dry_run=args.dry_run)
    verb = "would delete" if report.dry_run else "deleted"
    print(f"sessionfold prune: {verb} {report.append_keys:,} append key(s) older than "
          f"{_age(settings.retain_append_keys_s)}")
    print(f"sessionfold prune: {verb} {report.visit_records:,} no-op visit record(s) beyond "
          f"each session's newest {settings.retain_visit_records:,}"
          + (f" and older than {_age(settings.retain_visit_records_s)}"
             if settings.retain_visit_records_s else ""))
    print(f"sessionfold prune: {verb} {report.dead_letters:,} dead letter(s) older than "
          f"{_age(settings.retain_dead_letters_s)} or of deleted sessions")
    print(f"sessionfold prune: {report.batches:,} transaction(s)")
    return 0


def _age(seconds: float) -> str:
    """``86400`` → ``1 day``, ``5400`` → ``90 min``, ``42`` → ``42 s``."""
    for unit, size in (("day", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" + ("s" if unit == "day" and count != 1 else "")
    return f"{seconds:g} s"

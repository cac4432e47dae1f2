"""The ``sessionfold`` command.

Each area adds its subcommands from its own module under :mod:`sessionfold.cli.commands`
(a ``register(subparsers)`` function; every subcommand sets ``handler(args) -> int``). Those
modules import only the standard library at load, and each handler imports what it runs when it
runs: ``sessionfold --help`` and ``sessionfold COMMAND --help`` load no engine, store, Celery or
SDK (tests/cli/test_cli_lazy.py counts the modules). A command whose extra is not installed
(Celery for ``worker``, FastAPI for ``serve``...) exits 2 naming the extra to install.

Bad input and bad flags exit 2 with a one-line reason on stderr; no traceback reaches the user
for an error sessionfold raised on purpose. Output piped into a reader that stops early
(``| head``) ends the command quietly with 141, the status a shell reports for any tool a closed
pipe stopped.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence

#: Modules that register subcommands, in the order their commands are listed in ``--help``.
COMMAND_MODULES = (
    "sessionfold.cli.commands.compact",
    "sessionfold.cli.commands.store",
    "sessionfold.cli.commands.prune",
    "sessionfold.cli.commands.pipeline",
    "sessionfold.cli.commands.demo",
    "sessionfold.cli.commands.standin",
    "sessionfold.cli.commands.recall",
    "sessionfold.cli.commands.serve",
    "sessionfold.cli.commands.keys",
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: 128 + SIGPIPE: how a shell reports a command whose reader went away.
EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"sessionfold: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sessionfold",
                     description="Background context compaction for long-lived LLM agents.")
    parser.add_argument("--log-level", default="WARNING", type=_log_level, metavar="LEVEL",
                        help="logging level for sessionfold's own logs: "
                             f"{', '.join(LOG_LEVELS)} (default WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _log_level(text: str) -> str:
    """A logging level by name, in any case (argparse turns the error into a usage error)."""
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"unknown level {text!r}; use one of "
                                         + ", ".join(LOG_LEVELS))
    return level


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (POLLERR on its write end).

    A BrokenPipeError may come from a socket too; only a closed stdout is ended quietly.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # no way to tell here: take the common case, a closed pipe
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _quiet_after_closed_stdout() -> int:
    """End like a Unix tool whose reader went away: no message, status 141.

    What is still buffered for stdout would fail again when the interpreter flushes it at exit
    ("Exception ignored ... BrokenPipeError"): point the descriptor at /dev/null first, as the
    Python documentation's note on SIGPIPE recommends.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_PIPE_CLOSED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Imported once the command is known: --help never needs the engine (see the module doc).
    from sessionfold.core.errors import (
        InvalidInputError,
        MissingExtraError,
        SessionfoldError,
        SessionNotFoundError,
    )

    try:
        return int(args.handler(args))
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        return _quiet_after_closed_stdout()
    except ModuleNotFoundError as exc:
        # The handler imports its role's libraries as it starts; one an extra brings is an
        # install to make, said in one line, not a traceback.
        missing = MissingExtraError.of_missing(exc, f"sessionfold {args.command}")
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return EXIT_USAGE
    except (InvalidInputError, SessionNotFoundError, MissingExtraError) as exc:
        print(f"sessionfold {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SessionfoldError as exc:
        print(f"sessionfold {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

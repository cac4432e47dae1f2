"""The ``sessionfold`` command.

Each area adds its subcommands from its own module under :mod:`sessionfold.workers.commands`
(a ``register(subparsers)`` function; every subcommand sets ``handler(args) -> int``). Bad input
and bad flags exit 2 with a one-line reason on stderr; no traceback reaches the user for an error
sessionfold raised on purpose.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from sessionfold.core.errors import InvalidInputError, SessionfoldError, SessionNotFoundError

#: Modules that register subcommands, in the order their commands are listed in ``--help``.
COMMAND_MODULES = (
    "sessionfold.workers.commands.compact",
    "sessionfold.workers.commands.store",
    "sessionfold.workers.commands.pipeline",
    "sessionfold.workers.commands.demo",
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"sessionfold: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sessionfold",
                     description="Background context compaction for long-lived LLM agents.")
    parser.add_argument("--log-level", default="WARNING",
                        help="logging level for sessionfold's own logs (default WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that area is not built (yet); its commands are absent
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args))
    except (InvalidInputError, SessionNotFoundError) as exc:
        print(f"sessionfold {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SessionfoldError as exc:
        print(f"sessionfold {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``sessionfold standin``: the stand-in model over HTTP, for an agent's own SDK to call offline.

::

    sessionfold standin                                  # echoes, at http://127.0.0.1:8787
    sessionfold standin --script replies.json            # plays replies, tool calls included
    sessionfold standin --port 0 --latency 2 --fault overloaded

It serves :class:`~sessionfold.cli.standin.fakeprovider.FakeProvider` (the Messages API with
streaming and token counting, and OpenAI chat completions, tool calls in both) until Ctrl-C or
SIGTERM; the SDKs find it through ``ANTHROPIC_BASE_URL`` and ``OPENAI_BASE_URL`` (the latter
ending in ``/v1``). Its first line names the URL (``--port 0``: a free port). No key is checked,
so it listens on the loopback address unless ``--host`` says otherwise.

A script (:mod:`~sessionfold.cli.standin.script`: a JSON list of replies) is played one reply
per agent request; once it has run out the stand-in says so on stderr and echoes. ``--fault``
answers the next requests with the API's errors, in order, before normal service resumes.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..standin.fakeprovider import FakeProvider, Fault, ReplyFn

__all__ = ["DEFAULT_PORT", "FAULTS", "register"]

#: Where the stand-in listens unless ``--port`` says otherwise (the README's example uses it).
DEFAULT_PORT = 8787
#: The errors ``--fault`` can queue, by name (:func:`_faults` makes them).
FAULTS = ("bad-request", "overloaded", "rate-limited", "server-error")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``standin`` subcommand."""
    standin = subparsers.add_parser(
        "standin", help="run the stand-in model for your agent's SDK, offline (no key)",
        description="Serve the stand-in model (the Messages API and OpenAI chat completions, "
                    "streaming and tool calls included) until Ctrl-C. Point the anthropic SDK "
                    "at it with ANTHROPIC_BASE_URL=URL, the openai SDK with "
                    "OPENAI_BASE_URL=URL/v1; any API key is taken. It echoes each request "
                    "unless --script gives replies.")
    standin.add_argument(
        "--script", type=Path, default=None, metavar="FILE",
        help='a JSON list of replies played one per request, e.g. [{"tool_calls": [{"name": '
             '"read_log", "input": {"page": 1}}]}, {"text": "Done."}]; a reply is a string, '
             "or text and/or tool_calls; once played out, the stand-in echoes")
    standin.add_argument("--port", type=_port, default=DEFAULT_PORT,
                         help=f"port (0: a free one; default {DEFAULT_PORT})")
    standin.add_argument("--host", default="127.0.0.1",
                         help="address to listen on (default 127.0.0.1: this machine only)")
    standin.add_argument("--latency", type=_seconds, default=0.0, metavar="S",
                         help="seconds each request takes (default 0)")
    standin.add_argument("--context-window", type=_tokens, default=200_000, metavar="N",
                         help="prompts over N tokens are refused as too long, in the API's "
                              "words (default 200000)")
    standin.add_argument("--fault", action="append", default=[], choices=FAULTS,
                         metavar="KIND",
                         help="answer the next request with this error: overloaded (529), "
                              "rate-limited (429), server-error (500), bad-request (400); "
                              "repeat for more, in order, then normal service")
    standin.set_defaults(handler=_standin)


def _port(text: str) -> int:
    value = _whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"from 0 to 65535, got {value}")
    return value


def _tokens(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _faults(kinds: Sequence[str]) -> list[Fault]:
    """The faults ``--fault`` named, in order."""
    from ..standin.fakeprovider import Fault

    make: Mapping[str, Callable[[], Fault]] = {
        "overloaded": Fault.overloaded,  # 529
        "rate-limited": Fault.rate_limited,  # 429, retry-after 1 s
        "server-error": Fault.server_error,  # 500
        "bad-request": Fault.bad_request,  # 400, permanent
    }
    return [make[kind]() for kind in kinds]


def _standin(args: argparse.Namespace) -> int:
    from sessionfold.core.errors import InvalidInputError

    from ..standin.fakeprovider import FakeProvider, FakeProviderServer
    from ..standin.script import load_script

    provider = FakeProvider(context_window=args.context_window, latency_s=args.latency)
    plays = "echoes every request"
    if args.script is not None:
        replies = load_script(args.script)
        provider.script_reply(*replies)
        provider.reply = _echo_when_played(provider, args.script.name)
        plays = f"plays the {len(replies)} replies of {args.script.name}, then echoes"
    provider.script(*_faults(args.fault))
    try:
        server = FakeProviderServer(provider, args.host, args.port)
    except OSError as exc:  # a busy port, an address this host does not have
        raise InvalidInputError(f"cannot listen on {args.host} port {args.port}: "
                                f"{exc.strerror or exc}") from None
    server.start()
    try:
        _announce(server.base_url, plays, args)
        _wait_for_stop()
    finally:
        server.stop()
    stats = provider.stats
    print(f"sessionfold standin: stopped after {stats.calls:,} request(s), "
          f"{stats.succeeded:,} answered", file=sys.stderr, flush=True)
    return 0


def _echo_when_played(provider: FakeProvider, name: str) -> ReplyFn:
    """The reply once the script is played out (and to summarizer requests): an echo, the
    first one announced on stderr, so a user sees why the agent's run took another turn."""
    from ..standin.fakeprovider import echo_reply

    told = threading.Lock()
    announced = False

    def reply(request: Mapping[str, Any]) -> str:
        nonlocal announced
        with told:
            if not announced and provider.replies_left == 0:
                announced = True
                print(f"sessionfold standin: every reply of {name} is played; echoing from "
                      "now on", file=sys.stderr, flush=True)
        return echo_reply(request)

    return reply


def _announce(url: str, plays: str, args: argparse.Namespace) -> None:
    from ..hosts import is_loopback

    lines = [f"sessionfold standin: {url} ({plays}; Ctrl-C stops it)",
             f"  anthropic SDK: ANTHROPIC_BASE_URL={url} ANTHROPIC_API_KEY=standin",
             f"  openai SDK:    OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY=standin"]
    if args.fault:
        lines.append(f"  the first {len(args.fault)} request(s) answer: {', '.join(args.fault)}")
    print("\n".join(lines), flush=True)
    if not is_loopback(args.host):
        print(f"sessionfold standin: WARNING: listening on {args.host}: anyone who reaches it "
              "is answered, no key checked", file=sys.stderr, flush=True)


def _wait_for_stop() -> None:
    """Block until Ctrl-C or SIGTERM (a supervisor's or a test's stop), both a clean end.

    SIGINT is handled here rather than left to KeyboardInterrupt: a script's background job
    (``sessionfold standin &`` without job control) starts with SIGINT ignored, and Python then
    never raises it.
    """
    stop = threading.Event()
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in stops}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

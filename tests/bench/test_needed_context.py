"""B1's needed-context recall measure and its identifier digest summarizer (bench/b1/needed.py).

Pure functions, checked on hand-made messages and on the shared transcripts: the
no-compaction baseline holds every needed identifier on every call, a window that forgets the
past does not, and the aggregation counts from each transcript's first compaction.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from b1.baseline import NoCompaction  # noqa: E402
from b1.counting import Counter  # noqa: E402
from b1.fakes import FakeSummarizer  # noqa: E402
from b1.needed import (  # noqa: E402
    DIGEST_EMPTY,
    DIGEST_HEADING,
    digest_summary,
    first_compaction,
    identifiers,
    mentioned,
    message_text,
    named_identifiers,
    need_sets,
    recall_totals,
    request_recall,
)
from b1.replay import Env  # noqa: E402
from b1.transcripts import Transcript, load_transcripts  # noqa: E402

Message = Mapping[str, Any]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def counter() -> Counter:
    return Counter()


@pytest.fixture(scope="module")
def transcripts() -> list[Transcript]:
    return load_transcripts()


# --- identifiers ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("open django/db/models/sql/query.py now", ["django/db/models/sql/query.py"]),
    ("cd /testbed/src/_pytest", ["testbed/src/_pytest"]),
    ("run ./tests/runtests.py.", ["tests/runtests.py"]),
    ("self.alias_map[alias]", ["self.alias_map"]),
    ("edit base.py then", ["base.py"]),
    ("alias_map and _pytest and __init__", ["alias_map", "_pytest", "__init__"]),
    ("FilteredRelation, getState, HTTPError", ["FilteredRelation", "getState", "HTTPError"]),
    ("account ACCT-90417 on 2024-01-15", ["90417", "2024"]),
    ("line 12345 of 3.14159", ["12345", "14159"]),
    ("on 10/24/2024", ["2024"]),
])
def test_identifiers_are_paths_dotted_names_long_snake_and_camel_names_and_long_numbers(
        text: str, expected: list[str]) -> None:
    assert identifiers(text) == expected


@pytest.mark.parametrize("text", [
    "and/or", "10/24/24", "e.g. i.e.", "a_b abc_d", "Django README HTTP", "sha256 v1.2.3",
    "123 0.5", "the quick brown fox", "~/x.py",
])
def test_prose_short_names_dates_and_versions_are_not_identifiers(text: str) -> None:
    assert identifiers(text) == []


def test_identifiers_are_distinct_in_order_of_first_mention() -> None:
    assert identifiers("alias_map then base.py then alias_map") == ["alias_map", "base.py"]


@pytest.mark.parametrize(("text", "identifier", "expected"), [
    ("self.alias_map = {}", "alias_map", True),
    ("see sql/query.py:12", "query.py", True),
    ("ACCT-90417", "90417", True),
    ("id 190417", "90417", False),
    ("alias_maps", "alias_map", False),
    ("Alias_Map", "alias_map", False),
    ("x alias_mapx alias_map", "alias_map", True),
])
def test_an_identifier_is_present_only_between_non_word_characters(
        text: str, identifier: str, expected: bool) -> None:
    assert mentioned(text, identifier) is expected


def test_a_message_says_its_text_tool_calls_tool_output_and_thinking() -> None:
    message = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "check FilteredRelation", "signature": "sig"},
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "t", "name": "str_replace_editor",
         "input": {"path": "/testbed/a/b.py", "new_str": "x\nself.alias_map = 1"}},
    ]}
    said = message_text(message)
    assert identifiers(said) == ["FilteredRelation", "str_replace_editor", "testbed/a/b.py",
                                 "new_str", "self.alias_map"]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                           "content": [{"type": "text", "text": "ok 90417"}]}]}
    assert identifiers(message_text(result)) == ["90417"]


# --- need and recall -----------------------------------------------------------------------------

def test_need_holds_what_the_answer_names_that_an_earlier_message_named() -> None:
    messages = [
        user("Fix FilteredRelation in django/db/models/sql/query.py"),
        assistant("Opening django/db/models/sql/query.py to read alias_map."),
        user("alias_map = {}"),
        assistant("alias_map and FilteredRelation matter; MyNewHelper is new."),
    ]
    assert need_sets(messages) == [
        frozenset({"django/db/models/sql/query.py"}),
        frozenset({"alias_map", "FilteredRelation"}),
    ]


def test_a_request_is_scored_on_what_it_holds_and_names_what_it_lacks() -> None:
    need = frozenset({"alias_map", "FilteredRelation", "query.py"})
    result = request_recall(need, "You edit query.py files.",
                            [user("the FilteredRelation bug"), assistant("ok")])
    assert (result.needed, result.present, result.missing) == (3, 2, ("alias_map",))
    assert result.recall == pytest.approx(2 / 3)
    assert request_recall(frozenset(), "", []).recall == 1.0


def _replay_requests(transcript: Transcript, window: int | None,
                     counter: Counter) -> list[tuple[str, list[Message]]]:
    """The requests of the baseline (``window=None``), or of a window that keeps the task and
    the last ``window`` messages (a forgetful compactor)."""
    env = Env(counter=counter, summarizer=FakeSummarizer(counter=counter, time_scale=0.0),
              time_scale=0.0)
    session = NoCompaction().session(transcript, 0, env)
    requests = []
    for message in transcript.messages:
        if message["role"] == "assistant":
            sent = list(session.request().messages)
            if window is not None and len(sent) > window + 1:
                sent = sent[:1] + sent[-window:]
            requests.append((transcript.system, sent))
        session.append(message)
    return requests


def test_the_no_compaction_baseline_holds_every_needed_identifier_on_every_call(
        transcripts: list[Transcript], counter: Counter) -> None:
    for transcript in transcripts:
        need = need_sets(transcript.messages)
        requests = _replay_requests(transcript, None, counter)
        assert len(need) == len(requests) == transcript.calls
        scored = [request_recall(n, system, msgs) for n, (system, msgs) in zip(need, requests,
                                                                                strict=True)]
        assert sum(r.needed for r in scored) > 100, transcript.id
        assert all(r.present == r.needed for r in scored), transcript.id


def test_a_window_that_forgets_the_past_loses_needed_identifiers(
        transcripts: list[Transcript], counter: Counter) -> None:
    transcript = next(t for t in transcripts if t.id == "django__django-16560")
    need = need_sets(transcript.messages)
    scored = [request_recall(n, s, m)
              for n, (s, m) in zip(need, _replay_requests(transcript, 4, counter), strict=True)]
    needed = sum(r.needed for r in scored)
    present = sum(r.present for r in scored)
    assert 0 < present < needed
    assert any(r.missing for r in scored)


# --- aggregation ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    needed: int
    present: int
    tokens: int
    cached: int


def test_the_first_compaction_is_the_first_request_that_does_not_extend_the_previous() -> None:
    growing = [Call(1, 1, 100, 0), Call(1, 1, 150, 100), Call(1, 1, 200, 150)]
    assert first_compaction(growing) is None
    folded = [*growing, Call(1, 1, 90, 40), Call(1, 1, 120, 90)]
    assert first_compaction(folded) == 3


def test_totals_are_micro_averages_overall_and_from_the_first_compaction_on() -> None:
    baseline = [Call(4, 4, 100, 0), Call(2, 2, 150, 100)]
    compacted = [Call(2, 2, 100, 0), Call(0, 0, 150, 100), Call(4, 1, 80, 20),
                 Call(6, 5, 100, 80)]
    totals = recall_totals([baseline, compacted])
    assert (totals.calls, totals.needed, totals.present) == (6, 18, 14)
    assert totals.recall == pytest.approx(14 / 18)
    assert (totals.calls_after, totals.needed_after, totals.present_after) == (2, 10, 6)
    assert totals.recall_after == pytest.approx(0.6)
    assert totals.under_half == 1  # 1 of 4; a call that needed nothing is not under half


def test_a_run_that_never_compacts_has_no_after_figure_and_nothing_needed_has_none() -> None:
    assert recall_totals([[Call(3, 3, 10, 0), Call(1, 1, 20, 10)]]).recall_after is None
    assert recall_totals([[Call(0, 0, 10, 0)]]).recall is None


def test_counts_that_cannot_be_are_refused() -> None:
    with pytest.raises(ValueError, match="present 3 of needed 2"):
        recall_totals([[Call(2, 3, 10, 0)]])


# --- the digest ----------------------------------------------------------------------------------

def test_the_digest_lists_identifiers_most_mentioned_first_then_most_recent(
        counter: Counter) -> None:
    text = "alias_map base.py alias_map FilteredRelation base.py alias_map 90417"
    assert digest_summary(text, 100, counter=counter) == (
        f"{DIGEST_HEADING} alias_map, base.py, 90417, FilteredRelation.")


def test_the_digest_never_exceeds_its_cap_and_is_deterministic(
        counter: Counter, transcripts: list[Transcript]) -> None:
    text = "\n".join(message_text(m) for m in transcripts[0].messages[:80])
    for cap in (1, 5, 17, 60, 300, 1000):
        digest = digest_summary(text, cap, counter=counter)
        assert counter.text(digest) <= cap
        assert digest == digest_summary(text, cap, counter=counter)
    top = digest_summary(text, 300, counter=counter)
    assert top.startswith(DIGEST_HEADING) and counter.text(top) > 250
    ranked = top[len(DIGEST_HEADING):].strip(" .").split(", ")
    assert all(mentioned(text, i) for i in ranked)
    assert len(ranked) > 20


def test_a_text_without_identifiers_digests_to_a_sentence_saying_so(counter: Counter) -> None:
    assert digest_summary("nothing to see here", 50, counter=counter) == DIGEST_EMPTY
    assert counter.text(digest_summary("nothing", 3, counter=counter)) <= 3


def test_an_identifier_too_long_for_the_rest_of_the_cap_gives_way_to_shorter_ones(
        counter: Counter) -> None:
    long_path = "a/" * 60 + "deep.py"
    text = f"{long_path} {long_path} short_name"
    digest = digest_summary(text, counter.text(DIGEST_HEADING) + 6, counter=counter)
    assert digest == f"{DIGEST_HEADING} short_name."


def test_the_digest_lists_only_identifiers_the_conversation_named(counter: Counter) -> None:
    conversation = [user("Fix FilteredRelation in django/db/models/sql/query.py"),
                    assistant("alias_map is the culprit")]
    named = named_identifiers(conversation)
    assert named == {"FilteredRelation", "django/db/models/sql/query.py", "alias_map"}
    # A framework's wrapping (event class names, tool-call ids) is not the agent's identifier.
    material = ("ActionEvent ActionEvent tool_call_id=toolu_01XyzAbc alias_map "
                "ObservationEvent FilteredRelation")
    assert digest_summary(material, 100, counter=counter, only=named) == (
        f"{DIGEST_HEADING} FilteredRelation, alias_map.")
    assert "ActionEvent" in digest_summary(material, 100, counter=counter)
    assert digest_summary("ActionEvent only", 100, counter=counter, only=named) == DIGEST_EMPTY


def test_the_fake_summarizer_digests_its_material_not_its_prompt(counter: Counter) -> None:
    fake = FakeSummarizer(counter=counter, time_scale=0.0)
    fake.vocabulary = frozenset({"alias_map", "mod_float"})
    prompt = "Example: Modified mod_float() in card.py.\n<messages>alias_map</messages>"
    assert fake.summarize(prompt, "alias_map") == f"{DIGEST_HEADING} alias_map."
    (call,) = fake.calls
    assert call.input_tokens == counter.text(prompt)  # billed for the whole prompt
    assert call.output_tokens == counter.text(f"{DIGEST_HEADING} alias_map.")


def test_the_digest_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        digest_summary("alias_map", 0)

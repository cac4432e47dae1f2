"""Token estimates, the per-session calibration, and the provider-reported prompt size."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import pytest
import sessionfold.core.tokens as tokens_module
from anthropic.types import Usage
from hypothesis import given
from hypothesis import strategies as st
from sessionfold.core.errors import InvalidUsageError, UsageUnmeasurableError
from sessionfold.core.messages import (
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from sessionfold.core.tokens import (
    BLOCK_OVERHEAD,
    DOCUMENT_TOKENS,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    PDF_BYTES_PER_PAGE,
    PDF_MAX_PAGES,
    PDF_PAGE_TOKENS,
    Calibration,
    TokenCounter,
    count_text,
    default_counter,
    reported_prompt_tokens,
)

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"

# --- estimates -----------------------------------------------------------------------------------

def test_count_text_uses_the_offline_encoding() -> None:
    assert count_text("") == 0
    assert count_text("hello world") == 2
    # Special-token text is counted as plain text, never raises.
    assert count_text("<|endoftext|>") > 1


def _tiktoken(text: str) -> int:
    """The encoder's own count, with no shortcut of this module's."""
    return len(tokens_module._encoding().encode_ordinary(text))


# ASCII texts the way tool output and the layers' lines look: words, numbers with separators,
# runs of spaces and line breaks, contractions, punctuation next to digits.
_ascii_piece = st.one_of(
    st.text(alphabet="abcXYZ'_-.,:;#[](){}/\\\"$%+=*", min_size=1, max_size=6),
    st.integers(min_value=0, max_value=10**12).map(str),
    st.integers(min_value=0, max_value=10**9).map(lambda n: f"{n:,}"),
    st.sampled_from([" ", "  ", "\n", "\r\n", "\t", " \n ", "'s", "'ll", "0", "007"]),
)


@given(st.lists(_ascii_piece, max_size=30).map("".join))
def test_short_ascii_texts_count_exactly_what_tiktoken_counts(text: str) -> None:
    # count_text counts short ASCII texts by their shape (digit runs written as one digit): the
    # shortcut must never change a count.
    assert count_text(text) == _tiktoken(text)


def test_every_short_transcript_string_counts_exactly_what_tiktoken_counts() -> None:
    from sessionfold.cli.files import load_conversation_file

    checked = 0
    for path in sorted(TRANSCRIPTS.glob("*.json")):
        for message in load_conversation_file(path).messages:
            for block in message.blocks():
                for text in (getattr(block, "text", None), getattr(block, "content", None)):
                    if not isinstance(text, str):
                        continue
                    for line in [text, *text.splitlines(keepends=True)]:
                        if len(line) <= 256 and line.isascii():
                            assert count_text(line) == _tiktoken(line), line
                            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("text", ["\u00b2123", "1\u00b234567", "x \u0663\u0663 12,345 \u00bd9"])
def test_texts_where_other_numerals_join_a_digit_run_count_exactly(text: str) -> None:
    # "²123" is one run of four numerals to cl100k (pieces "²12" and "3"): its shape would not
    # count it, so non-ASCII texts are always counted whole.
    assert count_text(text) == _tiktoken(text)


def test_layer_lines_count_exactly_whatever_their_numbers() -> None:
    from sessionfold.core.layers import MASK_TAG

    for size, seq in [(0, 0), (400, 7), (12_345, 193), (9_999_999, 1_000_001), (10**12, 5)]:
        stub = f"{MASK_TAG} to save context: {size:,} characters; ledger #{seq} holds it whole.]"
        assert count_text(stub) == _tiktoken(stub)


def test_message_framing_is_added_per_message_and_per_block() -> None:
    counter = TokenCounter()
    text = "The quick brown fox jumps over the lazy dog."
    one = Message(role="user", content=[TextBlock(text=text)])
    two = Message(role="user", content=[TextBlock(text=text), TextBlock(text=text)])
    assert counter.message(one) == MESSAGE_OVERHEAD + BLOCK_OVERHEAD + count_text(text)
    assert counter.message(two) == MESSAGE_OVERHEAD + 2 * (BLOCK_OVERHEAD + count_text(text))


@pytest.mark.parametrize("length", [1, 10, 63, 64, 65, 500])
def test_string_content_counts_like_one_text_block(length: int) -> None:
    text = ("abc " * 200)[:length]
    counter = TokenCounter()
    assert counter.message(Message(role="user", content=text)) == counter.message(
        Message(role="user", content=[TextBlock(text=text)]))


def test_tool_blocks_and_images_are_counted() -> None:
    counter = TokenCounter()
    call = Message(role="assistant", content=[
        ToolUseBlock(id="t1", name="bash", input={"command": "ls -la"})])
    result = Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="x " * 300)])
    image = Message(role="user", content=[ImageBlock(source={"type": "base64", "data": "A"})])
    assert counter.message(call) > MESSAGE_OVERHEAD + BLOCK_OVERHEAD + count_text("bash")
    assert counter.message(result) >= 300
    assert counter.message(image) == MESSAGE_OVERHEAD + BLOCK_OVERHEAD + IMAGE_TOKENS


def pdf(size: int) -> Message:
    """A user message holding a base64 PDF of ``size`` bytes."""
    data = "A" * ((4 * size + 2) // 3)  # base64 carries three bytes in four characters
    return Message(role="user", content=[DocumentBlock(source={
        "type": "base64", "media_type": "application/pdf", "data": data})])


def document_tokens(message: Message) -> int:
    return TokenCounter().message(message) - MESSAGE_OVERHEAD - BLOCK_OVERHEAD


def test_a_base64_pdf_is_estimated_from_its_size_page_by_page() -> None:
    # Each page is billed as its text and an image of it; a page is taken per 32 KiB begun.
    assert PDF_PAGE_TOKENS == DOCUMENT_TOKENS + IMAGE_TOKENS
    assert document_tokens(pdf(900)) == PDF_PAGE_TOKENS
    assert document_tokens(pdf(PDF_BYTES_PER_PAGE)) == PDF_PAGE_TOKENS
    assert document_tokens(pdf(PDF_BYTES_PER_PAGE + 1)) == 2 * PDF_PAGE_TOKENS
    # The 3 MB "200-page contract" that used to count as 1,500 tokens.
    assert document_tokens(pdf(3_000_000)) == 92 * PDF_PAGE_TOKENS


def test_a_pdf_estimate_stops_at_the_pages_one_request_may_hold() -> None:
    assert document_tokens(pdf(40_000_000)) == PDF_MAX_PAGES * PDF_PAGE_TOKENS


def test_a_text_document_counts_as_its_text_and_one_given_by_reference_as_a_page() -> None:
    text = DocumentBlock(source={"type": "text", "media_type": "text/plain",
                                 "data": "the spec says " * 500})
    assert document_tokens(Message(role="user", content=[text])) == count_text(
        "the spec says " * 500)
    for source in ({"type": "url", "url": "https://example.com/a.pdf"},
                   {"type": "file", "file_id": "file_011"}):
        by_reference = Message(role="user", content=[DocumentBlock(source=source)])
        assert document_tokens(by_reference) == DOCUMENT_TOKENS


def test_counts_are_cached_by_content_and_the_cache_is_bounded() -> None:
    counter = TokenCounter(cache_size=2)
    msgs = [Message(role="user", content=f"message number {i} " * 10) for i in range(4)]
    first = [counter.message(m) for m in msgs]
    assert len(counter._cache) == 2
    assert [counter.message(m) for m in msgs] == first
    assert counter.messages(msgs) == sum(first)
    # An equal message built separately hits the same entry.
    assert counter.message(Message(role="user", content="message number 3 " * 10)) == first[3]


def test_system_prompt_tokens() -> None:
    counter = default_counter()
    assert counter.system("") == 0
    assert counter.system("You are terse.") == count_text("You are terse.") + MESSAGE_OVERHEAD
    assert default_counter() is counter


def test_system_prompt_counts_are_remembered_a_few_at_a_time_from_many_threads() -> None:
    # Counts are kept by text (a worker counts the same long prompt on every visit), at most
    # _SYSTEMS_KEPT of them; threads dropping the oldest at once never fail a count.
    import threading

    tokens = importlib.import_module("sessionfold.core.tokens")

    counter = TokenCounter()
    prompts = [f"You are agent {i}. " * 50 for i in range(300)]
    expected = {p: count_text(p) + MESSAGE_OVERHEAD for p in prompts}
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for p in prompts[offset:] + prompts[:offset]:
                assert counter.system(p) == expected[p]
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k * 37,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 0 < len(counter._systems) <= tokens._SYSTEMS_KEPT + 8


# --- calibration ---------------------------------------------------------------------------------

def test_uncalibrated_prediction_is_the_estimate() -> None:
    assert Calibration().predict(12_345) == 12_345


def test_first_sample_sets_the_ratio() -> None:
    cal = Calibration().observe(10_000, 13_000)
    assert (cal.a, cal.b, cal.samples) == (1.3, 0.0, 1)
    assert cal.predict(20_000) == 26_000


def test_fits_slope_and_offset_of_a_linear_relation() -> None:
    cal = Calibration()
    for x in [10_000, 20_000, 30_000, 40_000, 15_000] * 4:
        cal = cal.observe(x, 1.2 * x + 3_000)
    assert cal.a == pytest.approx(1.2)
    assert cal.b == pytest.approx(3_000)
    assert cal.predict(25_000) == 33_000


def test_without_spread_the_slope_holds_and_predictions_match() -> None:
    cal = Calibration()
    for _ in range(10):
        cal = cal.observe(10_000, 14_000)
    assert cal.predict(10_000) == 14_000


@pytest.mark.parametrize(("estimate", "reported"), [
    (0, 1000), (1000, 0), (-5, 1000), (1000, -5), (math.nan, 1000), (1000, math.nan),
    (math.inf, 1000), (1000, math.inf), (3e155, 1000), (1000, 2e9),
])
def test_zero_negative_and_non_finite_samples_are_ignored(estimate: float,
                                                          reported: float) -> None:
    fresh = Calibration()
    assert fresh.observe(estimate, reported) is fresh
    fitted = Calibration().observe(10_000, 12_000).observe(20_000, 23_000)
    assert fitted.observe(estimate, reported) is fitted


def test_slope_and_offset_are_clamped() -> None:
    cal = Calibration()
    for _ in range(20):
        cal = cal.observe(10_000, 1_000_000)
    assert (cal.a, cal.b) == (Calibration.A_MAX, Calibration.B_MAX)
    low = Calibration().observe(10_000, 10)
    assert low.a == Calibration.A_MIN


def test_calibration_round_trips_through_json() -> None:
    cal = Calibration().observe(10_000, 12_000).observe(30_000, 33_000)
    assert Calibration(**cal.to_json()) == cal


_sample = st.tuples(
    st.one_of(st.floats(allow_nan=True, allow_infinity=True),
              st.integers(min_value=-10, max_value=10**7)),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True),
              st.integers(min_value=-10, max_value=10**7)),
)


@given(st.lists(_sample, max_size=40), st.integers(min_value=0, max_value=10**7))
def test_any_sample_stream_keeps_the_fit_finite_and_clamped(samples: list[tuple[Any, Any]],
                                                            estimate: int) -> None:
    cal = Calibration()
    for x, y in samples:
        cal = cal.observe(x, y)
    assert Calibration.A_MIN <= cal.a <= Calibration.A_MAX
    assert Calibration.B_MIN <= cal.b <= Calibration.B_MAX
    prediction = cal.predict(estimate)
    assert isinstance(prediction, int) and prediction >= 0


@given(st.lists(_sample, max_size=20), _sample)
def test_observe_json_is_observe_on_the_stored_form(samples: list[tuple[Any, Any]],
                                                     last: tuple[Any, Any]) -> None:
    """The batch write's path (the stored JSON in, the stored JSON out) gives what the models
    give, sample for sample, through a JSON round trip as the store makes one."""
    import json

    cal = Calibration()
    stored: Any = cal.to_json()
    for x, y in [*samples, last]:
        cal = cal.observe(x, y)
        stored = json.loads(json.dumps(Calibration.observe_json(stored, x, y)))
        assert stored == cal.to_json()


@pytest.mark.parametrize("stored", [
    {},  # an older row's default: every field missing
    {"a": 1, "b": 0, "samples": 2, "mean_x": 10_000, "mean_y": 12_000, "var_x": 0,
     "cov_xy": 0},  # integers where floats belong (another writer's JSON)
    {"a": 1.2, "b": 0.0, "samples": 1, "mean_x": 1e4, "mean_y": 1.2e4, "var_x": 0.0,
     "cov_xy": 0.0, "extra": 1},
])
def test_observe_json_takes_other_stored_forms_through_the_models(stored: dict[str, Any]
                                                                  ) -> None:
    expected = Calibration.model_validate(stored).observe(20_000, 23_000).to_json()
    got = Calibration.observe_json(stored, 20_000, 23_000)
    assert got == expected and isinstance(got["a"], float) and isinstance(got["samples"], int)


def test_observe_json_of_an_unusable_sample_keeps_the_stored_values() -> None:
    stored = Calibration().observe(10_000, 12_000).to_json()
    kept = Calibration.observe_json(stored, 0, 12_000)
    assert kept == stored and kept is not stored  # a copy: the caller may change it


# --- reported usage ----------------------------------------------------------------------------

def test_reported_prompt_size_sums_input_and_cache_tokens() -> None:
    usage = Usage(input_tokens=100, output_tokens=5, cache_read_input_tokens=1000,
                  cache_creation_input_tokens=50)
    assert reported_prompt_tokens(usage) == 1150
    assert reported_prompt_tokens({"input_tokens": 100, "cache_read_input_tokens": None,
                                   "output_tokens": 9}) == 100


def test_openai_prompt_tokens_are_read() -> None:
    assert reported_prompt_tokens({"prompt_tokens": 4321, "completion_tokens": 10}) == 4321


@pytest.mark.parametrize("usage", [
    Usage(input_tokens=0, output_tokens=5),
    {"input_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    {},
    None,
])
def test_a_zero_report_is_unmeasurable(usage: Any) -> None:
    with pytest.raises(UsageUnmeasurableError, match="measure='estimate'"):
        reported_prompt_tokens(usage)
    assert reported_prompt_tokens(usage, measure="estimate") is None


@pytest.mark.parametrize("usage", [
    {"input_tokens": math.nan},
    {"input_tokens": "lots"},
    {"input_tokens": 10, "cache_read_input_tokens": math.inf},
    {"input_tokens": 10, "cache_creation_input_tokens": -3},
])
def test_a_count_that_is_no_count_refuses_the_report_instead_of_reading_zero(
        usage: Any) -> None:
    # A mangled report is the agent's bug to hear about: read as zero, it measured the session
    # wrong (or hid it as unmeasured) without a word.
    with pytest.raises(InvalidUsageError, match="must be a whole number of tokens"):
        reported_prompt_tokens(usage, measure="estimate")


def test_the_newer_usage_report_is_the_one_at_the_larger_revision_then_seq() -> None:
    from sessionfold.core.tokens import supersedes

    assert supersedes((3, 10), None)  # the first report stands
    assert supersedes((3, 11), (3, 10)) and supersedes((4, 0), (3, 99))
    assert supersedes((3, 10), (3, 10))  # the same request again: the later report stands
    assert not supersedes((3, 9), (3, 10)) and not supersedes((2, 99), (3, 0))


def test_a_prompt_size_is_the_three_input_counts_and_zero_is_not_a_measurement() -> None:
    from sessionfold.core.errors import UsageUnmeasurableError
    from sessionfold.core.tokens import measured_prompt_tokens, prompt_tokens

    assert prompt_tokens(120, 1000, 50) == 1170
    assert measured_prompt_tokens(1170) == 1170
    assert measured_prompt_tokens(0, measure="estimate") is None
    with pytest.raises(UsageUnmeasurableError, match="zero"):
        measured_prompt_tokens(0)
    with pytest.raises(UsageUnmeasurableError, match="more than any context window"):
        measured_prompt_tokens(10**9 + 1, measure="estimate")

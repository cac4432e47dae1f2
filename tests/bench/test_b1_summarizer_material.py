"""B1 gives sessionfold the same digest summarizer as the peers, over the same kind of material.

sessionfold's ``AnthropicSummarizer`` puts the conversation between nonce markers inside an
instruction; the fake Messages API behind it must digest what is between the markers (the previous
summary and the transcript), bill the whole prompt, and -- as a model following the instruction
would -- list the identifiers the request asks it to keep first, within its 300-token cap. The
peers' adapters check their own prompt layouts against the installed peer packages when they start
(``self_check``), since those packages live in virtualenvs of their own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sessionfold.core.messages import parse_messages
from sessionfold.core.summarizers import render_transcript
from sessionfold.runtime.providers.anthropic import AnthropicSummarizer

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from b1.counting import Counter  # noqa: E402
from b1.fakes import SUMMARY_TOKENS, FakeSummarizer  # noqa: E402
from b1.needed import DIGEST_HEADING, digest_summary  # noqa: E402
from b1.sessionfold_systems import messages_api_reply, summarizer_material  # noqa: E402

SPAN = parse_messages([
    {"role": "user", "content": "Fix FilteredRelation in django/db/models/sql/query.py"},
    {"role": "assistant", "content": "Reading alias_map and alias_map again."},
])


@pytest.fixture()
def fake() -> FakeSummarizer:
    return FakeSummarizer(counter=Counter(), time_scale=0.0)


def _body(**kwargs: object) -> dict[str, object]:
    return AnthropicSummarizer(api_key="k").build_request(SPAN, **kwargs)  # type: ignore[arg-type]


def _content(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    return "\n\n".join(str(m["content"]) for m in messages)


def test_the_material_is_the_previous_summary_and_the_transcript_between_their_markers() -> None:
    body = _body(previous_summary="Earlier: base.py was read.", must_keep=["ACCT-90417"])
    material = summarizer_material(_content(body))
    assert material == "Earlier: base.py was read.\n\n" + render_transcript(SPAN)
    assert "ACCT-90417" not in material and "Keep identifiers verbatim" not in material


def test_a_prompt_without_a_transcript_block_is_refused_not_digested_whole() -> None:
    with pytest.raises(ValueError, match="transcript"):
        summarizer_material("Summarize this: alias_map")


def test_the_reply_is_the_digest_of_the_material_billed_for_the_whole_prompt(
        fake: FakeSummarizer) -> None:
    body = _body()
    reply = messages_api_reply(fake, body)
    expected = digest_summary(render_transcript(SPAN), SUMMARY_TOKENS, counter=fake.counter)
    assert reply["content"] == [{"type": "text", "text": expected}]
    assert expected.startswith(DIGEST_HEADING) and "alias_map" in expected
    prompt = "\n\n".join([str(body["system"]), _content(body)])
    assert reply["usage"]["input_tokens"] == fake.counter.text(prompt) > \
        fake.counter.text(render_transcript(SPAN))


def test_identifiers_asked_for_come_first_and_once_within_the_same_cap(
        fake: FakeSummarizer) -> None:
    text = messages_api_reply(fake, _body(must_keep=["alias_map", "ACCT-90417"]))[
        "content"][0]["text"]
    listed = text.removeprefix(DIGEST_HEADING).strip(" .").split(", ")
    assert listed[:2] == ["alias_map", "ACCT-90417"]  # asked for, listed first
    assert text.count("alias_map") == 1
    # Asked for more than a summary holds, the digest keeps to its cap: a span denser in
    # identifiers than that loses some, as it would with a model.
    many = [f"module_{n}.handler_{n}" for n in range(400)]
    capped = messages_api_reply(fake, _body(must_keep=many))["content"][0]["text"]
    assert fake.counter.text(capped) <= SUMMARY_TOKENS
    assert "module_0.handler_0" in capped and "module_399.handler_399" not in capped

"""Which shape an append is in, read as session files are read; system messages in an append."""

from __future__ import annotations

from typing import Any

import pytest
from sessionfold.client.shapes import detect_shape, openai_append
from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.session_files import load_conversation

SERVER_TOOL = {"role": "assistant", "content": [
    {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"query": "q"}},
    {"type": "text", "text": "Found."}]}
IMAGE_URL = {"role": "user", "content": [
    {"type": "text", "text": "what is this"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
REFUSAL = {"role": "assistant", "content": "", "refusal": "No."}


@pytest.mark.parametrize(("raw", "shape"), [
    ([SERVER_TOOL], "anthropic"),  # a type sessionfold keeps as given is an Anthropic block
    ([IMAGE_URL], "openai"),
    ([REFUSAL], "openai"),
    ([{"role": "assistant", "content": "x", "reasoning_content": "y"}], "openai"),
    ([{"role": "user", "content": [{"type": "text", "text": "plain"}]}], "anthropic"),
])
def test_an_append_is_read_in_the_shape_a_session_file_would_be(raw: list[Any],
                                                                shape: str) -> None:
    assert detect_shape(raw) == shape
    load_conversation(raw)  # and a session file of the same messages loads in that shape


def test_an_append_mixing_a_server_tools_block_and_an_image_url_part_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match="mix the OpenAI chat shape"):
        detect_shape([IMAGE_URL, SERVER_TOOL])


def test_a_system_message_opening_an_append_is_the_prompt_resent() -> None:
    converted = openai_append([{"role": "system", "content": "S"},
                               {"role": "user", "content": "hi"}])
    assert converted.system == "S" and len(converted.messages) == 1


def test_a_later_system_message_in_an_append_is_kept_in_place_not_taken_as_the_prompt() -> None:
    converted = openai_append([{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "yo"},
                               {"role": "system", "content": "Answer in French."}])
    assert converted.system is None
    assert converted.messages[-1].text() == "[system message]\nAnswer in French."

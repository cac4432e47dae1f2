"""The OpenAI chat shape in and out: refusals, empty replies, arguments kept as the model wrote
them, image and file parts, custom tool calls, system messages in the middle of a run, the
fields of a message, and what the chat shape cannot hold on the way out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.messages import (
    Conversation,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    dump_messages,
    parse_messages,
)
from sessionfold.core.openai_shape import (
    CUSTOM_INPUT_KEY,
    EMPTY_REPLY_TEXT,
    RAW_ARGUMENTS_KEY,
    from_openai,
    in_openai_terms,
)
from sessionfold.core.openai_write import to_openai
from sessionfold.core.session_files import load_conversation

TASK = {"role": "user", "content": "Fix the login bug."}


def call(arguments: Any, call_id: str = "c1", name: str = "run") -> dict[str, Any]:
    """An assistant message making one function call with ``arguments`` as given."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def answer(call_id: str = "c1", content: Any = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def round_trip(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return to_openai(from_openai(raw))


def only_block(raw: list[dict[str, Any]], index: int = -1) -> Any:
    (block,) = from_openai(raw).messages[index].blocks()
    return block


# --- refusals and empty replies ----------------------------------------------------------------

def test_an_assistant_refusal_is_kept_as_the_messages_text() -> None:
    refusal = {"role": "assistant", "content": None, "refusal": "I cannot help with that."}
    block = only_block([TASK, refusal])
    assert block == TextBlock(text="I cannot help with that.")
    assert round_trip([TASK, refusal])[-1] == {"role": "assistant",
                                               "content": "I cannot help with that."}


def test_a_refusal_part_of_an_assistant_content_list_is_text_too() -> None:
    reply = {"role": "assistant", "content": [
        {"type": "text", "text": "Partly:"}, {"type": "refusal", "refusal": "not that part."}]}
    assert [b.text for b in from_openai([TASK, reply]).messages[-1].blocks()
            if isinstance(b, TextBlock)] == ["Partly:", "not that part."]


@pytest.mark.parametrize("content", ["", None, "  \n"])
def test_an_empty_assistant_reply_is_stored_in_sessionfolds_words(content: Any) -> None:
    raw = [TASK, {"role": "assistant", "content": content}, {"role": "user", "content": "hello?"}]
    conv = from_openai(raw)
    assert conv.messages[1].blocks() == [TextBlock(text=EMPTY_REPLY_TEXT)]
    assert to_openai(conv)[1] == {"role": "assistant", "content": EMPTY_REPLY_TEXT}


def test_an_empty_assistant_message_with_tool_calls_is_only_its_calls() -> None:
    raw = [TASK, {**call('{"cmd": "ls"}'), "content": ""}]
    assert [b.type for b in from_openai(raw).messages[1].blocks()] == ["tool_use"]


def test_an_empty_user_message_is_still_refused_naming_it() -> None:
    with pytest.raises(InvalidMessageError) as info:
        from_openai([TASK, {"role": "assistant", "content": "ok"},
                     {"role": "user", "content": ""}])
    assert (info.value.index, info.value.field) == (2, "content")


# --- arguments as the model wrote them -----------------------------------------------------------

@pytest.mark.parametrize("arguments", [
    '{"cmd": "ls -la /very/long/pa',  # cut off mid-call
    "[1,2]",
    "[1, 2]",
    '"just a string"',
    "42",
    "not json at all",
    '{"a": 1} trailing',
])
def test_arguments_that_are_not_a_json_object_are_kept_as_the_text_the_model_wrote(
        arguments: str) -> None:
    raw = [TASK, call(arguments), answer()]
    block = from_openai(raw).messages[1].blocks()[0]
    assert isinstance(block, ToolUseBlock)
    assert block.input == {RAW_ARGUMENTS_KEY: arguments}  # an object, as the Messages API wants
    assert round_trip(raw)[1]["tool_calls"][0]["function"]["arguments"] == arguments


def test_object_arguments_are_the_tool_input_and_written_back_as_the_same_object() -> None:
    raw = [TASK, call('{"cmd":"ls","n":1}'), answer()]
    block = from_openai(raw).messages[1].blocks()[0]
    assert isinstance(block, ToolUseBlock) and block.input == {"cmd": "ls", "n": 1}
    written = round_trip(raw)[1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(written) == {"cmd": "ls", "n": 1}


@pytest.mark.parametrize("arguments", [
    json.dumps({RAW_ARGUMENTS_KEY: "x"}),
    json.dumps({CUSTOM_INPUT_KEY: "x"}),
])
def test_an_object_shaped_like_kept_text_is_kept_as_text_so_it_comes_back_the_same(
        arguments: str) -> None:
    raw = [TASK, call(arguments), answer()]
    written = round_trip(raw)[1]["tool_calls"][0]
    assert written == {"id": "c1", "type": "function",
                       "function": {"name": "run", "arguments": arguments}}


@pytest.mark.parametrize("arguments", [None, ""])
def test_absent_or_empty_arguments_are_no_arguments(arguments: Any) -> None:
    block = only_block([TASK, call(arguments)])
    assert isinstance(block, ToolUseBlock) and block.input == {}


def test_kept_arguments_text_is_held_to_the_text_rules() -> None:
    with pytest.raises(InvalidMessageError) as info:
        from_openai([TASK, call('{"cmd": "\ud800')])
    assert (info.value.index, info.value.field) == (1, "tool_calls[0].function.arguments")


@given(st.text(max_size=40))
def test_any_arguments_text_comes_back_as_it_went_in_or_as_the_same_object(text: str) -> None:
    try:
        conv = from_openai([TASK, call(text)])
    except InvalidMessageError:
        return  # a lone surrogate, a number past the digit limit: refused, never altered
    written = to_openai(conv)[1]["tool_calls"][0]["function"]["arguments"]
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and written != text:
        assert json.loads(written) == value
    elif text:
        assert written == text


# --- image and file parts ----------------------------------------------------------------------

IMAGE_DATA = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
IMAGE_LINK = {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}
PDF = {"type": "file", "file": {"filename": "spec.pdf",
                                "file_data": "data:application/pdf;base64,JVBERi0xLjc="}}


def test_image_url_parts_become_image_blocks_and_come_back() -> None:
    user = {"role": "user", "content": [{"type": "text", "text": "What are these?"},
                                        IMAGE_DATA, IMAGE_LINK]}
    blocks = from_openai([user]).messages[0].blocks()
    assert blocks[1] == ImageBlock(source={"type": "base64", "media_type": "image/png",
                                           "data": "iVBORw0KGgo="})
    assert blocks[2] == ImageBlock(source={"type": "url", "url": "https://example.com/cat.jpg"})
    assert round_trip([user]) == [user]


def test_an_image_parts_detail_is_not_kept() -> None:
    user = {"role": "user", "content": [
        {"type": "image_url", "image_url": {**IMAGE_LINK["image_url"], "detail": "high"}}]}
    assert round_trip([user]) == [{"role": "user", "content": [IMAGE_LINK]}]


def test_a_pdf_file_part_becomes_a_document_block_and_comes_back() -> None:
    user = {"role": "user", "content": [PDF, {"type": "text", "text": "Summarize it."}]}
    block = from_openai([user]).messages[0].blocks()[0]
    assert isinstance(block, DocumentBlock)
    assert block.model_dump(mode="json", exclude_unset=True) == {
        "type": "document", "title": "spec.pdf",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjc="}}
    assert round_trip([user]) == [user]


@pytest.mark.parametrize(("part", "field", "words"), [
    ({"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}, "content[1]",
     "no counterpart"),
    ({"type": "file", "file": {"file_id": "file-abc"}}, "content[1].file", "file_id"),
    ({"type": "file", "file": {"file_data": "data:text/csv;base64,YSxi"}},
     "content[1].file.file_data", "PDF"),
    ({"type": "file", "file": {"file_data": "JVBERi0xLjc="}}, "content[1].file.file_data",
     "data URL"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,raw"}},
     "content[1].image_url.url", "base64"),
    ({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}},
     "content[1].image_url.url", "data:image/"),
    ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
     "content[1].image_url.url", "http(s)"),
    ({"type": "input_text", "text": "x"}, "content[1]", "'input_text' part"),
])
def test_a_part_that_does_not_convert_is_refused_naming_the_part(part: dict[str, Any],
                                                                 field: str, words: str) -> None:
    user = {"role": "user", "content": [{"type": "text", "text": "look"}, part]}
    with pytest.raises(InvalidMessageError) as info:
        from_openai([{"role": "system", "content": "s"}, user])
    assert (info.value.index, info.value.field) == (1, field)
    assert words in info.value.reason


def test_an_assistant_message_holds_text_and_refusal_parts_only() -> None:
    with pytest.raises(InvalidMessageError, match="not one assistant messages hold") as info:
        from_openai([TASK, {"role": "assistant", "content": [IMAGE_LINK]}])
    assert (info.value.index, info.value.field) == (1, "content[0]")


def test_a_tool_messages_text_parts_are_its_output() -> None:
    raw = [TASK, call("{}"), answer(content=[{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}])]
    result = from_openai(raw).messages[2].blocks()[0]
    assert isinstance(result, ToolResultBlock) and result.content == "a\nb"


def test_an_image_in_a_tool_message_is_kept_in_the_result_but_not_written_back() -> None:
    raw = [TASK, call("{}"), answer(content=[{"type": "text", "text": "screenshot:"},
                                             IMAGE_DATA])]
    result = from_openai(raw).messages[2].blocks()[0]
    assert isinstance(result, ToolResultBlock) and isinstance(result.content, list)
    assert [p.type for p in result.content] == ["text", "image"]
    assert round_trip(raw)[2] == answer(content="screenshot:")  # a tool message holds text only


# --- custom tool calls -------------------------------------------------------------------------

CUSTOM = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "custom",
     "custom": {"name": "apply_patch", "input": "*** Begin Patch\n+x\n*** End Patch"}}]}


def test_a_custom_tool_call_is_a_tool_use_and_comes_back_as_a_custom_call() -> None:
    raw = [TASK, CUSTOM, answer()]
    block = from_openai(raw).messages[1].blocks()[0]
    assert isinstance(block, ToolUseBlock) and block.name == "apply_patch"
    assert block.input == {CUSTOM_INPUT_KEY: "*** Begin Patch\n+x\n*** End Patch"}
    assert round_trip(raw) == raw


@pytest.mark.parametrize(("tool_call", "field"), [
    ({"id": "c1", "type": "custom", "custom": {"name": "apply_patch"}},
     "tool_calls[0].custom.input"),
    ({"id": "c1", "type": "custom", "custom": {"input": "x"}}, "tool_calls[0].custom"),
    ({"id": "c1", "type": "mcp", "mcp": {}}, "tool_calls[0].type"),
    ({"id": "c1", "type": "function", "function": {"arguments": "{}"}},
     "tool_calls[0].function"),
])
def test_a_tool_call_sessionfold_cannot_read_is_refused_naming_it(tool_call: dict[str, Any],
                                                                  field: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        from_openai([TASK, {"role": "assistant", "tool_calls": [tool_call]}])
    assert (info.value.index, info.value.field) == (1, field)


def test_pairing_errors_about_a_call_name_the_openai_call() -> None:
    twice = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        {"id": "c1", "type": "function", "function": {"name": "b", "arguments": "{}"}}]}
    with pytest.raises(InvalidMessageError) as info:
        from_openai([TASK, {"role": "assistant", "content": "Looking."}, twice])
    assert (info.value.index, info.value.field) == (2, "tool_calls[1].id")


def test_an_error_found_after_conversion_is_said_in_openai_terms() -> None:
    raw = [{**call("{}", call_id="c9"), "content": "First,"}]
    messages = parse_messages([{"role": "assistant", "content": [
        {"type": "text", "text": "First,"},
        {"type": "tool_use", "id": "c9", "name": "run", "input": {}}]}])
    exc = InvalidMessageError("used before", index=0, field="content[1].id")
    assert from_openai(raw).messages == messages
    readdressed = in_openai_terms(exc, raw)
    assert (readdressed.index, readdressed.field) == (0, "tool_calls[0].id")


# --- system and developer messages, and the other fields ---------------------------------------

MIDRUN = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Refund order 1234."},
    {"role": "assistant", "content": "Refunded."},
    {"role": "system", "content": "From now on answer in French."},
    {"role": "user", "content": "And order 5678?"},
    {"role": "developer", "content": [{"type": "text", "text": "Sign as Bot."}]},
]


def test_leading_system_messages_are_the_prompt_and_later_ones_stay_in_place() -> None:
    conv = from_openai(MIDRUN)
    assert conv.system == "You are a support agent.\n\nBe brief."
    assert [(m.role, m.text()) for m in conv.messages] == [
        ("user", "Refund order 1234."),
        ("assistant", "Refunded."),
        ("user", "[system message]\nFrom now on answer in French."),
        ("user", "And order 5678?"),
        ("user", "[developer message]\nSign as Bot."),
    ]


def test_a_midrun_system_message_is_written_back_as_the_user_message_it_is_stored_as() -> None:
    back = to_openai(from_openai(MIDRUN))
    assert [m["role"] for m in back] == ["system", "user", "assistant", "user", "user", "user"]
    assert back[3] == {"role": "user",
                       "content": "[system message]\nFrom now on answer in French."}


def test_reasoning_is_kept_as_thinking_and_left_out_of_the_chat_shape() -> None:
    reply = {"role": "assistant", "content": "42.", "reasoning_content": "6 times 7.",
             "reasoning": "6 times 7."}  # vLLM sends both, the same
    conv = from_openai([TASK, reply])
    assert conv.messages[1].blocks() == [ThinkingBlock(thinking="6 times 7."),
                                         TextBlock(text="42.")]
    assert to_openai(conv)[1] == {"role": "assistant", "content": "42."}


def test_a_reply_cut_off_while_reasoning_is_its_thinking_and_not_sent_to_openai() -> None:
    conv = from_openai([TASK, {"role": "assistant", "content": None, "reasoning": "Hmm"},
                        {"role": "user", "content": "go on"}])
    assert conv.messages[1].blocks() == [ThinkingBlock(thinking="Hmm")]
    assert [m["role"] for m in to_openai(conv)] == ["user", "user"]


@pytest.mark.parametrize(("message", "field"), [
    ({"role": "assistant", "content": None,
      "function_call": {"name": "f", "arguments": "{}"}}, "function_call"),
    ({"role": "function", "name": "f", "content": "x"}, "role"),
    ({"role": "assistant", "content": "x", "reasoning": {"text": "x"}}, "reasoning"),
    ({"role": "assistant", "content": None, "refusal": 5}, "refusal"),
])
def test_a_field_the_model_would_see_and_the_ledger_cannot_hold_is_refused(
        message: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        from_openai([TASK, message])
    assert (info.value.index, info.value.field) == (1, field)


def test_fields_no_request_shows_the_model_again_are_not_kept() -> None:
    plain = {"role": "assistant", "content": "See https://example.com."}
    annotated = {**plain, "annotations": [{"type": "url_citation", "url_citation": {
        "url": "https://example.com", "title": "x", "start_index": 4, "end_index": 23}}],
        "provider_specific_fields": {"x": 1}, "function_call": None, "audio": None}
    tool = {**answer(), "name": "run"}  # a tool message's name: not part of the request
    assert from_openai([TASK, call("{}"), tool, annotated]) == from_openai(
        [TASK, call("{}"), answer(), plain])


def test_a_participant_name_is_not_kept_and_does_not_refuse_the_message() -> None:
    """Frameworks name every message's speaker (AutoGen); the stored shape has no place for
    it, so it is left out rather than refusing the conversation."""
    named = [{**TASK, "name": "alice"}, {"role": "assistant", "content": "On it.", "name": "bot"},
             {"role": "system", "content": "Be brief.", "name": "ops"}]
    plain = [TASK, {"role": "assistant", "content": "On it."},
             {"role": "system", "content": "Be brief."}]
    assert from_openai(named) == from_openai(plain)


def test_an_audio_replys_transcript_is_its_text() -> None:
    reply = {"role": "assistant", "content": None, "audio": {
        "id": "audio_1", "data": "UklG", "expires_at": 1, "transcript": "Hello there."}}
    assert only_block([TASK, reply]) == TextBlock(text="Hello there.")


# --- out: what the chat shape cannot hold ------------------------------------------------------

def test_an_assistant_message_with_nothing_the_chat_shape_holds_is_left_out() -> None:
    conv = Conversation(messages=parse_messages([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm",
                                           "signature": "sig"}]},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srv_1", "name": "web_search",
             "input": {"query": "x"}},
            {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []}]},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srv_2", "name": "web_search",
             "input": {"query": "y"}},
            {"type": "text", "text": "Found it."}]},
    ]))
    back = to_openai(conv)
    assert back == [{"role": "user", "content": "hi"}, {"role": "user", "content": "go on"},
                    {"role": "user", "content": "and?"},
                    {"role": "assistant", "content": "Found it."}]


@given(st.lists(st.sampled_from([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
    {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "ZW5j"}]},
    {"role": "assistant", "content": [{"type": "code_execution_tool_result", "tool_use_id": "x",
                                       "content": {}}]},
    {"role": "assistant", "content": "text"},
    {"role": "user", "content": [{"type": "image", "source": {"type": "file",
                                                              "file_id": "f"}}]},
]), min_size=1, max_size=8))
def test_every_written_message_has_something_openai_accepts(raw: list[dict[str, Any]]) -> None:
    for message in to_openai(Conversation(messages=parse_messages(raw, check_pairing=False))):
        assert message.get("content") or message.get("tool_calls"), message


def test_anthropic_images_and_pdfs_in_a_user_message_are_written_as_parts() -> None:
    conv = load_conversation([{"role": "user", "content": [
        {"type": "text", "text": "Compare:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                     "data": "/9j/"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": "JVBE"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "notes"}}]}])
    assert to_openai(conv) == [{"role": "user", "content": [
        {"type": "text", "text": "Compare:"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE"}}]}]


def test_a_whole_run_of_new_parts_comes_back_as_it_went_in() -> None:
    raw = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Patch this:"}, IMAGE_DATA, PDF]},
        {"role": "assistant", "content": "On it.", "tool_calls": [
            CUSTOM["tool_calls"][0],
            {"id": "c2", "type": "function",
             "function": {"name": "run", "arguments": '{"cmd": "ls -la /very/long/pa'}}]},
        answer("c1"), answer("c2", "bad args"),
        {"role": "assistant", "content": "I cannot do the rest."},
    ]
    assert round_trip(raw) == raw
    assert dump_messages(from_openai(round_trip(raw)).messages) == dump_messages(
        from_openai(raw).messages)

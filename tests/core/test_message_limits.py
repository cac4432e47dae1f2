"""What a message may hold: nesting, text, numbers, tool ids, and the empty text the API refuses.

Every message sessionfold accepts must be one the store can write and read back on both backends
and one the Messages API takes; anything else is refused at the boundary with an error naming the
message and the field (``InvalidMessageError``), never a ValueError from a decoder later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic_core
import pytest
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.errors import InvalidMessageError, ToolPairingError
from sessionfold.core.messages import (
    MAX_INT_DIGITS,
    MAX_NESTING_DEPTH,
    Message,
    TextBlock,
    ToolUseBlock,
    parse_message,
    parse_messages,
)
from sessionfold.core.openai_shape import from_openai


def nested(levels: int, leaf: Any = "leaf") -> Any:
    """A JSON object nested ``levels`` deep (``nested(1) == {"k": leaf}``)."""
    value: Any = leaf
    for _ in range(levels):
        value = {"k": value}
    return value


def call(call_id: str, tool_input: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": call_id, "name": "bash", "input": tool_input}]}


def result(*call_ids: str) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in call_ids]}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --- nesting --------------------------------------------------------------------------------------

def test_a_tool_input_nested_to_the_limit_is_accepted_and_reads_back_as_a_request() -> None:
    [task, msg] = parse_messages([user("task"), call("t1", nested(MAX_NESTING_DEPTH))])
    assert msg.to_json()["content"][1]["input"] == nested(MAX_NESTING_DEPTH)
    # Well under every decoder: wrapped in a request body (two more levels) it still decodes with
    # pydantic-core, the store's reader, which stops near 200 levels.
    body = json.dumps({"messages": [task.to_json(), msg.to_json()]})
    assert pydantic_core.from_json(body)["messages"][1] == msg.to_json()


@pytest.mark.parametrize("levels", [MAX_NESTING_DEPTH + 1, 201, 255, 256, 100_000])
def test_a_tool_input_nested_past_the_limit_is_refused_naming_message_and_field(
        levels: int) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_messages([user("task"), call("t1", nested(levels))])
    err = info.value
    assert err.index == 1
    assert err.field is not None and err.field.startswith("content[1].input")
    assert f"{MAX_NESTING_DEPTH} levels" in str(err)


def test_nesting_is_counted_in_lists_and_in_every_block_field() -> None:
    deep_list: Any = "x"
    for _ in range(MAX_NESTING_DEPTH + 1):
        deep_list = [deep_list]
    msg = {"role": "user", "content": [{"type": "text", "text": "hi", "citations": deep_list}]}
    with pytest.raises(InvalidMessageError) as info:
        parse_message(msg, 3)
    assert info.value.index == 3
    assert info.value.field is not None and info.value.field.startswith("content[0].citations")


def test_a_tool_input_that_contains_itself_is_refused() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(InvalidMessageError, match="levels"):
        parse_message(call("t1", loop))


def test_a_message_built_in_code_is_checked_like_a_parsed_one() -> None:
    built = Message(role="assistant", content=[
        ToolUseBlock(id="t1", name="bash", input=nested(MAX_NESTING_DEPTH + 1))])
    with pytest.raises(InvalidMessageError, match=r"content\[0\].input"):
        parse_message(built, 7)


def test_an_openai_tool_call_nested_past_the_limit_names_its_arguments() -> None:
    deep = json.dumps(nested(MAX_NESTING_DEPTH + 1))
    raw = [{"role": "user", "content": "task"},
           {"role": "assistant", "tool_calls": [
               {"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": deep}}]}]
    with pytest.raises(InvalidMessageError) as info:
        from_openai(raw)
    assert info.value.index == 1
    assert info.value.field == "tool_calls[0].function.arguments"


def test_openai_arguments_nested_past_pythons_recursion_limit_are_refused() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    raw = [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}]}]
    with pytest.raises(InvalidMessageError, match=r"tool_calls\[0\].function.arguments"):
        from_openai(raw)


# --- text and numbers -----------------------------------------------------------------------------

@pytest.mark.parametrize(("message", "field"), [
    (user("half a pair \ud800 here"), "content"),
    ({"role": "user", "content": [{"type": "text", "text": "x\udfff"}]}, "content[0].text"),
    (call("t1", {"path": "a\ud83d"}), "content[1].input.path"),
    (call("t1", {"k\ud800": 1}), "content[1].input"),
    (call("t\ud800", {}), "content[1].id"),
])
def test_a_lone_surrogate_anywhere_in_a_message_is_refused(message: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_message(message, 2)
    assert info.value.index == 2
    assert info.value.field == field
    assert "surrogate" in str(info.value)


def test_a_whole_emoji_is_text_not_a_surrogate() -> None:
    msg = parse_message(user("ship it \U0001f680"))
    assert msg.content == "ship it \U0001f680"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_number_json_cannot_write_is_refused(value: float) -> None:
    with pytest.raises(InvalidMessageError, match=r"content\[1\].input.x"):
        parse_message(call("t1", {"x": [1, value]}))


def test_an_integer_longer_than_the_limit_is_refused_and_one_at_it_is_kept() -> None:
    at_limit = 10 ** (MAX_INT_DIGITS - 1)
    assert len(str(at_limit)) == MAX_INT_DIGITS
    kept = parse_message(call("t1", {"n": -at_limit}))
    assert kept.to_json()["content"][1]["input"] == {"n": -at_limit}
    with pytest.raises(InvalidMessageError, match=f"{MAX_INT_DIGITS} digits"):
        parse_message(call("t1", {"n": at_limit * 10}))


def test_a_value_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match=r"content\[1\].input.when"):
        parse_message(call("t1", {"when": object()}))


def test_nul_in_message_text_is_kept() -> None:
    msg = parse_message(user("binary \x00 output"))
    assert msg.content == "binary \x00 output"


# --- tool ids -------------------------------------------------------------------------------------

def test_duplicate_tool_use_ids_in_one_message_are_refused() -> None:
    msg = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
        {"type": "tool_use", "id": "t1", "name": "b", "input": {}}]}
    with pytest.raises(ToolPairingError) as info:
        parse_message(msg, 4)
    assert (info.value.index, info.value.field) == (4, "content[1].id")
    assert "'t1'" in str(info.value) and "content[0]" in str(info.value)


def test_a_tool_use_id_used_again_later_in_the_conversation_is_refused() -> None:
    with pytest.raises(ToolPairingError) as info:
        parse_messages([user("task"), call("t1", {}), result("t1"),
                        call("t1", {}), result("t1")])
    assert (info.value.index, info.value.field) == (3, "content[1].id")
    assert "message 1" in str(info.value)


def test_two_results_answering_one_call_are_refused() -> None:
    with pytest.raises(ToolPairingError) as info:
        parse_messages([call("t1", {}), result("t1", "t1")])
    assert (info.value.index, info.value.field) == (1, "content[1].tool_use_id")
    assert "'t1'" in str(info.value)


# --- empty text -----------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    "",
    "  \n ",
    [{"type": "text", "text": ""}],
    [{"type": "text", "text": ""}, {"type": "text", "text": "\n"}],
])
def test_a_message_with_no_text_at_all_is_refused_naming_it(content: Any) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_message({"role": "user", "content": content}, 5)
    assert info.value.index == 5
    assert "empty" in str(info.value)


def test_an_empty_text_block_beside_a_tool_call_is_dropped_as_the_api_would_refuse_it() -> None:
    # The SDK itself returns such blocks (an empty text before a tool call), and agents append
    # ``response.content`` as it came: the block says nothing, and sending it is a 400.
    msg = parse_message({"role": "assistant", "content": [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]})
    assert msg.to_json() == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]}


def test_an_empty_text_part_of_a_tool_result_is_dropped() -> None:
    msg = parse_message({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1",
         "content": [{"type": "text", "text": ""}, {"type": "text", "text": "out"}]}]})
    assert msg.to_json()["content"][0]["content"] == [{"type": "text", "text": "out"}]


def test_a_tool_result_of_only_empty_text_becomes_an_empty_output() -> None:
    msg = parse_message({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": ""}]}]})
    assert msg.to_json()["content"][0]["content"] == ""


def test_an_empty_text_block_built_in_code_is_dropped_too() -> None:
    built = Message(role="assistant", content=[TextBlock(text=""), TextBlock(text="done")])
    assert parse_message(built).to_json() == {"role": "assistant", "content": [
        {"type": "text", "text": "done"}]}


# --- a single message where a list belongs --------------------------------------------------------

def test_one_message_given_for_a_list_says_to_wrap_it() -> None:
    with pytest.raises(InvalidMessageError, match=r"one message.*\[message\]"):
        parse_messages({"role": "user", "content": "hi"})


def test_a_message_given_as_a_string_says_what_a_message_is() -> None:
    # What ``list(one_message)`` hands on: the message's keys.
    with pytest.raises(InvalidMessageError) as info:
        parse_messages(["role", "content"])
    assert info.value.index == 0
    assert "'role'" in str(info.value) and "[message]" in str(info.value)


# --- session files --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "needle"), [
    ("[" * 100_000 + "]" * 100_000, "nested"),
    ('[{"role": "user", "content": "x", "n": 1' + "0" * 5000 + "}]", "digits"),
    ('{"system": "s\\ud800", "messages": [{"role": "user", "content": "x"}]}', "surrogate"),
    ('[{"role": "user", "content": "x\\udc00"}]', "surrogate"),
    ('[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", '
     '"input": {"x": 1e999}}]}]', "number"),
])
def test_a_session_file_json_cannot_hold_is_refused_with_one_reason(
        tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "session.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidMessageError) as info:
        load_conversation_file(path)
    assert needle in str(info.value)
    assert str(path) in str(info.value) or "message 0" in str(info.value)

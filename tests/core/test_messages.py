"""Messages: loading both shapes, errors that name index and field, the OpenAI adapter."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.errors import InvalidInputError, InvalidMessageError, ToolPairingError
from sessionfold.core.messages import (
    Conversation,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    check_tool_pairing,
    dump_messages,
    parse_message,
    parse_messages,
)
from sessionfold.core.openai_write import to_openai
from sessionfold.core.session_files import load_conversation

TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"


def tool_turn(call_id: str = "t1") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": call_id, "name": "bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": "a.py\nb.py"}]},
    ]


ANTHROPIC = [
    {"role": "user", "content": "List the files."},
    *tool_turn(),
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Two files.", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "ZW5j"},
        {"type": "text", "text": "Two files.", "citations": None,
         "cache_control": {"type": "ephemeral"}}]},
    {"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "notes"}},
        {"type": "text", "text": "And these?"}]},
]


# --- loading -------------------------------------------------------------------------------------

def test_anthropic_session_file_loads_and_writes_back_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"system": "You are terse.", "messages": ANTHROPIC}))
    conv = load_conversation_file(path)
    assert conv.system == "You are terse."
    assert len(conv.messages) == 5
    assert dump_messages(conv.messages) == ANTHROPIC


def test_a_bare_list_and_list_shaped_system_prompts_load() -> None:
    assert load_conversation(ANTHROPIC).system == ""
    conv = load_conversation({"system": [{"type": "text", "text": "A"},
                                         {"type": "text", "text": "B"}], "messages": ANTHROPIC})
    assert conv.system == "A\n\nB"


def test_block_helpers() -> None:
    msgs = parse_messages(ANTHROPIC)
    assert msgs[1].tool_use_ids() == ["t1"]
    assert msgs[2].tool_result_ids() == ["t1"] and msgs[2].has_tool_results()
    assert msgs[3].text() == "Two files."  # thinking is not text
    assert msgs[0].blocks() == [TextBlock(text="List the files.")]
    part_result = ToolResultBlock(tool_use_id="x", content=[TextBlock(text="a"),
                                                            TextBlock(text="b")])
    assert part_result.output_text() == "a\nb"


def test_code_built_blocks_dump_their_type_and_load_back() -> None:
    msg = Message(role="assistant", content=[
        TextBlock(text="hi"), ToolUseBlock(id="t", name="bash", input={"command": "ls"})])
    dumped = msg.to_json()
    assert [b["type"] for b in dumped["content"]] == ["text", "tool_use"]
    assert parse_message(dumped) == msg


def transcript_paths() -> list[Path]:
    paths = sorted(TRANSCRIPTS.glob("*.json"))
    assert paths, f"no transcripts under {TRANSCRIPTS}"
    return paths


@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.stem)
def test_real_transcripts_load_and_round_trip(path: Path) -> None:
    raw = json.loads(path.read_text())
    conv = load_conversation_file(path)
    assert conv.system == raw["system"]
    assert dump_messages(conv.messages) == raw["messages"]


# --- malformed input ---------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "index", "field", "words"), [
    ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], 1, "role",
     "'user' or 'assistant'"),
    ([{"role": "user"}], 0, "content", "required"),
    ([{"role": "user", "content": 5}], 0, "content", "string or a list"),
    ([{"role": "user", "content": []}], 0, "content", "empty"),
    ([{"role": "user", "content": ["text"]}], 0, "content[0]", "object"),
    ([{"role": "user", "content": [{"type": "txt", "text": "a"}]}], 0, "content[0].type",
     "did you mean 'text'"),
    ([{"role": "user", "content": [{"type": "Video!", "url": "a"}]}], 0, "content[0].type",
     "not a block type tag"),
    ([{"role": "user", "content": [{"text": "a"}]}], 0, "content[0].type", "needs a 'type'"),
    ([{"role": "user", "content": "a"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "", "name": "x",
                                         "input": {}}]}], 1, "content[0].id", "at least 1"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x",
                                         "input": ["ls"]}]}], 0, "content[0].input",
     "dictionary"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}, {
        "type": "tool_result", "tool_use_id": "a", "content": [{"type": "text"}]}]}],
     0, "content[1].content[0].text", "required"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                    "content": [{"type": "tool_use", "id": "b"}]}]}],
     0, "content[0].content[0].type", "'tool_use' block is not a tool result part"),
    ([{"role": "user", "content": [{"type": "image", "source": "a.png"}]}], 0,
     "content[0].source", "dictionary"),
    ([{"role": "user", "content": [{"type": "text"}]}], 0, "content[0].text", "required"),
])
def test_malformed_messages_name_index_and_field(raw: list[Any], index: int, field: str,
                                                 words: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_messages(raw, check_pairing=False)
    err = info.value
    assert (err.index, err.field) == (index, field)
    assert words in str(err)
    assert str(err).startswith(f"message {index}: {field}: ")
    assert "pydantic" not in str(err)


@pytest.mark.parametrize(("raw", "words"), [
    ("messages", "must be a list"),
    ([{"role": "user", "content": "a", "name": "bob"}], "unknown field(s) ['name']"),
    (["just text"], "must be an object"),
])
def test_other_malformed_input_says_what_is_wrong(raw: Any, words: str) -> None:
    with pytest.raises(InvalidMessageError, match=re.escape(words)):
        parse_messages(raw)


def test_message_errors_are_value_errors_of_the_input_branch() -> None:
    with pytest.raises(InvalidInputError):
        parse_messages([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError):
        parse_messages([{"role": "system", "content": "x"}])


@pytest.mark.parametrize(("data", "words"), [
    ({"system": "s"}, "'messages' list"),
    ({"messages": {"a": 1}}, "must be a list"),
    (42, "an object or a list"),
    ({"system": 5, "messages": []}, "'system' must be a string"),
])
def test_bad_session_files_are_explained(data: Any, words: str) -> None:
    with pytest.raises(InvalidMessageError, match=words):
        load_conversation(data)


def test_unreadable_files_are_explained(tmp_path: Path) -> None:
    with pytest.raises(InvalidMessageError, match="no such file"):
        load_conversation_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [\n  {"role": "user",}\n]}')
    with pytest.raises(InvalidMessageError, match=r"not JSON \(line 2"):
        load_conversation_file(bad)


# --- tool pairing ------------------------------------------------------------------------------

def test_an_orphan_tool_result_is_named() -> None:
    raw = [{"role": "user", "content": "hi"},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz",
                                         "content": "x"}]}]
    with pytest.raises(ToolPairingError) as info:
        parse_messages(raw)
    assert (info.value.index, info.value.field) == (1, "content[0].tool_use_id")
    assert "'zz'" in str(info.value)


def test_an_unanswered_tool_call_mid_conversation_is_an_error() -> None:
    raw = [{"role": "user", "content": "hi"}, tool_turn()[0],
           {"role": "user", "content": "never mind"}]
    with pytest.raises(ToolPairingError) as info:
        parse_messages(raw)
    assert info.value.index == 2 and "['t1']" in str(info.value)


def test_an_unanswered_tool_call_at_the_end_is_allowed() -> None:
    msgs = parse_messages([{"role": "user", "content": "hi"}, tool_turn()[0]])
    assert msgs[-1].tool_use_ids() == ["t1"]


@pytest.mark.parametrize(("raw", "words"), [
    ([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}]}],
     "belong in an assistant message"),
    ([tool_turn()[0], {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}],
     "belong in a user message"),
])
def test_blocks_in_the_wrong_role_are_errors(raw: list[Any], words: str) -> None:
    with pytest.raises(ToolPairingError, match=words):
        parse_messages(raw)


def test_pairing_across_an_append_uses_the_previous_message() -> None:
    call, result = (parse_message(m) for m in tool_turn())
    check_tool_pairing([result], first_index=7, previous=call)
    with pytest.raises(ToolPairingError) as info:
        check_tool_pairing([result], first_index=7, previous=None)
    assert info.value.index == 7


# --- OpenAI shape ------------------------------------------------------------------------------

OPENAI = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Check ACCT-1"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "lookup", "arguments": "{\"id\": \"ACCT-1\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "ls", "arguments": ""}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "active"},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "a"},
                                                       {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": "ACCT-1 is active."},
]


def test_openai_messages_convert_to_the_anthropic_shape() -> None:
    conv = load_conversation(OPENAI)
    assert conv.system == "Be brief."
    assert dump_messages(conv.messages) == [
        {"role": "user", "content": "Check ACCT-1"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"id": "ACCT-1"}},
            {"type": "tool_use", "id": "c2", "name": "ls", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "active"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "a\nb"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ACCT-1 is active."}]},
    ]


def test_openai_system_messages_join_a_session_files_system() -> None:
    assert load_conversation({"system": "Rules.", "messages": OPENAI}).system == (
        "Rules.\n\nBe brief.")


def test_openai_round_trip() -> None:
    conv = load_conversation(OPENAI)
    back = to_openai(conv)
    assert back[0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in back] == ["system", "user", "assistant", "tool", "tool",
                                         "assistant"]
    assert back[2]["tool_calls"][0]["function"] == {"name": "lookup",
                                                    "arguments": '{"id": "ACCT-1"}'}
    assert back[4] == {"role": "tool", "tool_call_id": "c2", "content": "a\nb"}
    assert load_conversation(back) == conv


def test_to_openai_puts_tool_results_before_the_text_beside_them() -> None:
    conv = Conversation(messages=parse_messages([
        tool_turn()[0],
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "out"},
            {"type": "text", "text": "Also, hurry."}]}]))
    assert to_openai(conv)[1:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "out"},
        {"role": "user", "content": "Also, hurry."}]


@pytest.mark.parametrize(("raw", "index", "field", "words"), [
    ([{"role": "system", "content": "s"},
      {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "x",
                                                                     "arguments": {"a": 1}}}]}],
     1, "tool_calls[0].function.arguments", "must be a JSON string"),
    ([{"role": "tool", "content": "x"}], 0, "tool_call_id", "required"),
    ([{"role": "system", "content": "s"}, {"role": "critic", "content": "x"}], 1, "role",
     "system, developer, user, assistant or tool"),
    ([{"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], 1,
     "content[0].image_url", "needs image_url.url"),
    ([{"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], 1,
     "content[0]", "no counterpart"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "x"}}]}], 0, "tool_calls[0]",
     "needs an id"),
])
def test_malformed_openai_input_names_the_openai_index(raw: list[Any], index: int, field: str,
                                                       words: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        load_conversation(raw)
    assert (info.value.index, info.value.field) == (index, field)
    assert words in str(info.value)


def test_openai_pairing_errors_name_the_openai_index() -> None:
    raw = [{"role": "system", "content": "s"},
           {"role": "assistant", "tool_calls": [{"id": "c1", "function": {
               "name": "x", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "x"},
           {"role": "tool", "tool_call_id": "zz", "content": "x"}]
    with pytest.raises(ToolPairingError) as info:
        load_conversation(raw)
    assert (info.value.index, info.value.field) == (3, "tool_call_id")
    unanswered = [raw[0], raw[1], {"role": "user", "content": "skip it"}]
    with pytest.raises(ToolPairingError) as info:
        load_conversation(unanswered)
    assert info.value.index == 2


# --- property: what loads, dumps back unchanged --------------------------------------------------

# Blank text is not a message the API takes (dropped beside other blocks, refused alone).
_text = st.text(min_size=1, max_size=40).filter(str.strip)
_block = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _text),
    st.builds(lambda t, e: {"type": "text", "text": t, "cache_control": {"type": e}},
              _text, st.sampled_from(["ephemeral"])),
    st.builds(lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, _text, _text),
)


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]),
                          st.one_of(_text, st.lists(_block, min_size=1, max_size=3))),
                min_size=1, max_size=6))
def test_loaded_messages_dump_back_unchanged(raw: list[tuple[str, Any]]) -> None:
    messages = [{"role": role, "content": content} for role, content in raw]
    assert dump_messages(parse_messages(messages)) == messages


def test_blocks_from_the_anthropic_sdk_load_as_the_dicts_they_stand_for() -> None:
    # An agent appends `response.content` as the SDK returned it: block objects, not dicts.
    from anthropic.types import TextBlock as SdkText
    from anthropic.types import ToolUseBlock as SdkToolUse

    reply = [SdkText(type="text", text="Reading the log.", citations=None),
             SdkToolUse(type="tool_use", id="toolu_9", name="bash", input={"command": "ls"})]
    messages = parse_messages([
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                      "content": "ok"}]},
    ])
    assert messages[1].to_json() == {"role": "assistant", "content": [
        {"type": "text", "text": "Reading the log."},
        {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "ls"}},
    ]}


# --- evolve: model_copy(update=...) in one step ---------------------------------------------------

def _same_copy(a: Any, b: Any) -> None:
    assert type(a) is type(b) and a == b
    assert a.model_fields_set == b.model_fields_set
    assert a.__pydantic_extra__ == b.__pydantic_extra__
    assert a.model_dump_json(exclude_unset=True) == b.model_dump_json(exclude_unset=True)


def test_evolve_copies_exactly_what_model_copy_copies_on_every_shipped_message() -> None:
    from sessionfold.core.evolve import evolve
    from sessionfold.core.window import WindowItem

    checked = 0
    for path in sorted(TRANSCRIPTS.glob("*.json")):
        for seq, message in enumerate(load_conversation_file(path).messages):
            _same_copy(evolve(message, content="x"), message.model_copy(update={"content": "x"}))
            _same_copy(evolve(message, role="user"), message.model_copy(update={"role": "user"}))
            item = WindowItem(start_seq=seq, end_seq=seq, message=message)
            _same_copy(evolve(item, edits=("masked",), tokens=7),
                       item.model_copy(update={"edits": ("masked",), "tokens": 7}))
            if isinstance(message.content, str):
                continue
            for block in message.content:
                field = next(f for f in type(block).model_fields if f != "type")
                _same_copy(evolve(block, **{field: "y"}), block.model_copy(update={field: "y"}))
                checked += 1
    assert checked > 1000
    # Extra fields (a block from a newer API) are kept, and a copy's extras are its own.
    block = ToolUseBlock.model_validate({"type": "tool_use", "id": "t", "name": "n",
                                         "input": {}, "caller": {"kind": "direct"}})
    copy = evolve(block, name="m")
    _same_copy(copy, block.model_copy(update={"name": "m"}))
    assert copy.__pydantic_extra__ is not block.__pydantic_extra__


def test_evolve_refuses_a_field_the_model_does_not_have_and_models_with_private_state() -> None:
    from pydantic import BaseModel, PrivateAttr
    from sessionfold.core.evolve import evolve

    with pytest.raises(ValueError, match="no field 'colour'"):
        evolve(TextBlock(text="a"), colour="red")

    class Holder(BaseModel):
        x: int = 0
        _cache: int = PrivateAttr(default=0)

    with pytest.raises(TypeError, match="private attributes"):
        evolve(Holder(), x=1)

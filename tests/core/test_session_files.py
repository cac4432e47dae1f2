"""Session files: the shape read from the content, a byte order mark, JSON Lines and Claude Code
transcripts, saved Messages API responses, and errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sessionfold.cli.files import load_conversation_file
from sessionfold.core.errors import InvalidMessageError, ToolPairingError
from sessionfold.core.messages import OpaqueBlock, TextBlock, ToolUseBlock, dump_messages
from sessionfold.core.session_files import load_conversation, load_conversation_json

TOOL_TURN = [
    {"role": "assistant", "content": [
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "x"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(*lines: Any) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


# --- the shape, read from the content ------------------------------------------------------------

def test_an_anthropic_list_that_opens_with_a_system_message_takes_it_as_the_prompt() -> None:
    raw = [{"role": "system", "content": "You are X"},
           {"role": "user", "content": [{"type": "text", "text": "go"}]},
           *TOOL_TURN, {"role": "assistant", "content": "done"}]
    conv = load_conversation(raw)
    assert conv.system == "You are X"
    assert dump_messages(conv.messages) == raw[1:]  # as given: string content stays a string


def test_a_server_tools_block_makes_a_list_anthropic_beside_a_system_message() -> None:
    raw = [{"role": "system", "content": [{"type": "text", "text": "S"}]},
           {"role": "user", "content": "search it"},
           {"role": "assistant", "content": [
               {"type": "server_tool_use", "id": "srv_1", "name": "web_search",
                "input": {"query": "q"}},
               {"type": "text", "text": "Found."}]}]
    conv = load_conversation({"system": "Rules.", "messages": raw})
    assert conv.system == "Rules.\n\nS"
    assert isinstance(conv.messages[1].blocks()[0], OpaqueBlock)


def test_errors_in_an_anthropic_list_after_a_system_message_name_the_files_index() -> None:
    raw = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz",
                                         "content": "x"}]}]
    with pytest.raises(ToolPairingError) as info:
        load_conversation(raw)
    assert (info.value.index, info.value.field) == (2, "content[0].tool_use_id")


def test_a_plain_list_opening_with_a_system_message_reads_the_same_as_before() -> None:
    conv = load_conversation([{"role": "system", "content": "S"},
                              {"role": "user", "content": "hi"}])
    assert conv.system == "S" and conv.messages[0].text() == "hi"


@pytest.mark.parametrize("raw", [
    [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}]},
     {"role": "assistant", "content": None, "tool_calls": []}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]},
     {"role": "system", "content": "later"}],
])
def test_a_file_mixing_the_shapes_is_refused_naming_both(raw: list[Any]) -> None:
    with pytest.raises(InvalidMessageError, match=r"mix the OpenAI chat shape .* Anthropic"):
        load_conversation(raw)


def test_an_image_url_part_makes_a_list_openai() -> None:
    conv = load_conversation([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    assert conv.messages[0].to_json()["content"][0]["type"] == "image"


# --- byte order mark, JSON Lines, Claude Code transcripts -----------------------------------------

def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    text = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    path = write(tmp_path, "bom.json", "\ufeff" + text)
    assert load_conversation_file(path).messages[0].text() == "hi"
    assert load_conversation_json("\ufeff" + text, source="s").messages[0].text() == "hi"


def test_json_lines_of_messages_load_in_either_shape(tmp_path: Path) -> None:
    path = write(tmp_path, "run.json", jsonl(
        {"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"}) + "\n")
    conv = load_conversation_file(path)
    assert conv.system == "S" and [m.role for m in conv.messages] == ["user", "assistant", "user"]


def test_a_jsonl_file_of_one_line_is_one_message(tmp_path: Path) -> None:
    path = write(tmp_path, "one.jsonl", jsonl({"role": "user", "content": "hi"}))
    assert load_conversation_file(path).messages[0].text() == "hi"


def test_a_bad_line_is_named_with_its_file_and_number(tmp_path: Path) -> None:
    path = write(tmp_path, "run.jsonl", jsonl({"role": "user", "content": "hi"})
                 + '{"role": "assistant", "content": \n')
    with pytest.raises(InvalidMessageError, match=r"run\.jsonl: line 2: not JSON \(column"):
        load_conversation_file(path)
    path = write(tmp_path, "odd.jsonl", jsonl({"role": "user", "content": "hi"}, [1, 2]))
    with pytest.raises(InvalidMessageError, match=r"odd\.jsonl: line 2: neither a message"):
        load_conversation_file(path)


def test_a_bad_message_in_json_lines_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "run.jsonl", jsonl(
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "robot", "content": "x"}))
    with pytest.raises(InvalidMessageError) as info:
        load_conversation_file(path)
    assert str(info.value).startswith(f"{path}: line 3: message 2: role:")
    assert (info.value.index, info.value.field) == (2, "role")


def event(kind: str, message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A Claude Code transcript line."""
    return {"parentUuid": None, "isSidechain": False, "userType": "external",
            "cwd": "/repo", "sessionId": "s1", "version": "2.0.0", "type": kind,
            "message": message, "uuid": f"u{len(json.dumps(message))}",
            "timestamp": "2026-01-01T00:00:00Z", **extra}


def reply_line(block: dict[str, Any], message_id: str = "msg_1") -> dict[str, Any]:
    return event("assistant", {"id": message_id, "type": "message", "role": "assistant",
                               "model": "claude-sonnet-4-5", "content": [block],
                               "stop_reason": None, "stop_sequence": None,
                               "usage": {"input_tokens": 3, "output_tokens": 2}},
                 requestId="req_1")


CLAUDE_CODE = [
    {"type": "summary", "summary": "Fixing the login bug", "leafUuid": "x"},
    {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}},
    event("user", {"role": "user", "content": "Fix the login bug."}),
    reply_line({"type": "thinking", "thinking": "Look first.", "signature": "c2ln"}),
    reply_line({"type": "text", "text": "Looking."}),
    reply_line({"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}),
    reply_line({"type": "tool_use", "id": "t2", "name": "Read", "input": {"path": "a.py"}}),
    event("user", {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]},
        toolUseResult={"stdout": "a.py"}),
    event("user", {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t2", "content": "print(1)"}]}),
    {"type": "system", "subtype": "informational", "content": "note", "level": "info"},
    event("user", {"role": "user", "content": "side quest"}, isSidechain=True),
    reply_line({"type": "text", "text": "Fixed."}, message_id="msg_2"),
]


def test_a_claude_code_transcript_loads_its_user_and_assistant_messages(tmp_path: Path) -> None:
    conv = load_conversation_file(write(tmp_path, "session.jsonl", jsonl(*CLAUDE_CODE)))
    assert conv.system == ""
    assert [(m.role, [b.type for b in m.blocks()]) for m in conv.messages] == [
        ("user", ["text"]),
        ("assistant", ["thinking", "text", "tool_use", "tool_use"]),  # one reply, four lines
        ("user", ["tool_result", "tool_result"]),  # one answer to both calls
        ("assistant", ["text"]),
    ]
    assert conv.messages[3].blocks() == [TextBlock(text="Fixed.")]


def test_a_subagents_own_transcript_is_read_though_every_line_is_a_side_chain(
        tmp_path: Path) -> None:
    lines = [{**line, "isSidechain": True} for line in CLAUDE_CODE if "message" in line]
    conv = load_conversation_file(write(tmp_path, "agent-1.jsonl", jsonl(*lines)))
    assert [b.type for b in conv.messages[2].blocks()] == ["tool_result", "tool_result", "text"]
    assert conv.messages[2].text() == "side quest"


def test_a_transcript_error_names_the_line_its_message_starts_on(tmp_path: Path) -> None:
    lines = [*CLAUDE_CODE[:6], event("user", {"role": "user", "content": "answer me"})]
    path = write(tmp_path, "cut.jsonl", jsonl(*lines))
    with pytest.raises(ToolPairingError, match=r"cut\.jsonl: line 7: message 2: .*'t1'"):
        load_conversation_file(path)


# --- saved Messages API responses ----------------------------------------------------------------

RESPONSE = {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "yo"}], "model": "claude-sonnet-4-5",
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 2}}


def test_a_saved_response_object_is_read_as_its_role_and_content() -> None:
    conv = load_conversation([{"role": "user", "content": "hi"}, RESPONSE])
    assert conv.messages[1].to_json() == {"role": "assistant", "content": [
        {"type": "text", "text": "yo"}]}


@pytest.mark.parametrize(("message", "unknown"), [
    ({**RESPONSE, "mood": "good"}, "['mood']"),
    ({k: v for k, v in RESPONSE.items() if k != "type"}, "'id'"),
])
def test_other_fields_beside_a_message_are_still_refused(message: dict[str, Any],
                                                         unknown: str) -> None:
    with pytest.raises(InvalidMessageError, match="unknown field") as info:
        load_conversation([{"role": "user", "content": "hi"}, message])
    assert unknown in str(info.value) and info.value.index == 1


# --- every load error names the file -----------------------------------------------------------

@pytest.mark.parametrize("data", [
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz",
                                                "content": "x"}]}]},
    {"messages": [{"role": "robot", "content": "x"}]},
    {"system": "s"},
    42,
    {"messages": [{"role": "user", "content": "a"}], "summaries": [{"index": 9,
                                                                      "start_seq": 0,
                                                                      "end_seq": 0}]},
    [{"role": "tool", "content": "x"}],
])
def test_every_load_error_names_the_file(tmp_path: Path, data: Any) -> None:
    path = write(tmp_path, "bad.json", json.dumps(data))
    with pytest.raises(InvalidMessageError) as info:
        load_conversation_file(path)
    assert str(info.value).startswith(f"{path}: ")


def test_a_named_error_keeps_its_type_index_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "orphan.json", json.dumps([
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "zz",
                                      "content": "x"}]}]))
    with pytest.raises(ToolPairingError) as info:
        load_conversation_file(path)
    assert (info.value.index, info.value.field) == (1, "content[0].tool_use_id")
    assert str(info.value) == (f"{path}: message 1: content[0].tool_use_id: {info.value.reason}")


def test_tool_use_input_keeps_what_a_claude_code_line_holds(tmp_path: Path) -> None:
    conv = load_conversation_file(write(tmp_path, "s.jsonl", jsonl(*CLAUDE_CODE)))
    calls = [b for b in conv.messages[1].blocks() if isinstance(b, ToolUseBlock)]
    assert [c.input for c in calls] == [{"command": "ls"}, {"path": "a.py"}]

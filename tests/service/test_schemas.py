"""The document's schemas say what the library takes (issue 33): the policy's bounds are
FoldPolicy's own, every message of the shipped transcripts is valid by the message schema, and
usage reports the reader refuses are invalid by the usage schema."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from sessionfold.core.errors import InvalidPolicyError
from sessionfold.core.policy import FoldPolicy
from sessionfold.service.schemas import (
    _POLICY_BOUNDS,
    ANTHROPIC_MESSAGE,
    OPENAI_MESSAGE,
    POLICY_SCHEMA,
    USAGE_SCHEMA,
)

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"
BASE = {"budget_tokens": 4000}


def valid(schema: dict[str, Any], value: Any) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def probe(name: str, value: float) -> dict[str, Any]:
    """A policy with ``name`` at ``value``, and what it must keep below or above it (target_ratio
    < trigger_ratio) where the rest would otherwise refuse it."""
    companion: dict[str, Any] = {}
    if name == "trigger_ratio":
        companion = {"target_ratio": value / 2 if value > 0 else 0.5}
    elif name == "target_ratio":
        companion = {"trigger_ratio": 1.0}
    return {**BASE, **companion, name: value}


def takes(name: str, value: float) -> bool:
    try:
        FoldPolicy(**probe(name, value))
    except InvalidPolicyError:
        return False
    return True


def _step(value: float, integer: bool) -> float:
    return 1 if integer else max(abs(value) * 1e-9, 1e-9)


@pytest.mark.parametrize("name", sorted(n for n in _POLICY_BOUNDS if n in FoldPolicy.model_fields))
def test_every_documented_policy_bound_is_the_one_foldpolicy_keeps(name: str) -> None:
    bounds = _POLICY_BOUNDS[name]
    integer = FoldPolicy.model_fields[name].annotation in (int, int | None)
    for key, edge in bounds.items():
        step = _step(edge, integer)
        inside, outside = {
            "minimum": (edge, edge - step), "maximum": (edge, edge + step),
            "exclusiveMinimum": (edge + step, edge), "exclusiveMaximum": (edge - step, edge),
        }[key]
        assert takes(name, inside), f"{name}={inside} is inside the document's {key}"
        assert not takes(name, outside), f"{name}={outside} is outside the document's {key}"
        assert valid(POLICY_SCHEMA, probe(name, inside))
        assert not valid(POLICY_SCHEMA, probe(name, outside))


def test_a_numeric_policy_field_foldpolicy_bounds_has_its_bounds_in_the_document() -> None:
    # A field added to FoldPolicy with a range check, and not to the document, fails here.
    for name, field in FoldPolicy.model_fields.items():
        if name in _POLICY_BOUNDS or field.annotation not in (int, float, int | None,
                                                              float | None):
            continue
        for extreme in (-1, 10**9):
            assert takes(name, extreme), f"FoldPolicy bounds {name}: document its bounds"


def test_the_document_keeps_the_layer_rules() -> None:
    assert valid(POLICY_SCHEMA, {**BASE, "layers": ["drop-oldest", "mask-tool-results"]})
    for layers in ([], ["summarize", "summarize"], ["summarize", "drop-oldest"], ["nap"]):
        assert not valid(POLICY_SCHEMA, {**BASE, "layers": layers}), layers


def test_every_message_of_the_shipped_transcripts_is_valid_by_the_document() -> None:
    files = sorted(TRANSCRIPTS.glob("*.json"))
    assert files
    for path in files:
        for index, message in enumerate(json.loads(path.read_text())["messages"]):
            assert valid(ANTHROPIC_MESSAGE, message), (path.name, index)


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "  \n"},
    {"role": "user", "content": []},
    {"role": "user", "content": [{"type": "text", "text": " "}]},
    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]},
    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    {"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "!!!notb64"}}]},
    {"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "file:///etc/passwd"}}]},
    {"role": "user", "content": [{"text": "no type"}]},
    {"role": "user", "content": "hi", "name": "bob"},
])
def test_a_message_the_library_refuses_is_invalid_by_the_document(
        message: dict[str, Any]) -> None:
    assert not valid(ANTHROPIC_MESSAGE, message)


def test_openai_messages_are_valid_by_their_own_schema() -> None:
    for message in (
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.log"},
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "data:image/png;base64,iVBORw=="}}]},
    ):
        assert valid(OPENAI_MESSAGE, message), message
    assert not valid(OPENAI_MESSAGE, {"role": "function", "content": "x"})
    assert not valid(OPENAI_MESSAGE, {"role": "user", "content": [
        {"type": "input_audio", "input_audio": {}}]})


@pytest.mark.parametrize("usage", [
    {"input_tokens": "12"}, {"input_tokens": True}, {"input_tokens": 12.5},
    {"input_tokens": -1}, {"input_tokens": 0}, {}, {"output_tokens": 5},
    {"prompt_tokens": 5, "cache_read_input_tokens": 1},
    {"input_tokens": math.inf},
])
def test_a_usage_report_the_reader_refuses_is_invalid_by_the_document(usage: Any) -> None:
    assert not valid(USAGE_SCHEMA, usage)


def test_a_usage_report_in_either_shape_is_valid_by_the_document() -> None:
    assert valid(USAGE_SCHEMA, {"input_tokens": 100, "cache_read_input_tokens": 1000,
                                "cache_creation_input_tokens": 50, "output_tokens": 9})
    assert valid(USAGE_SCHEMA, {"prompt_tokens": 1234, "completion_tokens": 56,
                                "prompt_tokens_details": {"cached_tokens": 1000}})

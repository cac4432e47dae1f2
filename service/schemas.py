"""The JSON Schemas the OpenAPI document gives the library's own JSON: messages, policies, usage.

The routes hand these to the library, which validates them and says what is wrong in its own
words (its error reasons), so the request models take them as open objects. The document must
still say what the server takes, no more and no less: every value these schemas allow is
taken, and every value they refuse is refused (the schemathesis checks of
``tests/service/test_openapi.py``). They are built from the library's models and constants
(the block models of :mod:`sessionfold.core.messages`, :class:`FoldPolicy`'s fields, the store's
caps) with what those models check beyond their types written next to them. What no JSON
Schema can say is left out and said in the descriptions: whether a ``tool_result`` answers the
message before it (that message may be the ledger's last), a relation between two values
(``target_ratio < trigger_ratio``, a range that ends before it starts, cached tokens beyond
the prompt's), and that a leading ``system`` message must be the session's own prompt.
"""

from __future__ import annotations

from typing import Any

from sessionfold.core.messages import BLOCK_TYPES, MAX_NESTING_DEPTH
from sessionfold.core.policy import (
    LAYERS,
    MAX_POLICY_INT,
    MAX_RECALL_ROUNDS,
    MAX_SUMMARIZER_CALLS,
    MIN_RECALL_TOKENS,
    FoldPolicy,
)
from sessionfold.core.usage import MAX_REPORTED_TOKENS

__all__ = ["COMPONENTS", "MESSAGE_SCHEMA", "POLICY_SCHEMA", "USAGE_SCHEMA",
           "append_messages_schema", "recall_schema", "reply_body_schema"]

# --- text ------------------------------------------------------------------------------------

#: A character Python's ``str.strip()`` keeps (a text "with something to say"). Spelled for both
#: regex dialects a reader may use: Python's ``\s`` has U+001C–U+001F and U+0085, ECMA's not.
_SAYS_SOMETHING = "[^\\s\\x1c-\\x1f\\x85]"
_BLANK = "^[\\s\\x1c-\\x1f\\x85]*$"
_TEXT = {"type": "string", "pattern": _SAYS_SOMETHING}
#: Base64 as a strict decoder takes it: whole groups of four, padding only at the end.
_BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
#: An http(s) URL with a host (case as the scheme may be written).
_WEB_URL = "^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#@\\[\\]\\s]*@)?[^/?#@:\\[\\]\\s]+(?:[:/?#][^\\s]*)?$"

# --- Anthropic messages ----------------------------------------------------------------------

_BASE64_SOURCE = {"type": "object", "required": ["type", "data"], "properties": {
    "type": {"const": "base64"}, "media_type": {"type": "string"},
    "data": {"type": "string", "minLength": 4, "pattern": _BASE64}}}
_URL_SOURCE = {"type": "object", "required": ["type", "url"], "properties": {
    "type": {"const": "url"}, "url": {"type": "string", "pattern": _WEB_URL}}}
#: A source sessionfold does not read (a file id, a text document, content blocks): the
#: provider's to judge.
_OTHER_SOURCE = {"type": "object", "properties": {
    "type": {"not": {"enum": ["base64", "url"]}}}}
_SOURCE = {"description": "base64 data must decode; a url must be http(s)",
           "anyOf": [_BASE64_SOURCE, _URL_SOURCE, _OTHER_SOURCE]}
#: The tag of a block sessionfold keeps as given (OpaqueBlock): the shape of the API's tags, no
#: tag sessionfold reads. (A tag a letter or two from one it reads is refused too, as a typo.)
_OPAQUE = {"type": "object", "required": ["type"], "additionalProperties": True,
           "properties": {"type": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,63}$",
                                   "not": {"enum": sorted(BLOCK_TYPES)}}},
           "description": "a block of a type sessionfold does not read, kept as given"}
_NOT_BLANK_TEXT = {"not": {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"const": "text"}, "text": {"type": "string", "pattern": _BLANK}}}}


def _without_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_titles(v) for k, v in schema.items() if k not in ("title",
                                                                              "description")}
    if isinstance(schema, list):
        return [_without_titles(v) for v in schema]
    return schema


def _block(tag: str) -> dict[str, Any]:
    """The schema of block ``tag``, from its model: its type required, its source checked."""
    schema: dict[str, Any] = _without_titles(BLOCK_TYPES[tag].model_json_schema())
    schema.pop("$defs", None)
    schema["properties"]["type"] = {"const": tag}
    schema["required"] = ["type", *schema.get("required", [])]
    if "source" in schema["properties"]:
        schema["properties"]["source"] = _SOURCE
    return schema


_PARTS = [_block("text"), _block("image"), _block("document"), _OPAQUE]
_TOOL_RESULT = _block("tool_result")
_TOOL_RESULT["properties"]["content"] = {"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"anyOf": _PARTS}}]}
_ANY_ROLE = [_block(tag) for tag in ("text", "thinking", "redacted_thinking", "image",
                                     "document")]
_BLOCKS_BY_ROLE = {"user": [*_ANY_ROLE, _TOOL_RESULT, _OPAQUE],
                   "assistant": [*_ANY_ROLE, _block("tool_use"), _OPAQUE]}
#: The fields of a saved Messages API response besides role and content (taken with
#: ``"type": "message"``, not kept).
_RESPONSE_FIELDS = ("id", "model", "stop_reason", "stop_sequence", "stop_details", "usage",
                    "container", "diagnostics")


def _anthropic(role: str) -> dict[str, Any]:
    return {
        "type": "object", "required": ["role", "content"], "additionalProperties": False,
        "properties": {
            "role": {"const": role},
            "content": {"anyOf": [_TEXT, {"type": "array", "minItems": 1,
                                          "items": {"anyOf": _BLOCKS_BY_ROLE[role]},
                                          "contains": _NOT_BLANK_TEXT}]},
            "type": {"const": "message"},
            **{name: {} for name in _RESPONSE_FIELDS},
        },
        "dependentRequired": {name: ["type"] for name in _RESPONSE_FIELDS},
    }


ANTHROPIC_MESSAGE = {
    "description": "a message in the Anthropic Messages shape: a tool_use sits in an assistant "
                   "message, its tool_result in the next (user) message, which answers every "
                   "tool_use of it (the first appended message answers the ledger's last); "
                   "tool_use ids are unique in the session; some text or a block that is not "
                   "empty text. A saved response (\"type\": \"message\", with id, model, "
                   "usage...) is read as its role and content. Values nest at most "
                   f"{MAX_NESTING_DEPTH} levels deep",
    "anyOf": [_anthropic("user"), _anthropic("assistant")]}

# --- OpenAI chat messages --------------------------------------------------------------------

_DATA_IMAGE = "^data:[Ii][Mm][Aa][Gg][Ee]/[^;,]+;base64,(?:[A-Za-z0-9+/]{4})+" \
              "(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_DATA_PDF = "^data:[Aa][Pp][Pp][Ll][Ii][Cc][Aa][Tt][Ii][Oo][Nn]/[Pp][Dd][Ff];base64," \
            "(?:[A-Za-z0-9+/]{4})+(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_IMAGE_PART = {"type": "object", "required": ["type", "image_url"], "properties": {
    "type": {"const": "image_url"},
    "image_url": {"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string", "anyOf": [{"pattern": _WEB_URL}, {"pattern": _DATA_IMAGE}]}}}}}
_FILE_PART = {"type": "object", "required": ["type", "file"], "properties": {
    "type": {"const": "file"},
    "file": {"type": "object", "required": ["file_data"], "properties": {
        "file_data": {"type": "string", "pattern": _DATA_PDF}, "file_id": {"type": "null"},
        "filename": {"type": "string"}}}}}
_REFUSAL_PART = {"type": "object", "required": ["type", "refusal"],
                 "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}}}
_NOT_BLANK_PART = {"not": {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"const": "text"}, "text": {"type": "string", "pattern": _BLANK}}}}
_NO_FUNCTION_CALL = {"type": "null"}  # the deprecated field: refused unless null
_FUNCTION_CALL = {"type": "object", "required": ["id", "function"], "properties": {
    "id": {"type": "string", "minLength": 1}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1},
        "arguments": {"type": ["string", "null"]}}}}}
_CUSTOM_CALL = {"type": "object", "required": ["id", "type", "custom"], "properties": {
    "id": {"type": "string", "minLength": 1}, "type": {"const": "custom"},
    "custom": {"type": "object", "required": ["name", "input"], "properties": {
        "name": {"type": "string", "minLength": 1}, "input": {"type": "string"}}}}}


def _openai(role: str, properties: dict[str, Any], required: tuple[str, ...] = ()
            ) -> dict[str, Any]:
    return {"type": "object", "required": ["role", *required], "additionalProperties": True,
            "properties": {"role": {"const": role}, "function_call": _NO_FUNCTION_CALL,
                           **properties}}


_OPENAI_TEXT_FIELD = {"type": ["string", "null"]}
_OPENAI_ASSISTANT = _openai("assistant", {
    "content": {"anyOf": [{"type": ["string", "null"]}, {
        "type": "array", "items": {"anyOf": [_TEXT_PART, _REFUSAL_PART]}}]},
    "refusal": _OPENAI_TEXT_FIELD, "reasoning_content": _OPENAI_TEXT_FIELD,
    "reasoning": _OPENAI_TEXT_FIELD,
    "tool_calls": {"anyOf": [{"type": "null"}, {
        "type": "array", "items": {"anyOf": [_FUNCTION_CALL, _CUSTOM_CALL]}}]}})
OPENAI_MESSAGE = {
    "description": "a message in the OpenAI chat shape: leading system or developer messages "
                   "are the session's own system prompt (fixed at creation: sent along, never "
                   "changed); the tool messages answering one assistant message come in one "
                   "request, together",
    "anyOf": [
        *(_openai(role, {"content": {"anyOf": [{"type": ["string", "null"]}, {
            "type": "array", "items": _TEXT_PART}]}}) for role in ("system", "developer")),
        _openai("user", {"content": {"anyOf": [_TEXT, {
            "type": "array", "minItems": 1,
            "items": {"anyOf": [_TEXT_PART, _IMAGE_PART, _FILE_PART]},
            "contains": _NOT_BLANK_PART}]}}, ("content",)),
        _OPENAI_ASSISTANT,
        _openai("tool", {"tool_call_id": {"type": "string", "minLength": 1},
                         "content": {"anyOf": [{"type": ["string", "null"]}, {
                             "type": "array",
                             "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}}]}},
                ("tool_call_id",)),
    ]}
#: What makes a message the OpenAI shape when the append's shape is "auto"
#: (:func:`~sessionfold.core.openai_shape.openai_marker`).
_OPENAI_MARKED = {"anyOf": [
    {"type": "object", "required": ["role"],
     "properties": {"role": {"enum": ["tool", "system", "developer"]}}},
    *({"type": "object", "required": [name]} for name in (
        "tool_calls", "tool_call_id", "function_call", "refusal", "reasoning_content",
        "reasoning", "annotations", "audio")),
    {"type": "object", "required": ["role", "content"],
     "properties": {"role": {"const": "assistant"}, "content": {"type": "null"}}},
    {"type": "object", "required": ["content"], "properties": {"content": {
        "type": "array", "contains": {"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["image_url", "input_audio", "file", "refusal"]}}}}}},
]}
# --- a model's reply (the call loop over HTTP) ------------------------------------------------

#: A Messages API response as the SDK gives it (its JSON). Only ``content`` is checked: it is
#: what the ledger records; ``usage`` is reported when it reads as one, ``id`` keys the record.
ANTHROPIC_REPLY = {
    "description": "a Messages API response (its JSON): its content is recorded as the "
                   "assistant's message ([] records nothing), its usage reported, its id keys "
                   "the record (a reply sent again is not recorded twice); other fields are "
                   "not read",
    "type": "object", "required": ["content"],
    "properties": {"content": {"anyOf": [
        _TEXT, {"type": "array", "maxItems": 0},
        {"type": "array", "minItems": 1, "items": {"anyOf": _BLOCKS_BY_ROLE["assistant"]},
         "contains": _NOT_BLANK_TEXT}]}}}
#: A chat completion (its JSON): the first choice's message is the reply.
CHAT_COMPLETION_REPLY = {
    "description": "a chat completion (its JSON): the first choice's message is recorded "
                   "(converted to the ledger's shape, as an append converts it), its usage "
                   "reported, its id keys the record; other fields are not read",
    "type": "object", "required": ["choices"],
    "properties": {"choices": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["message"],
        "properties": {"message": _OPENAI_ASSISTANT}}}}}

#: The message schemas as the document's components (each written once, referred to by the
#: request bodies); the app adds them to its document.
COMPONENTS: dict[str, Any] = {"AnthropicMessage": ANTHROPIC_MESSAGE,
                              "OpenAIMessage": OPENAI_MESSAGE,
                              "OpenAIMarkedMessage": _OPENAI_MARKED,
                              "AnthropicReply": ANTHROPIC_REPLY,
                              "ChatCompletionReply": CHAT_COMPLETION_REPLY}
_ANTHROPIC_REF = {"$ref": "#/components/schemas/AnthropicMessage"}
_OPENAI_REF = {"$ref": "#/components/schemas/OpenAIMessage"}
_MARKED_REF = {"$ref": "#/components/schemas/OpenAIMarkedMessage"}
MESSAGE_SCHEMA = {"anyOf": [_ANTHROPIC_REF, _OPENAI_REF]}


def reply_body_schema() -> dict[str, Any]:
    """A reply's body: ``reply`` in the shape ``shape`` names, or ``error`` (one of them)."""
    def reply(ref: str) -> dict[str, Any]:
        return {"properties": {"reply": {"anyOf": [{"$ref": f"#/components/schemas/{ref}"},
                                                   {"type": "null"}]}}}

    def given(name: str) -> dict[str, Any]:
        return {"required": [name], "properties": {name: {"type": "object"}}}

    return {"allOf": [
        {"if": {"required": ["shape"], "properties": {"shape": {"const": "openai"}}},
         "then": reply("ChatCompletionReply"), "else": reply("AnthropicReply")},
        {"oneOf": [given("reply"), given("error")]},
    ]}


def append_messages_schema(max_messages: int) -> dict[str, Any]:
    """An append's body: ``messages`` in the shape ``shape`` names (``auto``: Anthropic
    messages, or OpenAI messages of which one at least is marked as such)."""
    def listed(items: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"type": "array", "minItems": 1, "maxItems": max_messages, "items": items,
                **extra}

    return {"allOf": [
        {"if": {"required": ["shape"], "properties": {"shape": {"const": "anthropic"}}},
         "then": {"properties": {"messages": listed(_ANTHROPIC_REF)}}},
        {"if": {"required": ["shape"], "properties": {"shape": {"const": "openai"}}},
         "then": {"properties": {"messages": listed(_OPENAI_REF)}}},
        {"if": {"anyOf": [{"not": {"required": ["shape"]}},
                          {"properties": {"shape": {"const": "auto"}}}]},
         "then": {"properties": {"messages": {"anyOf": [
             listed(_ANTHROPIC_REF, **{"not": {"contains": _MARKED_REF}}),
             listed(_OPENAI_REF, contains=_MARKED_REF)]}}}},
    ]}


# --- policies --------------------------------------------------------------------------------

#: What FoldPolicy checks of each value beyond its type (FoldPolicy._check), as JSON Schema
#: bounds; ``tests/service/test_schemas.py`` holds each against FoldPolicy itself.
_POLICY_BOUNDS: dict[str, dict[str, Any]] = {
    "budget_tokens": {"minimum": 1000, "maximum": MAX_POLICY_INT},
    "trigger_ratio": {"exclusiveMinimum": 0, "maximum": 1},
    "target_ratio": {"exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "keep_recent_turns": {"minimum": 0, "maximum": MAX_POLICY_INT},
    "max_item_ratio": {"exclusiveMinimum": 0, "maximum": 0.5},
    "retention_min": {"minimum": 0, "maximum": 1},
    "max_summarizer_calls": {"minimum": 1, "maximum": MAX_SUMMARIZER_CALLS},
    "recall_max_tokens": {"minimum": MIN_RECALL_TOKENS, "maximum": MAX_POLICY_INT},
    "recall_max_rounds": {"minimum": 1, "maximum": MAX_RECALL_ROUNDS},
    "guard_margin_ratio": {"minimum": 0, "maximum": 0.5},
    "idle_trigger_ratio": {"exclusiveMinimum": 0, "maximum": 1},
    "expected_calls": {"minimum": 1, "maximum": MAX_POLICY_INT},
}


def _policy_schema() -> dict[str, Any]:
    schema: dict[str, Any] = FoldPolicy.model_json_schema()
    properties = schema["properties"]
    for name, bounds in _POLICY_BOUNDS.items():
        field = properties.get(name)
        if field is None:
            continue
        # A field that may be None ("anyOf": [number, null]) is bounded in its number.
        for branch in field.get("anyOf", [field]):
            if branch.get("type") != "null":
                branch.update(bounds)
    properties["layers"].update(minItems=1, maxItems=len(LAYERS), uniqueItems=True)
    schema["not"] = {"required": ["layers"], "properties": {"layers": {"allOf": [
        {"contains": {"const": "summarize"}}, {"contains": {"const": "drop-oldest"}}]}}}
    schema["description"] = ("a FoldPolicy; also target_ratio < trigger_ratio, and "
                             "'drop-oldest' is used instead of 'summarize', not beside it")
    return schema


POLICY_SCHEMA = _policy_schema()

# --- usage reports ---------------------------------------------------------------------------

_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_REPORTED_TOKENS}
_PROMPT_COUNTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                  "prompt_tokens")


def _usage_schema() -> dict[str, Any]:
    anthropic = {"type": "object", "properties": {
        **{name: _COUNT for name in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                     "cache_creation_input_tokens")},
        "cache_creation": {"type": "object", "properties": {
            "ephemeral_5m_input_tokens": _COUNT, "ephemeral_1h_input_tokens": _COUNT}}},
        "not": {"anyOf": [{"required": [name]} for name in (
            "prompt_tokens", "completion_tokens", "prompt_tokens_details",
            "input_tokens_details")]}}
    details = {"type": "object", "properties": {"cached_tokens": _COUNT}}
    openai = {"type": "object", "properties": {
        **{name: _COUNT for name in ("prompt_tokens", "completion_tokens", "input_tokens",
                                     "output_tokens")},
        "prompt_tokens_details": details, "input_tokens_details": details},
        "not": {"anyOf": [{"required": [name]} for name in (
            "cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation")]}}
    # Some prompt above zero: a call that succeeded read some prompt, and sessionfold does not
    # guess a size from a report of none. OpenAI's prompt_tokens, when named, is the prompt;
    # else the sum of the input counts (the writes maybe only in their breakdown).
    def above_zero(name: str) -> dict[str, Any]:
        return {"required": [name], "properties": {name: {"minimum": 1}}}

    written = {"not": {"required": ["cache_creation_input_tokens"]},
               "required": ["cache_creation"], "properties": {"cache_creation": {"anyOf": [
                   above_zero("ephemeral_5m_input_tokens"),
                   above_zero("ephemeral_1h_input_tokens")]}}}
    measured = {"anyOf": [
        above_zero("prompt_tokens"),
        {"not": {"required": ["prompt_tokens"]}, "anyOf": [
            *(above_zero(name) for name in _PROMPT_COUNTS if name != "prompt_tokens"),
            written]}]}
    return {"type": "object", "description": "the provider's usage object, Anthropic "
            "(input_tokens, cache_read_input_tokens, cache_creation_input_tokens, "
            "output_tokens) or OpenAI (prompt_tokens, completion_tokens, "
            "prompt_tokens_details.cached_tokens) shape; every count a whole number >= 0, "
            f"the prompt more than 0 and at most {MAX_REPORTED_TOKENS:,} tokens in all",
            "allOf": [{"anyOf": [anthropic, openai]}, measured]}


USAGE_SCHEMA = _usage_schema()

# --- recall ----------------------------------------------------------------------------------

#: A ledger row or range as the window prints it (the recall tool's parser,
#: :func:`~sessionfold.client.recall.parse_seq`, in the regex dialect JSON Schema uses).
SEQ_PATTERN = ("^\\s*(?:[Ll][Ee][Dd][Gg][Ee][Rr]\\s*)?#?\\s*[0-9]{1,12}"
               "(?:\\s*(?:-|\u2013|\u2014|\\.\\.)\\s*#?\\s*[0-9]{1,12})?\\s*$")


def recall_schema() -> dict[str, Any]:
    """The recall body: ``seq`` (with an ``offset``) or ``query``, never both."""
    nothing = {"anyOf": [{"type": "null"}, {"type": "string", "pattern": _BLANK}]}
    by_seq = {"required": ["seq"], "properties": {
        "seq": {"anyOf": [{"type": "string", "pattern": SEQ_PATTERN},
                          {"type": "integer", "minimum": 0}]},
        "offset": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        "query": nothing}}
    by_query = {"required": ["query"], "properties": {
        "query": {"type": "string", "pattern": _SAYS_SOMETHING},
        "seq": nothing, "offset": {"anyOf": [{"const": 0}, {"type": "null"}]}}}
    return {"anyOf": [by_seq, by_query]}

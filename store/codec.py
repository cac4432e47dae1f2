"""Messages to and from the JSON the store keeps.

On the way in a message is stored exactly as :meth:`Message.to_json` gives it, except that
``cache_control`` markers are stripped (in blocks, and in the parts of a tool_result): they belong
to one request, not to the conversation, and are placed again when a window is read.

On the way out, rows are decoded without re-validating them: everything in the store was
validated by :func:`~sessionfold.core.messages.parse_messages` when it was appended (or built by
the fold engine from validated messages), and validating it again (the block union is tried
member by member) is most of the time a 300-item window read takes. The decoded models keep
``model_fields_set`` (what ``to_json`` writes back) equal to the stored keys, so a decoded message
round-trips byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic_core
from pydantic import BaseModel
from sessionfold.core.errors import UnsupportedModelError
from sessionfold.core.messages import (
    BLOCK_TYPES,
    DocumentBlock,
    ImageBlock,
    Message,
    OpaqueBlock,
    TextBlock,
)
from sessionfold.core.window import Edit, ItemKind, WindowItem

__all__ = [
    "decode_item",
    "decode_json",
    "decode_message",
    "encode_message",
    "messages_digest",
    "tool_use_id_digest",
]

def decode_json(text: str | bytes) -> Any:
    """Decode a stored JSON document: pydantic-core's parser, the standard library's on failure.

    pydantic-core is about twice as fast on window-sized documents but stops near 200 levels of
    nesting. Append refuses anything nested past ``MAX_NESTING_DEPTH`` (far below that), but rows
    written before that limit existed may be deeper: the standard parser (limited only by the
    recursion limit) still reads them, so nothing an earlier version accepted becomes unreadable.
    """
    try:
        return pydantic_core.from_json(text)
    except ValueError:
        return json.loads(text)


_PARTS: dict[str, Any] = {"text": TextBlock, "image": ImageBlock, "document": DocumentBlock}


def _strip_block(block: dict[str, Any]) -> dict[str, Any]:
    block.pop("cache_control", None)
    content = block.get("content")
    if block.get("type") == "tool_result" and isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                part.pop("cache_control", None)
    return block


def encode_message(message: Message) -> dict[str, Any]:
    """The JSON a message is stored as: ``to_json()`` without ``cache_control`` markers."""
    data = message.to_json()
    content = data.get("content")
    if isinstance(content, list):
        data["content"] = [_strip_block(b) for b in content]
    return data


def messages_digest(encoded: Iterable[Mapping[str, Any]]) -> str:
    """A digest of stored-form messages (for idempotent appends: same key, same messages)."""
    h = hashlib.blake2b(digest_size=32)
    for data in encoded:
        h.update(json.dumps(data, sort_keys=True, ensure_ascii=False,
                            separators=(",", ":")).encode())
        h.update(b"\x1e")
    return h.hexdigest()


def tool_use_id_digest(tool_use_id: str) -> str:
    """The key a tool_use id is stored under in ``tool_use_ids`` (32 hex characters).

    Migration 0004 computes the same digest for the ids already stored: never change it.
    """
    return hashlib.blake2b(tool_use_id.encode("utf-8"), digest_size=16).hexdigest()


class _Trusted:
    """Builds instances of one pydantic model from trusted data without validating it.

    What ``model_construct`` does, minus its per-call generality (it is the larger part of a
    window read's decoding time): known fields go to ``__dict__``, unknown ones to
    ``__pydantic_extra__`` for models that allow extras, and ``model_fields_set`` is exactly the
    keys given, so ``to_json`` (``exclude_unset``) writes back what was stored. The store's tests
    compare every decoded transcript message with a validated one, so a pydantic upgrade that
    changes these internals fails there, not silently.
    """

    def __init__(self, cls: type[BaseModel]) -> None:
        if cls.__private_attributes__:
            raise UnsupportedModelError(
                f"{cls.__name__} has private attributes; decode it by validation")
        self.cls = cls
        self.fields = frozenset(cls.model_fields)
        self.size = len(self.fields)
        self.extra = cls.model_config.get("extra") == "allow"
        self.defaults = {name: f.get_default(call_default_factory=True)
                         for name, f in cls.model_fields.items() if not f.is_required()}

    def __call__(self, data: Mapping[str, Any]) -> Any:
        extra: dict[str, Any] | None = {} if self.extra else None
        if self.fields.issuperset(data):  # the usual case: no extra keys, nothing to sort
            values = dict(data)
        else:
            values = {}
            for key, value in data.items():
                if key in self.fields:
                    values[key] = value
                elif extra is not None:
                    extra[key] = value
        fields_set = set(values)
        if len(values) != self.size:
            values = {**self.defaults, **values}
        obj = _new(self.cls)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", fields_set)
        _set(obj, "__pydantic_extra__", extra)
        _set(obj, "__pydantic_private__", None)
        return obj

    def every_field(self, values: dict[str, Any]) -> Any:
        """An instance from ``values``, which names every field and nothing else (the caller
        builds it so): the checks and copies of ``__call__`` skipped. ``values`` is kept."""
        obj = _new(self.cls)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", set(self.fields))
        _set(obj, "__pydantic_extra__", {} if self.extra else None)
        _set(obj, "__pydantic_private__", None)
        return obj


_new = object.__new__
_set = object.__setattr__
_BUILD_BLOCK = {kind: _Trusted(cls) for kind, cls in BLOCK_TYPES.items()}
_BUILD_PART = {kind: _BUILD_BLOCK[kind] for kind in _PARTS}
#: A block (or tool result part) of a type sessionfold does not read, stored as it came.
_BUILD_OPAQUE = _Trusted(OpaqueBlock)
_BUILD_MESSAGE = _Trusted(Message)
_BUILD_ITEM = _Trusted(WindowItem)


def _decode_block(data: Mapping[str, Any]) -> Any:
    kind = data["type"]
    content = data.get("content")
    if kind == "tool_result" and isinstance(content, list):
        fields = dict(data)
        fields["content"] = [_BUILD_PART.get(p["type"], _BUILD_OPAQUE)(p) for p in content]
        return _BUILD_BLOCK[kind](fields)
    return _BUILD_BLOCK.get(kind, _BUILD_OPAQUE)(data)


def decode_message(data: Mapping[str, Any]) -> Message:
    """A :class:`Message` from its stored JSON (trusted: see the module doc)."""
    content = data["content"]
    if isinstance(content, list):
        content = [_decode_block(b) for b in content]
    message: Message = _BUILD_MESSAGE.every_field({"role": data["role"], "content": content})
    return message


def decode_item(start_seq: int, end_seq: int, kind: ItemKind, message: Mapping[str, Any],
                edits: Sequence[Edit], version: int, tokens: int) -> WindowItem:
    """A :class:`WindowItem` from its row (trusted, constructed without validation)."""
    item: WindowItem = _BUILD_ITEM.every_field({
        "start_seq": start_seq, "end_seq": end_seq, "kind": kind,
        "message": decode_message(message), "edits": tuple(edits), "version": version,
        "tokens": tokens,
    })
    return item

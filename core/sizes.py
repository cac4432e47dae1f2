"""Sizes of window items, counted once per item object for one visit.

A visit asks the size of the same items many times (each layer re-measures, a priced visit
measures a dry run too): tokens and characters are counted once per item object and kept for
the visit.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import InvalidInputError
from .layers import item_tokens
from .messages import Message
from .tokens import TokenCounter
from .window import WindowItem

__all__ = ["Sizes", "message_chars"]


class Sizes:
    """Token and character sizes of items, counted once per item object."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        # Keyed by id(); the item is held in the value so its id cannot be reused meanwhile.
        self._tokens: dict[int, tuple[WindowItem, int]] = {}
        self._chars: dict[int, tuple[WindowItem, int]] = {}

    def tokens(self, item: WindowItem) -> int:
        if item.tokens is not None:
            return item.tokens
        hit = self._tokens.get(id(item))
        if hit is None:
            hit = (item, item_tokens(item, self.counter))
            self._tokens[id(item)] = hit
        return hit[1]

    def known_chars(self, items: Sequence[WindowItem], chars: Sequence[int | None]) -> None:
        """Take the character sizes the caller knows (``None``: not known, counted if asked)."""
        if len(chars) != len(items):
            raise InvalidInputError(f"item_chars has {len(chars)} sizes for {len(items)} items")
        for item, n in zip(items, chars, strict=True):
            if n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InvalidInputError(f"item_chars holds {n!r} for item #{item.start_seq}; "
                                        "a size is an integer >= 0 or None")
            self._chars[id(item)] = (item, n)

    def chars(self, item: WindowItem) -> int:
        hit = self._chars.get(id(item))
        if hit is None:
            hit = (item, message_chars(item.message))
            self._chars[id(item)] = hit
        return hit[1]


def message_chars(message: Message) -> int:
    """Characters of the message as compact JSON: what goes over the wire."""
    return len(message.model_dump_json(exclude_unset=True))

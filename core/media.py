"""Images and documents a provider takes: base64 data that decodes, a URL that is http(s).

Checked when a message is parsed (:func:`~.messages.parse_message`), because nothing later
mends a bad one: no fold edits an image, so every window holding it would fail at the provider.
Other source types (a file id, a text document, content blocks) are the provider's to judge.
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .errors import InvalidMessageError

__all__ = ["check_source"]


def check_source(source: Mapping[str, Any], block_type: str, index: int, where: str) -> None:
    """InvalidMessageError naming ``where`` when the ``source`` of a ``block_type`` block (an
    image or a document) is not one the provider takes."""
    # Other source types (a file id, a text document, content blocks) are the provider's to
    # judge: nothing about them is known here to fail.
    kind = source.get("type")
    if kind == "base64":
        problem = _base64_problem(source.get("data"))
        if problem is not None:
            raise InvalidMessageError(problem, index=index, field=f"{where}.data")
    elif kind == "url":
        url = source.get("url")
        if not _is_web_url(url):
            raise InvalidMessageError(
                f"a {block_type}'s url must be an http(s) URL the provider can fetch, got "
                f"{url!r:.60}", index=index, field=f"{where}.url")


def _base64_problem(data: object) -> str | None:
    """Why ``data`` is not base64 the provider decodes, or None. Decoded once to be sure (the
    store's cap on a message bounds what that allocates); whitespace and characters outside
    the alphabet are refused, as strict decoders refuse them."""
    if not isinstance(data, str):
        return f"base64 data must be text, got {type(data).__name__}"
    if not data:
        return "the source holds no data (empty base64)"
    try:
        b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: a non-ASCII character
        return f"the data is not valid base64 ({exc}); got {data[:20]!r}..."
    return None


def _is_web_url(url: object) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)

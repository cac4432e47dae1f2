"""A request's prompt size as the stand-in counts it: roughly as the API does, never as the
``cl100k`` estimator does, so the per-session calibration has real work.

Text counts by its characters (``chars_per_token``), plus a fixed overhead for the system
prompt framing and three tokens a message. Images and documents count in tokens as the API
roughly counts them, never by their base64: an image by its pixels (``width × height / 750``
after scaling its long edge to 1,568 px, at most :data:`IMAGE_TOKENS`; that flat figure when its
size cannot be read), a PDF by its pages (:data:`PDF_PAGE_TOKENS` each, pages counted by their
page objects, else one per :data:`PDF_BYTES_PER_PAGE`), a text document by its text. Blocks of
other types count by their JSON.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessionfold.core.tokens import IMAGE_TOKENS

__all__ = [
    "IMAGE_MAX_EDGE",
    "IMAGE_PIXELS_PER_TOKEN",
    "IMAGE_TOKENS",
    "PDF_BYTES_PER_PAGE",
    "PDF_PAGE_TOKENS",
    "count_request",
]

# IMAGE_TOKENS (core.tokens, the estimator's figure for the same fact): the most an image costs,
# and what one costs whose size is not read (a URL, a file id, bytes that are not an image).
#: The API's rule for an image: width × height / 750 tokens, its long edge scaled to 1,568 px.
IMAGE_PIXELS_PER_TOKEN = 750
IMAGE_MAX_EDGE = 1_568
#: A PDF page: its text and the image of the page (the API says 1,500 to 3,000 tokens a page).
PDF_PAGE_TOKENS = 2_000
#: A PDF whose page objects are not in sight (compressed object streams): a page per 50 KB.
PDF_BYTES_PER_PAGE = 50_000


def count_request(request: Mapping[str, Any], *, overhead_tokens: int,
                  chars_per_token: float) -> int:
    """The request's prompt size: ``overhead_tokens``, three a message, its text (system prompt,
    tool definitions, messages) at ``chars_per_token``, and its images and documents' tokens."""
    chars = len(_system_text(request.get("system")))
    chars += sum(len(json.dumps(t, sort_keys=True)) for t in request.get("tools") or [])
    media = 0
    for message in request.get("messages") or []:
        size = _message_size(message)
        chars += size.chars
        media += size.tokens
    per_message = 3 * len(request.get("messages") or [])
    return overhead_tokens + per_message + round(chars / chars_per_token) + media


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    return ""


@dataclass(frozen=True)
class _Size:
    """What a piece of a request weighs: ``chars`` of text (counted at ``chars_per_token``) and
    ``tokens`` counted as such (images and documents)."""

    chars: int = 0
    tokens: int = 0

    def __add__(self, other: _Size) -> _Size:
        return _Size(self.chars + other.chars, self.tokens + other.tokens)


def _message_size(message: Any) -> _Size:
    if not isinstance(message, Mapping):
        return _Size()
    return _content_size(message.get("content", ""))


def _content_size(content: Any) -> _Size:
    if isinstance(content, str):
        return _Size(len(content))
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    size = _Size(max(0, len(blocks) - 1))  # a separator between two blocks, as text reads
    for block in blocks:
        size += _block_size(block)
    return size


def _block_size(block: Mapping[str, Any]) -> _Size:
    kind = block.get("type")
    if kind == "text":
        return _Size(len(str(block.get("text", ""))))
    if kind == "thinking":
        return _Size(len(str(block.get("thinking", ""))))
    if kind == "tool_use":
        return _Size(len(str(block.get("name", ""))) + len(json.dumps(block.get("input", {}))))
    if kind == "tool_result":
        return _content_size(block.get("content", ""))
    source = block.get("source")
    if kind == "image" and isinstance(source, Mapping):
        data = source.get("data")
        return _Size(tokens=_image_tokens(data) if source.get("type") == "base64"
                    and isinstance(data, str) else IMAGE_TOKENS)
    if kind == "document" and isinstance(source, Mapping):
        return _document_size(source)
    # Redacted thinking, server tool results, types not known here: their JSON for their size.
    return _Size(len(json.dumps(block, sort_keys=True)))


def _document_size(source: Mapping[str, Any]) -> _Size:
    """A document: a PDF by its pages, plain text by its text, content blocks by theirs; one
    the stand-in cannot see (a URL, a file id) as a page."""
    data = source.get("data")
    if source.get("type") == "base64" and isinstance(data, str):
        return _Size(tokens=_pdf_tokens(data))
    if source.get("type") == "text" and isinstance(data, str):
        return _Size(len(data))
    if source.get("type") == "content":
        return _content_size(source.get("content", ""))
    return _Size(tokens=PDF_PAGE_TOKENS)


def _decoded(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None


# A request's images are counted again for each cached prefix and on every call that resends
# them: each distinct one is decoded once (a str caches its own hash, so a hit is cheap).
@functools.lru_cache(maxsize=512)
def _image_tokens(data: str) -> int:
    """An image's tokens by its pixels, as the API counts them; :data:`IMAGE_TOKENS` when its
    size cannot be read."""
    raw = _decoded(data)
    size = _image_pixels(raw) if raw else None
    if size is None:
        return IMAGE_TOKENS
    width, height = size
    scale = min(1.0, IMAGE_MAX_EDGE / max(width, height, 1))
    pixels = (width * scale) * (height * scale)
    return max(1, min(IMAGE_TOKENS, math.ceil(pixels / IMAGE_PIXELS_PER_TOKEN)))


def _image_pixels(raw: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from the image's header (Pillow reads no more than that); None when
    the bytes are not an image Pillow knows, or Pillow is missing."""
    try:
        from PIL import Image
    except ImportError:  # Pillow is the demo extra's: without it, the flat figure
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a huge image warns of a decompression bomb
            with Image.open(io.BytesIO(raw)) as image:
                width, height = image.size
    except Exception:  # not an image, or one Pillow refuses: counted at the flat figure
        return None
    return (width, height) if width > 0 and height > 0 else None


_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


@functools.lru_cache(maxsize=128)
def _pdf_tokens(data: str) -> int:
    """A PDF's tokens: :data:`PDF_PAGE_TOKENS` a page, its pages counted by their page objects,
    or by its size when none is in sight (they may sit in compressed object streams)."""
    raw = _decoded(data)
    pages = len(_PDF_PAGE.findall(raw)) if raw else 0
    if not pages:
        size = len(raw) if raw else len(data) * 3 // 4
        pages = max(1, math.ceil(size / PDF_BYTES_PER_PAGE))
    return pages * PDF_PAGE_TOKENS

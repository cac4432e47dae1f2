"""Images and documents the provider would refuse later are refused at the door (issue 33):
base64 data must decode, a URL must be http(s). Every window holding such a block would fail
at the provider, and no fold ever edits an image, so it would fail on every call after."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.messages import ImageBlock, parse_message
from sessionfold.core.openai_shape import from_openai

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()
PDF = base64.b64encode(b"%PDF-1.4\n" + b"x" * 100).decode()


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image", "source": source}]}


def document(source: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "document", "source": source}]}


def in_tool_result(block: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                         "content": [block]}]}


BAD_SOURCES = [
    ({"type": "base64", "media_type": "image/png", "data": "!!!notb64"}, "data", "base64"),
    ({"type": "base64", "media_type": "image/png", "data": PNG[:-3]}, "data", "base64"),
    ({"type": "base64", "media_type": "image/png", "data": ""}, "data", "no data"),
    ({"type": "base64", "media_type": "image/png", "data": 42}, "data", "base64"),
    ({"type": "url", "url": "file:///etc/passwd"}, "url", "http"),
    ({"type": "url", "url": "ftp://example.com/a.png"}, "url", "http"),
    ({"type": "url", "url": "http://"}, "url", "http"),
    ({"type": "url", "url": "javascript:alert(1)"}, "url", "http"),
    ({"type": "url"}, "url", "http"),
]


@pytest.mark.parametrize(("source", "field", "says"), BAD_SOURCES)
def test_an_image_the_provider_would_refuse_is_refused_naming_the_field(
        source: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(InvalidMessageError, match=says) as caught:
        parse_message(image(source), 3)
    assert caught.value.index == 3
    assert caught.value.field == f"content[0].source.{field}"


@pytest.mark.parametrize(("source", "field", "says"), BAD_SOURCES)
def test_a_document_or_a_tool_results_image_is_checked_the_same(
        source: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(InvalidMessageError, match=says) as caught:
        parse_message(document({**source, "media_type": "application/pdf"}))
    assert caught.value.field == f"content[0].source.{field}"
    with pytest.raises(InvalidMessageError, match=says) as caught:
        parse_message(in_tool_result({"type": "image", "source": source}))
    assert caught.value.field == f"content[0].content[0].source.{field}"


@pytest.mark.parametrize("source", [
    {"type": "base64", "media_type": "image/png", "data": PNG},
    {"type": "url", "url": "https://example.com/cat.png"},
    {"type": "url", "url": "HTTP://Example.com/cat.png?size=2"},
    {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"},
])
def test_images_the_provider_takes_are_kept_as_given(source: dict[str, Any]) -> None:
    message = parse_message(image(source))
    block = message.content[0]
    assert isinstance(block, ImageBlock) and block.source == source


def test_a_text_document_and_a_base64_pdf_are_taken() -> None:
    parse_message(document({"type": "text", "media_type": "text/plain", "data": "not base64!"}))
    parse_message(document({"type": "base64", "media_type": "application/pdf", "data": PDF}))


def test_openai_data_urls_still_become_base64_sources() -> None:
    converted = from_openai([{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}"}}]}])
    blocks = converted.messages[0].content
    assert isinstance(blocks, list) and len(blocks) == 3
    with pytest.raises(InvalidMessageError, match="base64"):
        from_openai([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!notb64"}}]}])

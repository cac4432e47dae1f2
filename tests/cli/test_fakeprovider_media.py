"""The stand-in counts images and documents as the Messages API roughly does (by pixels, by
pages), never by their base64, and blocks of types it does not know by their JSON."""

from __future__ import annotations

import base64
import io
import json
import math
import random
from typing import Any

import pytest
from PIL import Image
from sessionfold.cli.standin.fakeprovider import (
    IMAGE_TOKENS,
    PDF_BYTES_PER_PAGE,
    PDF_PAGE_TOKENS,
    FakeProvider,
)


def png(width: int, height: int, *, noise: bool = False) -> str:
    """A PNG's base64; ``noise`` makes it as large as its pixels (no compression wins)."""
    if noise:
        pixels = random.Random(width * height).randbytes(width * height * 3)
        image = Image.frombytes("RGB", (width, height), pixels)
    else:
        image = Image.new("RGB", (width, height), (40, 90, 200))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def image(data: str, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": data}}


def screenshot_turn(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A computer-use exchange whose tool result is ``block`` (a screenshot)."""
    return [{"role": "user", "content": "Book the flight."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "computer",
                 "input": {"action": "screenshot"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [block]}]}]


def counted(provider: FakeProvider, block: dict[str, Any]) -> int:
    return provider.count_tokens({"system": "sys", "messages": screenshot_turn(block)})


def test_a_screenshot_counts_by_its_pixels_not_by_its_base64() -> None:
    provider = FakeProvider()
    small, large = png(400, 300, noise=True), png(800, 600, noise=True)
    assert len(small) > 400_000  # ~110,000 tokens were it text
    # The same request, one image four times the pixels of the other: 4 x 160 against 160.
    assert counted(provider, image(large)) - counted(provider, image(small)) == 640 - 160
    assert counted(provider, image(small)) < 1_000


@pytest.mark.parametrize(("size", "tokens"), [
    ((1568, 200), math.ceil(1568 * 200 / 750)),
    ((3136, 400), math.ceil(1568 * 200 / 750)),  # its long edge scaled to 1,568 px first
    ((4000, 3000), IMAGE_TOKENS),  # scaled down to ~1.15 megapixels: the most an image costs
], ids=["within", "scaled", "capped"])
def test_a_large_image_is_scaled_as_the_api_scales_it(size: tuple[int, int],
                                                       tokens: int) -> None:
    provider = FakeProvider()
    unit = counted(provider, image(png(1, 1)))  # a 1x1 image costs 1 token
    assert counted(provider, image(png(*size))) - unit == tokens - 1


def test_an_image_it_cannot_measure_counts_the_flat_figure() -> None:
    provider = FakeProvider()
    unit = counted(provider, image(png(1, 1)))
    garbage = base64.b64encode(random.Random(1).randbytes(147_000)).decode()  # not an image
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert counted(provider, image(garbage)) - unit == IMAGE_TOKENS - 1
    assert counted(provider, url) - unit == IMAGE_TOKENS - 1


def test_twenty_screenshots_count_as_twenty_images() -> None:
    garbage = base64.b64encode(random.Random(2).randbytes(147_000)).decode()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Book the flight."}]
    for i in range(20):
        messages += [{"role": "assistant", "content": [
                          {"type": "tool_use", "id": f"toolu_{i}", "name": "computer",
                           "input": {"action": "screenshot"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": f"toolu_{i}",
                          "content": [image(garbage)]}]}]
    tokens = FakeProvider().count_tokens({"system": "sys", "messages": messages})
    assert 20 * IMAGE_TOKENS < tokens < 20 * IMAGE_TOKENS + 2_000  # not 20 x ~54,000


def pdf(pages: int) -> str:
    """A real PDF of ``pages`` pages (matplotlib writes its page objects in the clear)."""
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    out = io.BytesIO()
    with PdfPages(out) as doc:
        for n in range(pages):
            figure = Figure(figsize=(2, 2))
            figure.text(0.5, 0.5, f"page {n}")
            doc.savefig(figure)
    return base64.b64encode(out.getvalue()).decode()


def document(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "document", "source": source}


def test_a_pdf_counts_by_its_pages_or_else_by_its_size() -> None:
    provider = FakeProvider()
    one = counted(provider, document({"type": "base64", "media_type": "application/pdf",
                                      "data": pdf(1)}))
    three = counted(provider, document({"type": "base64", "media_type": "application/pdf",
                                        "data": pdf(3)}))
    assert three - one == 2 * PDF_PAGE_TOKENS
    # No page object in sight: a page per PDF_BYTES_PER_PAGE bytes.
    opaque = base64.b64encode(random.Random(3).randbytes(3 * PDF_BYTES_PER_PAGE)).decode()
    assert counted(provider, document({"type": "base64", "media_type": "application/pdf",
                                       "data": opaque})) - one == 2 * PDF_PAGE_TOKENS


def test_a_text_document_counts_by_its_text() -> None:
    provider = FakeProvider(chars_per_token=4.0)
    short = counted(provider, document({"type": "text", "media_type": "text/plain",
                                        "data": "x" * 400}))
    long = counted(provider, document({"type": "text", "media_type": "text/plain",
                                       "data": "x" * 4_400}))
    assert long - short == 1_000


def test_a_block_of_a_type_it_does_not_know_counts_by_its_json() -> None:
    provider = FakeProvider(chars_per_token=4.0)
    search = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
        {"type": "web_search_result", "url": "https://a.example", "title": "A",
         "encrypted_content": "z" * 4_000, "page_age": None}]}
    base = [{"role": "user", "content": "find it"}]
    without = provider.count_tokens({"messages": [*base, {"role": "assistant", "content": [
        {"type": "text", "text": "found it"}]}]})
    with_it = provider.count_tokens({"messages": [*base, {"role": "assistant", "content": [
        search, {"type": "text", "text": "found it"}]}]})
    assert with_it - without == round((len(json.dumps(search, sort_keys=True)) + 1) / 4.0)

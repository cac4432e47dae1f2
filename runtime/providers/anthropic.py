"""The Anthropic summarizer: a cheap model through the ``anthropic`` SDK (2.x, on httpx2).

A provider of the fold runtime, not of the engine: :mod:`sessionfold.core` stays pure (no
network client), keeps the :class:`~sessionfold.core.summarizers.Summarizer` protocol and the
offline summarizer, and this module implements the protocol over the network. Importing it pays
for importing the SDK (over a second), so the runtime imports it only when the settings name it
(:func:`sessionfold.runtime.wiring.make_summarizer`).

The prompt, with the transcript between markers carrying a random per-call nonce, is
:mod:`.prompt`'s; the error mapping is :mod:`.sdk_errors`' (429, 529, 5xx, 408/409, timeouts and
connection errors transient with the ``retry-after`` hint; any other status permanent), both
shared with the OpenAI-compatible provider. The SDK's own retries are off (``max_retries=0``):
the caller (a Celery task) owns retries, their count and their cap. An empty answer, a refusal
or a context-window stop is a :class:`PermanentSummarizerError` too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anthropic
import httpx2
from sessionfold.core.errors import (
    InvalidInputError,
    InvalidUsageError,
    PermanentSummarizerError,
    UsageUnmeasurableError,
)
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import DEFAULT_MODEL, Summary
from sessionfold.core.usage import read_usage
from sessionfold.core.window import SummarizerUsage

from . import DEFAULT_CONTEXT_TOKENS
from .options import check_options
from .prompt import summary_prompt
from .sdk_errors import SdkErrors
from .sdk_errors import mapped_errors as sdk_mapped_errors

if TYPE_CHECKING:
    from .anthropic_batches import AnthropicBatches

__all__ = ["AnthropicSummarizer", "anthropic_errors"]

_SDK = SdkErrors(api="the Anthropic API", timeout=anthropic.APITimeoutError,
                 connection=anthropic.APIConnectionError, status=anthropic.APIStatusError,
                 base=anthropic.AnthropicError)


@contextmanager
def anthropic_errors() -> Iterator[None]:
    """anthropic's exceptions as sessionfold's (:mod:`.sdk_errors`), and its one bare one."""
    try:
        with sdk_mapped_errors(_SDK):
            yield
    except TypeError as exc:
        # anthropic raises a bare TypeError when no credentials resolve (no api_key, no
        # ANTHROPIC_API_KEY, no profile); any other TypeError is a bug and propagates.
        if "authentication" not in str(exc):
            raise
        raise PermanentSummarizerError(f"no Anthropic credentials: {exc}") from exc


class AnthropicSummarizer:
    """Summarizes through the Anthropic Messages API on a cheap model.

    Pass a ready ``client`` or the pieces to build one (``api_key``, ``base_url``,
    ``http_client``); either way the client used has ``max_retries=0``. Tests drive it with
    ``http_client=httpx2.Client(transport=httpx2.MockTransport(handler))``.
    """

    def __init__(self, *, client: anthropic.Anthropic | None = None, api_key: str | None = None,
                 base_url: str | None = None, http_client: httpx2.Client | None = None,
                 model: str = DEFAULT_MODEL, max_tokens: int = 1024,
                 context_tokens: int = DEFAULT_CONTEXT_TOKENS["anthropic"],
                 timeout: float = 60.0) -> None:
        check_options(client_and_pieces=client is not None and (
            api_key is not None or base_url is not None or http_client is not None),
            model=model, max_tokens=max_tokens, context_tokens=context_tokens, timeout=timeout)
        with anthropic_errors():  # a broken credentials profile fails here, not at the first call
            if client is None:
                client = anthropic.Anthropic(api_key=api_key, base_url=base_url,
                                             http_client=http_client, max_retries=0,
                                             timeout=timeout)
            # Celery owns retries: an SDK retry would hide a 429 from the task's backoff and its
            # cap, and the SDK honours retry-after without an upper bound.
            self._client = client.with_options(max_retries=0, timeout=timeout)
        self.model = model
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"AnthropicSummarizer(model={self.model!r}, context_tokens={self.context_tokens})"

    def batch_api(self) -> AnthropicBatches:
        """Message Batches on this summarizer's client (:mod:`.anthropic_batches`)."""
        from .anthropic_batches import AnthropicBatches

        return AnthropicBatches(self._client, self, anthropic_errors)

    def build_request(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                      must_keep: Sequence[str] = (), nonce: str | None = None) -> dict[str, Any]:
        """The ``messages.create`` arguments for one call (:mod:`.prompt`'s words): what a
        Message Batches request carries too."""
        prompt = summary_prompt(messages, previous_summary=previous_summary,
                                must_keep=must_keep, nonce=nonce)
        return {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": prompt.instruction,
            "messages": [{"role": "user", "content": prompt.content}],
        }

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        if not messages:
            raise InvalidInputError("nothing to summarize: the span holds no messages")
        request = self.build_request(messages, previous_summary=previous_summary,
                                     must_keep=must_keep)
        with anthropic_errors():
            response = self._client.messages.create(**request, timeout=self.timeout)
        return self.read_response(response)

    def read_response(self, response: anthropic.types.Message) -> Summary:
        """The summary a Messages API answer carries (a batch result's message reads the
        same), or PermanentSummarizerError: a refusal, a context-window stop, no text."""
        usage = _usage(response, self.model)
        if response.stop_reason == "refusal":
            raise PermanentSummarizerError(f"the summarizer model {self.model} refused the span")
        if response.stop_reason == "model_context_window_exceeded":
            raise PermanentSummarizerError(
                f"the span does not fit {self.model}'s context window; summarize it in smaller "
                "chunks"
            )
        text = "\n".join(b.text for b in response.content if b.type == "text").strip()
        if not text:
            raise PermanentSummarizerError(
                f"the summarizer model {self.model} returned no text "
                f"(stop_reason={response.stop_reason})"
            )
        # stop_reason "max_tokens" is accepted: the text is a shorter summary, and the engine's
        # retention check decides whether it kept enough.
        return Summary(text=text, usage=usage)


def _usage(response: anthropic.types.Message, fallback_model: str) -> SummarizerUsage:
    """What the call cost, read by the one strict reader of provider usage
    (:func:`~sessionfold.core.usage.read_usage`; the SDK's typed object is read like any report).

    A count the reader refuses (not a whole number >= 0, or past any context window) makes the
    call a permanent failure naming the field: a summary whose cost cannot be counted is not
    committed on a guess, and a malformed answer is not worth retrying.
    """
    try:
        tokens = read_usage(response.usage, "anthropic")
    except (InvalidUsageError, UsageUnmeasurableError) as exc:
        raise PermanentSummarizerError(
            f"the summarizer model {fallback_model} answered with an unreadable usage report: "
            f"{exc}") from exc
    return SummarizerUsage(
        model=response.model or fallback_model,
        calls=1,
        input_tokens=tokens.uncached,
        output_tokens=tokens.output,
        cache_read_input_tokens=tokens.cache_read,
        cache_creation_input_tokens=tokens.cache_write_5m + tokens.cache_write_1h,
    )

"""The OpenAI-compatible summarizer: chat completions through the ``openai`` SDK (on httpx2).

One provider for every server that speaks OpenAI's chat completions (OpenAI, gateways such as
LiteLLM or OpenRouter, vLLM, Ollama, llama.cpp): they differ only in ``base_url`` and model. It
keeps the Anthropic provider's guarantees with the same pieces (:mod:`.prompt`,
:mod:`.sdk_errors`, ``max_retries=0``); what is OpenAI's own: a 429 ``insufficient_quota`` is
permanent, a refusal is ``message.refusal`` or ``finish_reason="content_filter"``, usage is read
in OpenAI's shape (``prompt_tokens`` include the cached ones), and the answer is capped with
``max_completion_tokens`` (OpenAI's reasoning models refuse ``max_tokens``; servers that do not
know the field ignore it; a reasoning model spends the cap on its reasoning too). The ``openai``
package is the ``sessionfold[openai]`` extra, imported only when the settings name this provider.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import httpx2
import openai
import pydantic
from openai.types.chat import ChatCompletion
from sessionfold.core.errors import (
    InvalidInputError,
    InvalidUsageError,
    PermanentSummarizerError,
    UsageUnmeasurableError,
)
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summary
from sessionfold.core.usage import read_usage
from sessionfold.core.window import SummarizerUsage

from . import DEFAULT_CONTEXT_TOKENS, DEFAULT_SUMMARIZER_MODELS
from .options import check_options
from .prompt import summary_prompt
from .sdk_errors import SdkErrors, mapped_errors

if TYPE_CHECKING:
    from .openai_batches import OpenAIBatches

__all__ = ["OpenAISummarizer", "openai_errors"]


def _out_of_credit(exc: Any) -> bool:
    # OpenAI answers an exhausted quota with 429 too; no backoff brings credit back.
    return getattr(exc, "code", None) == "insufficient_quota"


_SDK = SdkErrors(api="the OpenAI-compatible API", timeout=openai.APITimeoutError,
                 connection=openai.APIConnectionError, status=openai.APIStatusError,
                 base=openai.OpenAIError, permanent=_out_of_credit)


def openai_errors() -> AbstractContextManager[None]:
    """openai's exceptions as sessionfold's (:mod:`.sdk_errors`), where this provider's calls
    enter the SDK (its batch API's too)."""
    return mapped_errors(_SDK)


class OpenAISummarizer:
    """Summarizes through an OpenAI-compatible chat completions API.

    Pass a ready ``client`` or the pieces to build one (``api_key``, ``base_url``,
    ``http_client``; None: the SDK's ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``); either way the
    client used has ``max_retries=0``. ``context_tokens``: the most transcript tokens one call
    carries (larger spans are summarized in chunks); set it below the served model's window.
    """

    def __init__(self, *, client: openai.OpenAI | None = None, api_key: str | None = None,
                 base_url: str | None = None, http_client: httpx2.Client | None = None,
                 model: str = DEFAULT_SUMMARIZER_MODELS["openai"], max_tokens: int = 1024,
                 context_tokens: int = DEFAULT_CONTEXT_TOKENS["openai"],
                 timeout: float = 60.0) -> None:
        check_options(client_and_pieces=client is not None and (
            api_key is not None or base_url is not None or http_client is not None),
            model=model, max_tokens=max_tokens, context_tokens=context_tokens, timeout=timeout)
        with mapped_errors(_SDK):  # no key anywhere fails here, not at the first call
            if client is None:
                client = openai.OpenAI(api_key=api_key, base_url=base_url,
                                       http_client=http_client, max_retries=0, timeout=timeout)
            # Celery owns retries: an SDK retry would hide a 429 from the task's backoff and its
            # cap, and the SDK honours retry-after without an upper bound.
            self._client = client.with_options(max_retries=0, timeout=timeout)
        self.model = model
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        self.timeout = timeout

    def __repr__(self) -> str:
        # Without userinfo: a gateway's URL may carry a password.
        where = str(self._client.base_url.copy_with(userinfo=b""))
        return (f"OpenAISummarizer(model={self.model!r}, base_url={where!r}, "
                f"context_tokens={self.context_tokens})")

    def batch_api(self) -> OpenAIBatches:
        """The Batch API (with its Files API) on this summarizer's client
        (:mod:`.openai_batches`)."""
        from .openai_batches import OpenAIBatches

        return OpenAIBatches(self._client, self, openai_errors)

    def build_request(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                      must_keep: Sequence[str] = (), nonce: str | None = None) -> dict[str, Any]:
        """The ``chat.completions.create`` arguments for one call (:mod:`.prompt`'s words): the
        body a Batch API line carries too."""
        prompt = summary_prompt(messages, previous_summary=previous_summary,
                                must_keep=must_keep, nonce=nonce)
        return {
            "model": self.model,
            "max_completion_tokens": self.max_tokens,
            "messages": [{"role": "system", "content": prompt.instruction},
                         {"role": "user", "content": prompt.content}],
        }

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        if not messages:
            raise InvalidInputError("nothing to summarize: the span holds no messages")
        request = self.build_request(messages, previous_summary=previous_summary,
                                     must_keep=must_keep)
        with mapped_errors(_SDK):
            completion = self._client.chat.completions.create(**request, timeout=self.timeout)
        return self.read_response(completion)

    def read_response(self, completion: ChatCompletion | Mapping[str, Any]) -> Summary:
        """The summary a chat completion carries (the SDK's object, or its JSON as a Batch API
        output line holds it), or PermanentSummarizerError: a refusal, no text, no usage."""
        if not isinstance(completion, ChatCompletion):
            try:
                completion = ChatCompletion.model_validate(completion)
            except pydantic.ValidationError as exc:
                raise PermanentSummarizerError(
                    f"the summarizer model {self.model} answered with a malformed chat "
                    f"completion: {exc.error_count()} field(s) invalid") from exc
        usage = self._usage(completion)
        if not completion.choices:
            raise PermanentSummarizerError(f"the summarizer model {self.model} answered with no "
                                           "choices")
        choice = completion.choices[0]
        message = choice.message
        if message.refusal or choice.finish_reason == "content_filter":
            why = f": {message.refusal}" if message.refusal else " (content filter)"
            raise PermanentSummarizerError(
                f"the summarizer model {self.model} refused the span{why}")
        text = (message.content or "").strip()
        if not text:
            raise PermanentSummarizerError(
                f"the summarizer model {self.model} returned no text "
                f"(finish_reason={choice.finish_reason})")
        # finish_reason "length" is accepted: the text is a shorter summary, and the engine's
        # retention check decides whether it kept enough.
        return Summary(text=text, usage=usage)

    def _usage(self, completion: ChatCompletion) -> SummarizerUsage:
        """What the call cost, read by the one strict reader of provider usage in OpenAI's
        shape, kept in the summarizer's (Anthropic's) shape: ``input_tokens`` uncached.

        A missing or unreadable report is a permanent failure: a summary whose cost cannot be
        counted is not committed on a guess. The usage names the model asked for, not the one
        the server answered with: a gateway's or a snapshot's name for it is not the name its
        prices were checked under at start.
        """
        if completion.usage is None:
            raise PermanentSummarizerError(
                f"the summarizer model {self.model} answered without a usage report: its cost "
                "cannot be counted")
        try:
            tokens = read_usage(completion.usage, "openai")
        except (InvalidUsageError, UsageUnmeasurableError) as exc:
            raise PermanentSummarizerError(
                f"the summarizer model {self.model} answered with an unreadable usage report: "
                f"{exc}") from exc
        return SummarizerUsage(model=self.model, calls=1, input_tokens=tokens.uncached,
                               output_tokens=tokens.output,
                               cache_read_input_tokens=tokens.cache_read)

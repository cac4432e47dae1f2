"""Anthropic's Message Batches for the summarizer's requests (:class:`AnthropicBatches`).

One ``messages.create`` request per batch (``/v1/messages/batches``), the summarizer's own
arguments as its ``params``; the batch is polled with ``retrieve`` and, once its
``processing_status`` is ``ended``, its results (a JSONL stream) are read for the request's
``custom_id``. A result is ``succeeded`` (the message, read as a live answer is), ``errored``
(the error it met: an overloaded or failing API is transient, anything else permanent),
``canceled`` or ``expired``. Every part of a batch call is billed at half the list price.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anthropic
from sessionfold.core.errors import (
    PermanentSummarizerError,
    SummarizerError,
    TransientSummarizerError,
)
from sessionfold.core.summarizers import Summary

from .batch_api import AnswerReader, BatchPoll, ErrorMapping

__all__ = ["TRANSIENT_ERRORS", "AnthropicBatches"]

#: Error types of an errored batch request worth calling again (the live call's 429, 5xx, 529).
TRANSIENT_ERRORS = frozenset({"rate_limit_error", "api_error", "overloaded_error",
                              "timeout_error"})


class AnthropicBatches:
    """Message Batches on ``client``, for ``summarizer``'s requests (see the module doc);
    ``errors`` is the provider's own mapping of the SDK's errors
    (:func:`.anthropic.anthropic_errors`, passed in: this module is imported by that one)."""

    provider = "anthropic"

    def __init__(self, client: anthropic.Anthropic, summarizer: AnswerReader,
                 errors: ErrorMapping) -> None:
        self._client = client
        self._summarizer = summarizer
        self._errors = errors

    def submit(self, custom_id: str, request: Mapping[str, Any]) -> str:
        # The summarizer's own create() arguments, as a plain mapping: the SDK's TypedDict of
        # them is not what build_request is typed as.
        params: Any = dict(request)
        with self._errors():
            batch = self._client.messages.batches.create(
                requests=[{"custom_id": custom_id, "params": params}])
        return batch.id

    def poll(self, batch_id: str, custom_id: str) -> BatchPoll:
        with self._errors():
            batch = self._client.messages.batches.retrieve(batch_id)
            if batch.processing_status != "ended":
                return BatchPoll("pending", detail=f"processing_status {batch.processing_status}")
            found = next((line.result for line in self._client.messages.batches.results(batch_id)
                          if line.custom_id == custom_id), None)
        if found is None:
            return BatchPoll("failed", detail=f"batch {batch_id} ended without a result for the "
                                              "request")
        if found.type == "canceled":
            return BatchPoll("cancelled", detail=f"batch {batch_id} was canceled")
        if found.type == "expired":
            return BatchPoll("expired", detail=f"batch {batch_id} expired before the request ran")
        if found.type == "errored":
            error = found.error.error  # one of the API's error objects: each has type and message
            return BatchPoll("ended", answer=_errored(str(getattr(error, "type", "error")),
                                                      str(getattr(error, "message", ""))))
        return BatchPoll("ended", answer=self._read(found.message))

    def cancel(self, batch_id: str) -> None:
        with self._errors():
            self._client.messages.batches.cancel(batch_id)

    def _read(self, message: anthropic.types.Message) -> Summary | SummarizerError:
        try:
            summary = self._summarizer.read_response(message)
        except SummarizerError as exc:
            return exc
        return Summary(text=summary.text, usage=summary.usage.through_batch())


def _errored(kind: str, message: str) -> SummarizerError:
    described = f"the batched summarizer request met {kind}: {message}"
    if kind in TRANSIENT_ERRORS:
        return TransientSummarizerError(described)
    return PermanentSummarizerError(described)

"""OpenAI's Batch API for the summarizer's requests (:class:`OpenAIBatches`).

A batch reads its requests from a JSONL file uploaded through the Files API (purpose
``batch``): one line, ``{"custom_id", "method": "POST", "url": "/v1/chat/completions",
"body"}``, the body being the summarizer's own ``chat.completions.create`` arguments. The batch
is polled with ``batches.retrieve``; once it is ``completed`` (or ``expired`` or ``cancelled``,
which may still have answered some requests) its output file, then its error file, is read for
the request's line. A line answers with the chat completion (``response.status_code`` 200),
or with an error, read as a live call's status would be (429 and 5xx transient, anything else
permanent; ``batch_expired`` means the request never ran). Input and output are billed at half
the list price.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import openai
from sessionfold.core.errors import (
    PermanentSummarizerError,
    SummarizerError,
    TransientSummarizerError,
)
from sessionfold.core.summarizers import Summary

from .batch_api import AnswerReader, BatchPoll, BatchState, ErrorMapping
from .sdk_errors import TRANSIENT_STATUSES

__all__ = ["ENDPOINT", "OpenAIBatches"]

#: The endpoint every line of a summarizer batch calls.
ENDPOINT: Final = "/v1/chat/completions"
_PENDING = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
#: A batch that is over without an answer to the request, by its status.
_UNANSWERED: dict[str, BatchState] = {"completed": "failed", "failed": "failed",
                                      "expired": "expired", "cancelled": "cancelled"}


class OpenAIBatches:
    """The Batch API on ``client``, for ``summarizer``'s requests (see the module doc);
    ``errors`` is the provider's own mapping of the SDK's errors
    (:func:`.openai.openai_errors`, passed in: this module is imported by that one)."""

    provider = "openai"

    def __init__(self, client: openai.OpenAI, summarizer: AnswerReader,
                 errors: ErrorMapping) -> None:
        self._client = client
        self._summarizer = summarizer
        self._errors = errors

    def submit(self, custom_id: str, request: Mapping[str, Any]) -> str:
        line = json.dumps({"custom_id": custom_id, "method": "POST", "url": ENDPOINT,
                           "body": dict(request)}, ensure_ascii=False)
        with self._errors():
            uploaded = self._client.files.create(
                file=("sessionfold-fold.jsonl", (line + "\n").encode(), "application/jsonl"),
                purpose="batch")
            batch = self._client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT,
                                                completion_window="24h",
                                                metadata={"sessionfold": "fold"})
        return batch.id

    def poll(self, batch_id: str, custom_id: str) -> BatchPoll:
        with self._errors():
            batch = self._client.batches.retrieve(batch_id)
            if batch.status in _PENDING:
                return BatchPoll("pending", detail=f"status {batch.status}")
            line = (self._line(batch.output_file_id, custom_id)
                    or self._line(batch.error_file_id, custom_id))
        if line is not None:
            answered = self._answer(line)
            if answered is not None:
                return answered
        state = _UNANSWERED.get(batch.status, "failed")
        return BatchPoll(state, detail=f"batch {batch_id} is {batch.status} without an answer "
                                       "to the request")

    def cancel(self, batch_id: str) -> None:
        with self._errors():
            self._client.batches.cancel(batch_id)

    def _line(self, file_id: str | None, custom_id: str) -> Mapping[str, Any] | None:
        """The line of file ``file_id`` that answers ``custom_id`` (None: no file, no line)."""
        if not file_id:
            return None
        content = self._client.files.content(file_id).text
        for raw in content.splitlines():
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a line the provider mangled is no answer to anything
            if isinstance(line, Mapping) and line.get("custom_id") == custom_id:
                return line
        return None

    def _answer(self, line: Mapping[str, Any]) -> BatchPoll | None:
        """What one output or error line says (None: it says nothing of the request)."""
        response = line.get("response")
        error = line.get("error")
        if isinstance(response, Mapping) and response.get("status_code") == 200:
            try:
                summary = self._summarizer.read_response(response.get("body") or {})
            except SummarizerError as exc:
                return BatchPoll("ended", answer=exc)
            return BatchPoll("ended", answer=Summary(text=summary.text,
                                                     usage=summary.usage.through_batch()))
        if isinstance(error, Mapping) and error.get("code") == "batch_expired":
            return BatchPoll("expired", detail=str(error.get("message") or "batch_expired"))
        if isinstance(response, Mapping) and isinstance(response.get("status_code"), int):
            status = int(response["status_code"])
            body = response.get("body")
            detail = body.get("error") if isinstance(body, Mapping) else None
            message = (detail.get("message") if isinstance(detail, Mapping) else None) or ""
            described = f"the batched summarizer request answered {status}: {message}"
            if status in TRANSIENT_STATUSES or status >= 500:
                return BatchPoll("ended", answer=TransientSummarizerError(
                    described, status_code=status))
            return BatchPoll("ended", answer=PermanentSummarizerError(described,
                                                                      status_code=status))
        if isinstance(error, Mapping):
            return BatchPoll("ended", answer=PermanentSummarizerError(
                f"the batched summarizer request failed: {error.get('code')}: "
                f"{error.get('message')}"))
        return None

"""A provider's batch API as the fold runtime uses it: one summarizer request per batch,
submitted, polled, read, cancelled.

::

    api = summarizer.batch_api()                      # AnthropicBatches or OpenAIBatches
    batch_id = api.submit(custom_id, summarizer.build_request(messages, previous_summary=...))
    polled = api.poll(batch_id, custom_id)            # "pending" until the batch has ended
    polled.answer                                     # then: the Summary, or the error it met
    api.cancel(batch_id)

One request per batch: a fold's answer is collected as soon as its own batch ends, never held
back by other sessions' requests, and cancelling it cancels nothing else. The request is the
one the provider's summarizer sends live (``build_request``), its answer read by the same
``read_response``, with its usage marked as billed at the batch rate
(:meth:`~sessionfold.core.window.SummarizerUsage.through_batch`). The SDKs' errors enter mapped
as the live calls' do (:mod:`.sdk_errors`); an errored request inside an ended batch comes back
as the :class:`~sessionfold.core.errors.SummarizerError` it amounts to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from sessionfold.core.errors import SummarizerError
from sessionfold.core.messages import Message
from sessionfold.core.summarizers import Summary

__all__ = ["AnswerReader", "BatchApi", "BatchCapable", "BatchPoll", "BatchState", "ErrorMapping"]

#: Where a batch stands: ``pending`` (not ended), ``ended`` (its answer is in
#: :attr:`BatchPoll.answer`), or ended without an answer: ``expired`` (the provider's 24 hours
#: ran out), ``cancelled``, ``failed`` (the provider refused the batch, or lost the request).
BatchState = Literal["pending", "ended", "expired", "cancelled", "failed"]


@dataclass(frozen=True)
class BatchPoll:
    """What one look at a batch found: its state, and once ``ended`` the request's answer (its
    summary, usage at the batch rate, or the error the request met)."""

    state: BatchState
    answer: Summary | SummarizerError | None = None
    detail: str = ""


@runtime_checkable
class BatchApi(Protocol):
    """A provider's batch API for one summarizer's requests."""

    #: ``anthropic`` or ``openai``: stored with the pending fold, so whoever collects it asks
    #: the same API.
    provider: str

    def submit(self, custom_id: str, request: Mapping[str, Any]) -> str:
        """Send one request (the summarizer's ``build_request`` arguments) in a batch of its
        own; returns the batch's id."""
        ...

    def poll(self, batch_id: str, custom_id: str) -> BatchPoll:
        """Where the batch stands, and the answer to request ``custom_id`` once it ended."""
        ...

    def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch (its unprocessed requests are not billed)."""
        ...


class AnswerReader(Protocol):
    """What a batch API needs of its summarizer: reading one answer as a live call's is read."""

    def read_response(self, response: Any) -> Summary: ...


#: The provider's own error mapping, entered around each of the batch API's calls.
ErrorMapping = Callable[[], AbstractContextManager[None]]


@runtime_checkable
class BatchCapable(Protocol):
    """A summarizer whose provider has a batch API (both network providers)."""

    model: str
    context_tokens: int

    def build_request(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                      must_keep: Sequence[str] = (), nonce: str | None = None
                      ) -> dict[str, Any]: ...

    def batch_api(self) -> BatchApi: ...

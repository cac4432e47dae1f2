"""Folds through a provider's batch API: what the fold procedure needs to send one and to make
its visit again once the answer is in.

A background visit offered a batch API (:class:`BatchOffer`, from the settings'
``batch_folds``) is priced with :class:`~sessionfold.core.batching.BatchTerms`: the batch's
expected delay in the session's calls. When the cost model says the fold can wait
(:mod:`sessionfold.core.batching`), the planner asks its summary of a :class:`BatchRecorder`,
which keeps the request and stops the visit (:class:`~sessionfold.core.errors.SummaryDeferred`).
The fold procedure then sends the request (:meth:`BatchOffer.submit`: the provider's own
``build_request``, under a custom id naming the request by its material,
:func:`~sessionfold.core.batching.request_key`) and holds the claim with the session's batch
mark (:mod:`sessionfold.store.batches`), which keeps the visit's *plan*: every input of the
visit that may move while the batch runs (the measured size, the calibration, the policy, the
pricing and its horizon, the last seq the plan read).

Collecting (:mod:`.batch_collect`) makes the same visit again from the plan on the window as
the plan read it (the items up to that seq: appends since come after them), so it asks the
same request; :class:`BatchAnswers` answers it with the batch's summary. A visit that asks for
more (a span summarized in chunks, a retention repair, a second run) asks the live summarizer
for the rest. The fold then lands through the commit every fold takes.

:class:`BatchTicket` is what the scheduler's pending set and the collection job carry: enough to
find the batch, and to cancel it once its session is gone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sessionfold.core.batching import BatchTerms, request_key
from sessionfold.core.compact import FoldVisit
from sessionfold.core.economics import FoldEconomics
from sessionfold.core.errors import InvalidInputError, PermanentSummarizerError, SummaryDeferred
from sessionfold.core.fold_cost import FoldPricing
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import Summarizer, Summary
from sessionfold.core.tokens import Calibration
from sessionfold.core.window import Originals, Trigger, WindowItem
from sessionfold.store.results import BatchMark, Claim, SessionInfo, Window

from .providers.batch_api import BatchApi, BatchCapable

__all__ = [
    "BatchAnswers",
    "BatchMismatch",
    "BatchOffer",
    "BatchRecorder",
    "BatchTicket",
    "DeferredRequest",
    "plan_of",
    "visit_of",
]


@dataclass(frozen=True)
class DeferredRequest:
    """The summary request a visit sent to the batch API."""

    messages: tuple[Message, ...]
    previous_summary: str | None
    must_keep: tuple[str, ...]

    @property
    def key(self) -> str:
        return request_key(self.messages, self.previous_summary, self.must_keep)


class BatchRecorder:
    """The batch summarizer of a visit that may send its fold to a batch API: it keeps the
    first request and stops the visit (:class:`SummaryDeferred`). ``model`` and
    ``context_tokens`` are the live summarizer's, so the planner shapes the same requests."""

    def __init__(self, live: Summarizer) -> None:
        self.model = live.model
        self.context_tokens = live.context_tokens
        self.request: DeferredRequest | None = None

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        self.request = DeferredRequest(tuple(messages), previous_summary, tuple(must_keep))
        raise SummaryDeferred("the summary request went to the provider's batch API")


class BatchMismatch(Exception):
    """Internal: a visit made again asked another first request than its batch answers (its
    inputs moved after all). The collection then calls the summarizer now instead."""


class BatchAnswers:
    """The batch summarizer of a visit made again at collection: its first request is
    answered with the batch's summary (it must be the request the batch was sent, ``key``);
    any further one goes to ``live`` (None: refused as a permanent failure)."""

    def __init__(self, key: str, answer: Summary, live: Summarizer | None, *, model: str,
                 context_tokens: int) -> None:
        self.key = key
        self.answer = answer
        self.live = live
        self.model = model
        self.context_tokens = context_tokens
        self.answered = False

    def summarize(self, messages: Sequence[Message], *, previous_summary: str | None = None,
                  must_keep: Sequence[str] = ()) -> Summary:
        if not self.answered:
            self.answered = True
            if request_key(messages, previous_summary, must_keep) != self.key:
                raise BatchMismatch("the visit made again asks another summary than its "
                                    "batch answers")
            return self.answer
        if self.live is None:
            raise PermanentSummarizerError("the fold asks for a further summary and no "
                                           "summarizer may be called for it")
        return self.live.summarize(messages, previous_summary=previous_summary,
                                   must_keep=must_keep)


@dataclass(frozen=True)
class BatchTicket:
    """A pending batch fold as the scheduler's pending set and a collection job carry it."""

    session_id: str
    incarnation: int
    job_id: str
    provider: str
    batch_id: str

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session_id, "incarnation": self.incarnation,
                "job": self.job_id, "provider": self.provider, "batch": self.batch_id}

    def member(self) -> str:
        """The ticket as one string (a sorted set's member; sorted keys: one spelling)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Any) -> BatchTicket:
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"a batch ticket is an object, got {type(data).__name__}")
        try:
            return cls(session_id=str(data["session"]), incarnation=int(data["incarnation"]),
                       job_id=str(data["job"]), provider=str(data["provider"]),
                       batch_id=str(data["batch"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"not a batch ticket: {exc}") from None

    @classmethod
    def of(cls, claim: Claim, mark: BatchMark) -> BatchTicket:
        return cls(session_id=claim.session_id, incarnation=claim.incarnation,
                   job_id=mark.job_id, provider=mark.provider, batch_id=mark.batch_id)


@dataclass(frozen=True)
class BatchOffer:
    """A provider's batch API offered to background visits: ``summarizer`` (the bare provider:
    its ``build_request`` words the request) and its ``api``; ``delay_s`` the batch's expected
    delay, ``max_wait_s`` how long a fold waits for one at most."""

    summarizer: BatchCapable
    delay_s: float
    max_wait_s: float
    api: BatchApi = field(init=False)

    def __post_init__(self) -> None:
        for name in ("delay_s", "max_wait_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise InvalidInputError(f"{name} must be a positive number of seconds, "
                                        f"got {value!r}")
        object.__setattr__(self, "api", self.summarizer.batch_api())

    @property
    def provider(self) -> str:
        return self.api.provider

    def terms(self, info: SessionInfo) -> BatchTerms:
        """The batch as ``info``'s session sees it: its expected delay times the session's
        call rate, measured over its life (its calls since it was created, to its last change:
        the claim of this visit)."""
        age_s = max(1.0, (info.updated_at - info.created_at).total_seconds())
        return BatchTerms(delay_calls=self.delay_s * info.calls / age_s)

    def submit(self, claim: Claim, trigger: Trigger, request: DeferredRequest,
               plan: Mapping[str, Any], *, now: datetime) -> BatchMark:
        """Send ``request`` in a batch of its own; the session's batch mark to hold the claim
        with (raises what the provider's API raises, mapped)."""
        key = request.key
        body = self.summarizer.build_request(request.messages,
                                             previous_summary=request.previous_summary,
                                             must_keep=request.must_keep)
        batch_id = self.api.submit(key, body)
        return BatchMark(provider=self.provider, batch_id=batch_id, custom_id=key,
                         job_id=claim.job_id, epoch=claim.epoch, trigger=trigger,
                         submitted_at=now, deadline=now + timedelta(seconds=self.max_wait_s),
                         plan=plan)


def plan_of(visit: FoldVisit, window: Window) -> dict[str, Any]:
    """What a visit is made again with at collection: every input of ``visit`` that may move
    while its batch runs, the last seq of the ``window`` it planned on, and the summarizer's
    model and context it shaped its requests for."""
    economics = visit.economics
    shaped_for = visit.batch_summarizer or visit.summarizer
    return {
        "seen_seq": max((item.end_seq for item in window.items), default=None),
        "model": None if shaped_for is None else shaped_for.model,
        "context_tokens": None if shaped_for is None else shaped_for.context_tokens,
        "policy": visit.policy.to_json(),
        "measured_tokens": visit.measured_tokens,
        "calibration": None if visit.calibration is None else visit.calibration.to_json(),
        "trigger": visit.trigger,
        "target_tokens": visit.target_tokens,
        "trigger_tokens": visit.trigger_tokens,
        "economics": None if economics is None else {
            "pricing": economics.pricing.model_dump(mode="json"), "cold": economics.cold,
            "growth_tokens": economics.growth_tokens,
            "remaining_calls": economics.remaining_calls,
            "horizon_growth": economics.horizon_growth, "lag_calls": economics.lag_calls,
            "delay_calls": None if economics.batch is None else economics.batch.delay_calls,
        },
    }


def visit_of(plan: Mapping[str, Any], window: Window, key: str, answer: Summary, *,
             live: Summarizer | None, latched: frozenset[str],
             originals: Originals | None = None) -> tuple[list[WindowItem], FoldVisit]:
    """The window items and the visit of ``plan`` (:func:`plan_of`) made again on ``window``
    with the batch's ``answer`` to request ``key``: the items the plan read (up to its last
    seq; those appended since come after them). ``live`` is asked for any further summary
    (None: the answer is the visit's only one: it was paid for, whatever the spend cap says
    now)."""
    seen = plan.get("seen_seq")
    keep = [seen is None or item.end_seq <= seen for item in window.items]
    items = [item for item, kept in zip(window.items, keep, strict=True) if kept]
    chars = ([c for c, kept in zip(window.chars, keep, strict=True) if kept]
             if len(window.chars) == len(window.items) else None)
    economics = plan.get("economics")
    calibration = plan.get("calibration")
    model = plan.get("model") or (live.model if live is not None else answer.usage.model)
    context = plan.get("context_tokens") or (live.context_tokens if live is not None
                                             else 1_000_000)
    answers = BatchAnswers(key, answer, live, model=str(model), context_tokens=int(context))
    visit = FoldVisit(
        FoldPolicy.from_json(dict(plan["policy"])), live or answers, system=window.system,
        measured_tokens=plan.get("measured_tokens"),
        calibration=None if calibration is None else Calibration.model_validate(calibration),
        trigger=plan.get("trigger", "threshold"), target_tokens=plan.get("target_tokens"),
        latched=latched, originals=originals,
        economics=None if economics is None else _economics_of(economics),
        trigger_tokens=plan.get("trigger_tokens"), item_chars=chars or None,
        batch_summarizer=answers)
    return items, visit


def _economics_of(data: Mapping[str, Any]) -> FoldEconomics:
    delay = data.get("delay_calls")
    return FoldEconomics(FoldPricing.model_validate(data["pricing"]), cold=bool(data["cold"]),
                         growth_tokens=data.get("growth_tokens"),
                         remaining_calls=data.get("remaining_calls"),
                         horizon_growth=float(data["horizon_growth"]),
                         lag_calls=float(data["lag_calls"]),
                         batch=None if delay is None else BatchTerms(delay_calls=float(delay)))


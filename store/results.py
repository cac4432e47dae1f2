"""What the session store hands back: plain, immutable values (no live database objects)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.searchtext import Match
from sessionfold.core.tokens import Calibration
from sessionfold.core.window import CompactionRecord, FoldedSpan, WindowItem

__all__ = [
    "NO_FOLD_OUTCOMES",
    "AppendResult",
    "BatchMark",
    "Claim",
    "ClaimStatus",
    "CommitResult",
    "DeadLetter",
    "FoldContext",
    "GaveUp",
    "LedgerEntry",
    "Origin",
    "PruneReport",
    "SearchHit",
    "SessionInfo",
    "StoredRecord",
    "StoredSpan",
    "UsageBatch",
    "UsageReport",
    "UsageResult",
    "Window",
    "past_trigger",
    "skip_reason",
]


def past_trigger(tokens: int, trigger_tokens: int, *, paused: bool = False) -> bool:
    """Whether a session of ``tokens`` is due a background fold: not paused, and past its
    trigger (the one the store keeps, :attr:`SessionInfo.trigger_tokens`). The one statement of
    the rule: the gate, the session row, an append's ``crossed_trigger``, the scheduler's filter
    and :func:`skip_reason` ask here, and the store's sweep
    says the same in SQL (:func:`~sessionfold.store.sessions.over_trigger`)."""
    return not paused and tokens > trigger_tokens


@dataclass(frozen=True, slots=True)
class SessionGate:
    """The few fields of a session row a scheduler checks each usage report against (read in
    bulk, cached per session; :meth:`SessionStore.session_gates
    <sessionfold.store.store.SessionStore.session_gates>`): which incarnation of the id it is,
    and whether the report may take it past its trigger. A decision to fold is always made on
    a fresh, full :class:`SessionInfo`."""

    id: str
    incarnation: int
    created_at: datetime
    paused: bool
    current_tokens: int
    trigger_tokens: int

    def past_trigger(self, tokens: int | None = None) -> bool:
        """:func:`past_trigger` for this session at ``tokens`` (None: its current size)."""
        return past_trigger(self.current_tokens if tokens is None else tokens,
                            self.trigger_tokens, paused=self.paused)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session's row: policy, fold fence, sizes, and the last visit's outcome."""

    id: str
    policy: FoldPolicy
    system: str
    revision: int
    fold_revision: int
    fold_epoch: int
    claimed_by: str | None
    claim_expires_at: datetime | None
    paused: bool
    ledger_len: int
    window_tokens: int
    system_tokens: int
    measured_tokens: int | None
    measured_seq: int | None
    measured_revision: int | None
    calibration: Calibration
    #: The size the trigger compares: the last accepted report plus the calibrated estimate of
    #: what was appended since; the calibrated estimate of the whole request when never measured.
    current_tokens: int
    #: The size past which a background fold is due: the policy's trigger, or lower where the
    #: cost model set the next visit earlier (:func:`~sessionfold.core.economics.
    #: next_trigger_tokens`, kept by each priced visit's own transaction).
    trigger_tokens: int
    last_visit_outcome: str | None
    last_visit_tokens: int | None
    last_visit_at: datetime | None
    created_at: datetime
    updated_at: datetime
    #: Random per created session: an id deleted and created again names another incarnation.
    incarnation: int
    #: Claims in a row taken over from a holder that never finished (worker lost mid-fold);
    #: 0 again after a finished visit, a committed fold, or a resume.
    abandoned_folds: int = 0
    #: The agent's model calls so far (its assistant messages; recall exchanges not counted).
    calls: int = 0
    #: A running mean of the calls made while a background fold ran (None: none landed yet).
    fold_lag_calls: float | None = None
    #: A fold of this session waiting on a provider's batch API (None: none waits). While it
    #: waits it holds the session's claim, and no other background fold is planned.
    batch: BatchMark | None = None

    @property
    def gate(self) -> SessionGate:
        """This row's :class:`SessionGate`."""
        return SessionGate(self.id, self.incarnation, self.created_at, self.paused,
                           self.current_tokens, self.trigger_tokens)

    @property
    def over_trigger(self) -> bool:
        """Not paused and past its trigger (:attr:`trigger_tokens`): a background fold is
        due (:func:`past_trigger`)."""
        return past_trigger(self.current_tokens, self.trigger_tokens, paused=self.paused)

    @property
    def over_budget(self) -> bool:
        """Deprecated name of :attr:`over_trigger` (it never meant past the budget); goes away
        in the next release."""
        warnings.warn("SessionInfo.over_budget is deprecated: it says whether the session is "
                      "over its trigger; read over_trigger", DeprecationWarning, stacklevel=2)
        return self.over_trigger


#: Visit outcomes after which a session waits for its window to grow (or its policy to change).
NO_FOLD_OUTCOMES = frozenset({"nothing-to-fold", "refused"})


def skip_reason(info: SessionInfo, verdict_policy: FoldPolicy | None = None,
                trigger: str = "threshold") -> str | None:
    """Why a session should not get a fold job now, or None if it should: the scheduler's
    decision on its fresh read of the row (:mod:`sessionfold.workers.fold_enqueue`), and what
    an agent's request guard asks before it waits for a job to be queued.

    ``verdict_policy`` is the policy the session had when its last no-fold visit was seen (a
    changed policy reopens the session); None when unknown. ``trigger="idle"``: the session is
    idle past its cache's lifetime, and is judged by its policy's idle trigger alone (its cold
    cache changes what pays, whatever the last visit decided; the sweep sends one per idle gap).
    """
    if info.paused:
        return "paused"
    if info.batch is not None:
        return "batch-pending"  # its fold waits on a batch API, under its claim
    if trigger == "idle":
        return None if info.policy.over_idle_trigger(info.current_tokens) else "under-idle-trigger"
    if not past_trigger(info.current_tokens, info.trigger_tokens):
        return "under-trigger"
    if info.last_visit_outcome in NO_FOLD_OUTCOMES:
        grown = info.last_visit_tokens is None or info.current_tokens > info.last_visit_tokens
        policy_changed = verdict_policy is not None and verdict_policy != info.policy
        if not grown and not policy_changed:
            return "no-growth-since-" + info.last_visit_outcome
    return None


@dataclass(frozen=True, slots=True)
class BatchMark:
    """A fold waiting on a provider's batch API, as the session row keeps it
    (:attr:`SessionInfo.batch`; written by :meth:`SessionStore.hold_for_batch
    <sessionfold.store.store.SessionStore.hold_for_batch>`).

    ``job_id`` and ``epoch`` name the claim the fold holds while it waits (its commit must
    still match them); ``provider``, ``batch_id`` and ``custom_id`` where its answer is;
    ``deadline`` when it stops waiting. ``plan`` is the runtime's: what the visit is made
    again with once the answer is in; the store keeps it as given.
    """

    provider: str
    batch_id: str
    custom_id: str
    job_id: str
    epoch: int
    trigger: str
    submitted_at: datetime
    deadline: datetime
    plan: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "batch_id": self.batch_id,
                "custom_id": self.custom_id, "job_id": self.job_id, "epoch": self.epoch,
                "trigger": self.trigger, "submitted_at": self.submitted_at.isoformat(),
                "deadline": self.deadline.isoformat(), "plan": dict(self.plan)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchMark:
        return cls(provider=str(data["provider"]), batch_id=str(data["batch_id"]),
                   custom_id=str(data["custom_id"]), job_id=str(data["job_id"]),
                   epoch=int(data["epoch"]), trigger=str(data["trigger"]),
                   submitted_at=datetime.fromisoformat(str(data["submitted_at"])),
                   deadline=datetime.fromisoformat(str(data["deadline"])),
                   plan=dict(data.get("plan") or {}))


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The seqs an append wrote (or, for a retried key, had written: ``duplicate=True``).

    ``current_tokens``: the session's size after the append (the trigger's measure; None for a
    duplicate, which wrote nothing). ``crossed_trigger``: this append took a session that is not
    paused from at or under its trigger to past it, so a background fold is due now (the client
    nudges the scheduler rather than wait for the next usage report).
    """

    first_seq: int
    last_seq: int
    revision: int
    duplicate: bool = False
    current_tokens: int | None = None
    crossed_trigger: bool = False


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One provider usage report, for :meth:`SessionStore.record_usage_batch`.

    ``usage`` is the provider's usage object (or dict); the store reads the prompt size from it
    with :func:`~sessionfold.core.tokens.reported_prompt_tokens`. A caller that already read it
    (the scheduler: a usage event carries the counts) passes ``prompt_tokens`` instead, and
    ``usage`` is not read.
    """

    session_id: str
    usage: Any
    seq: int
    revision: int
    model: str | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class UsageBatch:
    """What :meth:`SessionStore.apply_usage_batch
    <sessionfold.store.store.SessionStore.apply_usage_batch>` did: how many reports were taken,
    and the gate of every named session that exists, as the write left it."""

    taken: int
    gates: Mapping[str, SessionGate]


@dataclass(frozen=True, slots=True)
class UsageResult:
    """Whether a report was taken as the session's measured size, and the size the trigger sees."""

    accepted: bool
    current_tokens: int


@dataclass(frozen=True, slots=True)
class Window:
    """A session's window at one revision: the system prompt beside the items, never in them."""

    session_id: str
    system: str
    revision: int
    items: list[WindowItem] = field(default_factory=list)
    #: Parallel to ``items`` when the read knew them: each item's message as the store holds it,
    #: in characters of compact JSON (the fold engine's character sizes, ``fold_window``'s
    #: ``item_chars``); None for an item served from the process's cache; empty when not read.
    #: A figure of the read, not of the window: left out of equality and repr.
    chars: list[int | None] = field(default_factory=list, compare=False, repr=False)

    def messages(self) -> list[Message]:
        return [item.message for item in self.items]

    @property
    def tokens(self) -> int:
        """Estimate of the items (framing included), uncalibrated, system prompt excluded."""
        return sum(item.tokens or 0 for item in self.items)


#: Who a ledger row comes from: the agent's own conversation, or a recall exchange the client
#: made with the ledger on the agent's behalf (not indexed, first to go in a fold).
Origin = Literal["agent", "recall"]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One ledger row. ``message`` is None once discarded under ``retain="discard"``."""

    seq: int
    message: Message | None
    tokens: int
    appended_at: datetime
    discarded_at: datetime | None = None
    origin: Origin = "agent"


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One chunk a ledger search found (:meth:`SessionStore.search`).

    ``excerpt`` is the chunk's text: at most ``core.searchtext.CHUNK_CHARS`` characters of
    ledger message ``seq``'s searchable text, starting at character ``offset`` of it (NUL
    shown as U+FFFD). ``rank`` orders hits within a tier, higher first (FTS5 ``-bm25`` on
    SQLite, ``ts_rank_cd`` on PostgreSQL: comparable within one backend only). ``tier`` is the
    match mode that found it (``exact``, ``all``; ``any-exact`` and ``any`` when the search
    fell back to any of the query's words).
    """

    seq: int
    offset: int
    excerpt: str
    rank: float
    tier: Match

    @property
    def fallback(self) -> bool:
        """Found by a fallback tier: it holds some of the query's words, not all."""
        return self.tier.startswith("any")


class StoredSpan(FoldedSpan):
    """A :class:`FoldedSpan` as committed: which job wrote it, under which epoch and revision."""

    id: int
    session_id: str
    job_id: str | None
    epoch: int
    revision: int
    created_at: datetime
    #: When the span's ledger rows were blanked (``retain="discard"``); None while retained.
    discarded_at: datetime | None = None


class StoredRecord(CompactionRecord):
    """A :class:`CompactionRecord` as written: by which job, under which epoch and revision."""

    id: int
    session_id: str
    job_id: str | None
    epoch: int | None
    revision: int
    created_at: datetime


ClaimStatus = Literal["claimed", "already-committed", "newer-claim", "abandoned"]


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to :meth:`SessionStore.claim`.

    ``claimed``: go ahead, commit with ``epoch`` and ``incarnation``. ``already-committed``:
    this job's visit is already written (a redelivery), stop. ``newer-claim``: another claim is
    live or came after the job was enqueued, stop before paying for a summary. ``abandoned``:
    the session's folds were abandoned ``abandoned_folds`` times in a row (at least the
    caller's ``max_abandoned``), stop and give the session up.
    """

    status: ClaimStatus
    session_id: str
    job_id: str
    epoch: int
    revision: int
    #: The session's incarnation (random per created session): epochs and revisions restart
    #: when an id is deleted and created again, so a commit names both.
    incarnation: int
    #: The job holding the session's claim after this call (None when nobody does).
    holder: str | None = None
    expires_at: datetime | None = None
    detail: str = ""
    #: The session's count of abandoned claims after this call (see SessionInfo).
    abandoned_folds: int = 0

    @property
    def claimed(self) -> bool:
        return self.status == "claimed"


@dataclass(frozen=True, slots=True)
class CommitResult:
    """A committed fold: the window revision it produced and the spans it wrote.

    ``duplicate=True``: this job had already committed this fold; nothing was written again.
    """

    session_id: str
    revision: int
    spans: list[StoredSpan]
    record_id: int | None
    duplicate: bool = False
    #: The calls the session made while this background fold ran (None: an inline fold, or
    #: nothing committed): the fold procedure's running prior for sessions not yet measured.
    lag_calls: float | None = None


@dataclass(frozen=True, slots=True)
class GaveUp:
    """What :meth:`SessionStore.give_up` wrote, in one transaction: the dead letter, the visit's
    refusal record (``record``, as written) and, when asked, the pause."""

    dead_letter_id: int
    record_id: int
    record: CompactionRecord
    paused: bool


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A fold job given up on, kept for an operator."""

    id: int
    job_id: str
    session_id: str
    reason: str
    attempts: int
    payload: Mapping[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class FoldContext:
    """What a fold needs, read in the transaction that claims the session
    (:meth:`SessionStore.begin_fold`).

    ``claim`` answers whether the visit may go on. When it holds (``claim.claimed``), the rest
    is the state the claim saw: the ``window`` to plan on, the ``session`` (policy, sizes,
    calibration, pause) and the fingerprints of spans refused before (``latched``: not to be
    sent to the summarizer again). When it does not, they are empty: the visit stops there.
    """

    claim: Claim
    window: Window | None = None
    session: SessionInfo | None = None
    latched: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What :meth:`SessionStore.prune` deleted (with ``dry_run``: would delete), per table.

    ``batches``: the transactions it took. ``complete``: False when ``max_batches`` stopped it
    first; then pass ``resume`` back (a cursor: the step it stopped in, and in the visit
    records the last session done) to carry on where it stopped. None once complete.
    """

    append_keys: int
    visit_records: int
    dead_letters: int
    batches: int
    dry_run: bool
    complete: bool
    resume: str | None = None

    @property
    def total(self) -> int:
        return self.append_keys + self.visit_records + self.dead_letters

"""What the session store hands back: plain, immutable values (no live database objects)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration
from sessionfold.core.window import CompactionRecord, FoldedSpan, WindowItem

__all__ = [
    "AppendResult",
    "Claim",
    "ClaimStatus",
    "CommitResult",
    "DeadLetter",
    "LedgerEntry",
    "SessionInfo",
    "StoredRecord",
    "StoredSpan",
    "UsageReport",
    "UsageResult",
    "Window",
]


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
    trigger_tokens: int
    last_visit_outcome: str | None
    last_visit_tokens: int | None
    last_visit_at: datetime | None
    created_at: datetime
    updated_at: datetime
    #: Claims in a row taken over from a holder that never finished (worker lost mid-fold);
    #: 0 again after a finished visit, a committed fold, or a resume.
    abandoned_folds: int = 0

    @property
    def over_budget(self) -> bool:
        return not self.paused and self.current_tokens > self.trigger_tokens


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The seqs an append wrote (or, for a retried key, had written: ``duplicate=True``)."""

    first_seq: int
    last_seq: int
    revision: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One provider usage report, for :meth:`SessionStore.record_usage_batch`."""

    session_id: str
    usage: Any
    seq: int
    revision: int
    model: str | None = None


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

    def messages(self) -> list[Message]:
        return [item.message for item in self.items]

    @property
    def tokens(self) -> int:
        """Estimate of the items (framing included), uncalibrated, system prompt excluded."""
        return sum(item.tokens or 0 for item in self.items)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One ledger row. ``message`` is None once discarded under ``retain="discard"``."""

    seq: int
    message: Message | None
    tokens: int
    appended_at: datetime
    discarded_at: datetime | None = None


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

    ``claimed``: go ahead, commit with ``epoch``. ``already-committed``: this job's visit is
    already written (a redelivery), stop. ``newer-claim``: another claim is live or came after
    the job was enqueued, stop before paying for a summary. ``abandoned``: the session's folds
    were abandoned ``abandoned_folds`` times in a row (at least the caller's
    ``max_abandoned``), stop and give the session up.
    """

    status: ClaimStatus
    session_id: str
    job_id: str
    epoch: int
    revision: int
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

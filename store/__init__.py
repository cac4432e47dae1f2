"""sessionfold.store: the SQLAlchemy session store (ledger, window, spans, records).

See :class:`SessionStore` and docs/internals.md ("store") for the contract the workers use.
"""

from .claims import DEFAULT_LEASE_S
from .engine import create_store_engine, default_sqlite_url
from .pruning import RetentionRules
from .results import (
    AppendResult,
    BatchMark,
    Claim,
    ClaimStatus,
    CommitResult,
    DeadLetter,
    FoldContext,
    GaveUp,
    LedgerEntry,
    PruneReport,
    SearchHit,
    SessionGate,
    SessionInfo,
    StoredRecord,
    StoredSpan,
    UsageBatch,
    UsageReport,
    UsageResult,
    Window,
)
from .schema import SCHEMA_REVISION
from .store import SessionStore

__all__ = [
    "DEFAULT_LEASE_S",
    "SCHEMA_REVISION",
    "AppendResult",
    "BatchMark",
    "Claim",
    "ClaimStatus",
    "CommitResult",
    "DeadLetter",
    "FoldContext",
    "GaveUp",
    "LedgerEntry",
    "PruneReport",
    "RetentionRules",
    "SearchHit",
    "SessionGate",
    "SessionInfo",
    "SessionStore",
    "StoredRecord",
    "StoredSpan",
    "UsageBatch",
    "UsageReport",
    "UsageResult",
    "Window",
    "create_store_engine",
    "default_sqlite_url",
]

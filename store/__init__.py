"""sessionfold.store: the SQLAlchemy session store (ledger, window, spans, records).

See :class:`SessionStore` and docs/internals.md ("store") for the contract the workers use.
"""

from .claims import DEFAULT_LEASE_S
from .engine import create_store_engine, database_url, default_sqlite_url
from .results import (
    AppendResult,
    Claim,
    ClaimStatus,
    CommitResult,
    DeadLetter,
    LedgerEntry,
    SessionInfo,
    StoredRecord,
    StoredSpan,
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
    "Claim",
    "ClaimStatus",
    "CommitResult",
    "DeadLetter",
    "LedgerEntry",
    "SessionInfo",
    "SessionStore",
    "StoredRecord",
    "StoredSpan",
    "UsageReport",
    "UsageResult",
    "Window",
    "create_store_engine",
    "database_url",
    "default_sqlite_url",
]

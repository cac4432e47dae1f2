"""The ledger: appending messages (and their window items), reading them back, recovering spans.

An append goes in two steps. :func:`prepare_append` does everything that needs no lock: it
validates the messages (a malformed message raises before anything is written), strips
``cache_control`` and counts tokens (tiktoken on a 400 k-token tool output takes a while: not
while holding the session's write lock). :func:`append_prepared` then, in one transaction under
the session row lock, checks the caller's idempotency key and the tool pairing against the ledger
tail, and writes the ledger rows, the window items at the tail, and the session's new sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sessionfold.core.errors import (
    DiscardedOriginalsError,
    InvalidInputError,
    InvalidMessageError,
    ToolPairingError,
)
from sessionfold.core.layers import clip_oversized
from sessionfold.core.messages import Message, ToolUseBlock, check_tool_pairing, parse_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, TokenCounter
from sessionfold.core.window import WindowItem
from sqlalchemy.engine import Connection

from .codec import decode_message, encode_message, messages_digest
from .results import AppendResult, LedgerEntry
from .schema import append_keys, ledger, sessions, window_items
from .sessions import current_tokens, load_session, lock_session

__all__ = ["PreparedAppend", "append_prepared", "prepare_append", "read_ledger", "recover"]

MAX_KEY_LEN = 255


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    """Validated messages in stored form, with their token estimates and digest."""

    messages: list[Message]
    encoded: list[dict[str, Any]]
    tokens: list[int]
    digest: str


def prepare_append(raw: object, counter: TokenCounter) -> PreparedAppend:
    """Validate and encode an append's messages (no database access)."""
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        raise InvalidMessageError(
            f"messages must be a list of messages, got {type(raw).__name__}")
    if not raw:
        raise InvalidMessageError("nothing to append: the list of messages is empty")
    parsed = [parse_message(m, i) for i, m in enumerate(raw)]
    # Pairing inside the batch now; pairing with the ledger tail under the lock.
    if len(parsed) > 1:
        check_tool_pairing(parsed[1:], first_index=1, previous=parsed[0])
    encoded = [encode_message(m) for m in parsed]
    stored = [decode_message(e) for e in encoded]
    return PreparedAppend(
        messages=stored,
        encoded=encoded,
        tokens=[counter.message(m) for m in stored],
        digest=messages_digest(encoded),
    )


def check_key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN:
        raise InvalidInputError(
            f"an append key must be a string of 1 to {MAX_KEY_LEN} characters, got {key!r:.80}")
    return key


def _tail_message(open_ids: Sequence[str]) -> Message | None:
    """Stand-in for the ledger's last message: all tool pairing needs of it is its tool_use ids."""
    if not open_ids:
        return None
    return Message.model_construct(role="assistant", content=[
        ToolUseBlock.model_construct(type="tool_use", id=i, name="tool", input={})
        for i in open_ids
    ])


def _check_tail_pairing(messages: Sequence[Message], open_ids: Sequence[str],
                        next_seq: int) -> None:
    if open_ids:
        missing = set(open_ids) - set(messages[0].tool_result_ids())
        if missing:
            raise ToolPairingError(
                f"the last ledger message (seq {next_seq - 1}) made tool call(s) "
                f"{sorted(missing)} that the first appended message does not answer",
                index=0, field="content",
            )
    check_tool_pairing(messages, previous=_tail_message(open_ids))


def _window_item(seq: int, message: Message, tokens: int, policy: FoldPolicy,
                 counter: TokenCounter) -> WindowItem:
    item = WindowItem.model_construct(start_seq=seq, end_seq=seq, kind="message",
                                      message=message, edits=(), version=0, tokens=tokens)
    # A tool result can only be oversized if the whole message is near the limit: skip the
    # per-block check for the (vast) majority of messages.
    if tokens > policy.max_item_tokens * 9 // 10:
        item = clip_oversized(item, seq, policy.max_item_tokens, counter)
    return item


def append_prepared(conn: Connection, sid: str, prepared: PreparedAppend, key: str | None, *,
                    now: datetime, counter: TokenCounter) -> AppendResult:
    """Write an append under the session lock (see the module doc)."""
    row = lock_session(conn, sid)
    if key is not None:
        hit = conn.execute(sa.select(append_keys).where(
            append_keys.c.session_id == sid, append_keys.c.key == key)).first()
        if hit is not None:
            if hit.digest != prepared.digest:
                raise InvalidInputError(
                    f"append key {key!r} of session {sid!r} was used before for other messages "
                    f"(seqs {hit.first_seq}–{hit.last_seq}); a retry must send the same messages")
            return AppendResult(hit.first_seq, hit.last_seq, hit.revision, duplicate=True)

    _check_tail_pairing(prepared.messages, row.tail_tool_use_ids, row.next_seq)
    policy = FoldPolicy.from_json(row.policy)
    first_seq: int = row.next_seq
    revision: int = row.revision + 1
    ledger_rows: list[dict[str, Any]] = []
    item_rows: list[dict[str, Any]] = []
    for offset, (message, encoded, tokens) in enumerate(
            zip(prepared.messages, prepared.encoded, prepared.tokens, strict=True)):
        seq = first_seq + offset
        item = _window_item(seq, message, tokens, policy, counter)
        ledger_rows.append({"session_id": sid, "seq": seq, "message": encoded,
                            "tokens": tokens, "appended_at": now, "discarded_at": None})
        item_rows.append({
            "session_id": sid, "start_seq": seq, "end_seq": seq, "kind": "message",
            "message": encoded if item.message is message else encode_message(item.message),
            "edits": list(item.edits), "version": revision,
            "tokens": item.tokens if item.tokens is not None else tokens,
        })
    conn.execute(ledger.insert(), ledger_rows)
    conn.execute(window_items.insert(), item_rows)
    last_seq = first_seq + len(ledger_rows) - 1
    if key is not None:
        conn.execute(append_keys.insert().values(
            session_id=sid, key=key, first_seq=first_seq, last_seq=last_seq, revision=revision,
            digest=prepared.digest, created_at=now))

    added = sum(r["tokens"] for r in item_rows)
    window_tokens = row.window_tokens + added
    pending = row.pending_tokens + added
    conn.execute(sessions.update().where(sessions.c.id == sid).values(
        next_seq=last_seq + 1,
        revision=revision,
        tail_tool_use_ids=prepared.messages[-1].tool_use_ids(),
        window_tokens=window_tokens,
        pending_tokens=pending,
        current_tokens=current_tokens(
            measured_tokens=row.measured_tokens, pending_tokens=pending,
            system_tokens=row.system_tokens, window_tokens=window_tokens,
            calibration=Calibration.model_validate(row.calibration)),
        updated_at=now,
    ))
    return AppendResult(first_seq, last_seq, revision)


def _check_seq(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def read_ledger(conn: Connection, sid: str, start: int = 0,
                end: int | None = None) -> list[LedgerEntry]:
    """Ledger rows with ``start <= seq < end`` (``end=None``: to the tail), in seq order."""
    _check_seq("start", start)
    query = (sa.select(ledger.c.seq, ledger.c.message, ledger.c.tokens, ledger.c.appended_at,
                       ledger.c.discarded_at)
             .where(ledger.c.session_id == sid, ledger.c.seq >= start)
             .order_by(ledger.c.seq))
    if end is not None:
        query = query.where(ledger.c.seq < _check_seq("end", end))
    rows = conn.execute(query).all()
    if not rows:
        load_session(conn, sid)  # SessionNotFoundError when there is no such session
    return [LedgerEntry(seq=r.seq,
                        message=decode_message(r.message) if r.message is not None else None,
                        tokens=r.tokens, appended_at=r.appended_at, discarded_at=r.discarded_at)
            for r in rows]


def recover(conn: Connection, sid: str, start_seq: int, end_seq: int) -> list[Message]:
    """The original messages of ledger seqs ``start_seq..end_seq`` (inclusive), exactly."""
    _check_seq("start_seq", start_seq)
    _check_seq("end_seq", end_seq)
    if end_seq < start_seq:
        raise InvalidInputError(f"end_seq {end_seq} is before start_seq {start_seq}")
    rows = conn.execute(
        sa.select(ledger.c.seq, ledger.c.message, ledger.c.discarded_at)
        .where(ledger.c.session_id == sid, ledger.c.seq >= start_seq, ledger.c.seq <= end_seq)
        .order_by(ledger.c.seq)).all()
    if len(rows) != end_seq - start_seq + 1:
        info = load_session(conn, sid)
        raise InvalidInputError(
            f"session {sid!r} has ledger seqs 0–{info.next_seq - 1}; "
            f"cannot recover #{start_seq}–#{end_seq}")
    discarded = [r.discarded_at for r in rows if r.discarded_at is not None]
    if discarded:
        when = min(discarded).isoformat(timespec="seconds")
        raise DiscardedOriginalsError(
            f"the originals of ledger #{start_seq}–#{end_seq} in session {sid!r} were discarded "
            f"at {when} (policy retain='discard'); only the window's summary remains")
    return [decode_message(r.message) for r in rows]

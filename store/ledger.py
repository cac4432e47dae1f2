"""The ledger: appending messages (and their window items), reading them back, recovering spans.

An append goes in two steps. :func:`prepare_append` does everything that needs no lock: it
validates the messages (a malformed message raises before anything is written), strips
``cache_control``, counts tokens and derives the search index's chunks (tiktoken and the index
words of a 400 k-token tool output take a while: not while holding the session's write lock).
:func:`append_prepared` then, in one transaction under the session row lock, checks the caller's
idempotency key and the tool pairing against the ledger tail, and writes the ledger rows, their
search chunks (:mod:`.search`), the window items at the tail, and the session's new sizes.

A recall exchange (``recall=True``: the client asked the ledger on the agent's behalf) is
written with ``origin='recall'`` and window items of kind ``"recall"``, and is not indexed (it
repeats what the ledger holds). Its key's digest covers the origin too: the same key for the
same messages appended as the other origin is refused like other messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pydantic_core
import sqlalchemy as sa
from sessionfold.core.clip import clip_oversized
from sessionfold.core.errors import (
    DiscardedOriginalsError,
    InvalidInputError,
    InvalidMessageError,
    TooLargeError,
    ToolPairingError,
)
from sessionfold.core.messages import (
    Message,
    ToolUseBlock,
    check_tool_pairing,
    find_lone_surrogate,
    parse_message,
)
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.searchtext import SearchChunk
from sessionfold.core.tokens import Calibration, TokenCounter
from sessionfold.core.window import ItemKind, WindowItem
from sqlalchemy.engine import Connection

from .codec import decode_message, encode_message, messages_digest, tool_use_id_digest
from .notify import notify_window_change
from .results import AppendResult, LedgerEntry, Origin, past_trigger
from .schema import append_keys, ledger, tool_use_ids, window_items
from .search import chunk_rows, derive_chunks, insert_chunks
from .sessions import current_tokens, load_session, lock_session, update_session

__all__ = ["MAX_APPEND_MESSAGES", "MAX_MESSAGE_BYTES", "PreparedAppend", "append_prepared",
           "prepare_append", "read_ledger", "recover"]

MAX_KEY_LEN = 255
#: The most messages one append takes. A whole transcript imported at once is a few hundred;
#: thousands in one request are a client's bug or an attack, and one transaction writing them
#: holds the session's write lock (and every fold of it) for seconds.
MAX_APPEND_MESSAGES = 1000
#: The largest message one append takes, as stored (its JSON, UTF-8). 8 MiB of text is about
#: two million tokens, more than any model's context window holds, and the largest image the
#: Messages API takes (5 MB) fits in base64: a larger message could never be sent to a model,
#: and every window holding it would fail.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: Tool ids looked up per statement (an imported transcript may append hundreds of calls at
#: once; SQLite caps the parameters of one statement).
_LOOKUP_CHUNK = 500


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    """Validated messages in stored form, with their token estimates, digest and search chunks
    (per message, numbered from 0: the first seq is added under the lock; None: not indexed)."""

    messages: list[Message]
    encoded: list[dict[str, Any]]
    tokens: list[int]
    digest: str
    origin: Origin = "agent"
    chunks: list[list[SearchChunk]] | None = None


def prepare_append(raw: object, counter: TokenCounter, *, recall: bool = False) -> PreparedAppend:
    """Validate and encode an append's messages and derive their search chunks (no database
    access). ``recall``: a recall exchange (not indexed)."""
    if not isinstance(recall, bool):
        raise InvalidInputError(f"recall must be True or False, got {recall!r}")
    if isinstance(raw, Mapping):
        what = "one message (an object)" if "role" in raw else "an object"
        raise InvalidMessageError(f"messages must be a list of messages; got {what}: pass "
                                  "[message] for one")
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise InvalidMessageError(
            f"messages must be a list of messages, got {type(raw).__name__}")
    if not raw:
        raise InvalidMessageError("nothing to append: the list of messages is empty")
    if len(raw) > MAX_APPEND_MESSAGES:
        raise TooLargeError(f"an append takes at most {MAX_APPEND_MESSAGES:,} messages, got "
                            f"{len(raw):,}: send them in several appends")
    parsed = [parse_message(m, i) for i, m in enumerate(raw)]
    # Pairing inside the batch now; pairing with the ledger tail under the lock.
    if len(parsed) > 1:
        check_tool_pairing(parsed[1:], first_index=1, previous=parsed[0])
    encoded = [encode_message(m) for m in parsed]
    _check_sizes(encoded)
    stored = [decode_message(e) for e in encoded]
    # An agent append keeps the digest it always had (keys written before recall still match).
    digest = messages_digest([{"origin": "recall"}, *encoded] if recall else encoded)
    return PreparedAppend(
        messages=stored,
        encoded=encoded,
        tokens=[counter.message(m) for m in stored],
        digest=digest,
        origin="recall" if recall else "agent",
        # Derived from the stored form, as a reindex derives them from the ledger row.
        chunks=None if recall else derive_chunks(stored),
    )


def _check_sizes(encoded: Sequence[dict[str, Any]]) -> None:
    """TooLargeError naming the first message larger than :data:`MAX_MESSAGE_BYTES` stored."""
    for index, data in enumerate(encoded):
        size = len(pydantic_core.to_json(data))
        if size > MAX_MESSAGE_BYTES:
            raise TooLargeError(
                f"this message is {size:,} bytes as stored, more than the {MAX_MESSAGE_BYTES:,} "
                "bytes one message may hold (about two million tokens of text: more than any "
                "context window); send a shorter one, or store the content elsewhere and send "
                "where it is", index=index)


def check_key(key: object) -> str | None:
    """An append key is 1 to 255 characters of valid Unicode without control characters (NUL
    among them, which PostgreSQL text cannot hold)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN:
        raise InvalidInputError(
            f"an append key must be a string of 1 to {MAX_KEY_LEN} characters, got {key!r:.80}")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in key) or find_lone_surrogate(key) is not None:
        raise InvalidInputError(f"an append key must be valid Unicode without control "
                                f"characters, got {key!r:.80}")
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
                 counter: TokenCounter, kind: ItemKind = "message") -> WindowItem:
    item = WindowItem.model_construct(start_seq=seq, end_seq=seq, kind=kind,
                                      message=message, edits=(), version=0, tokens=tokens)
    # The cap is on the whole item: clip_oversized answers from ``tokens`` for the (vast)
    # majority of messages that fit it, and clips the texts of one that does not.
    return clip_oversized(item, seq, policy.max_item_tokens, counter)


def _new_tool_use_ids(conn: Connection, sid: str, messages: Sequence[Message],
                      first_seq: int) -> list[dict[str, Any]]:
    """The ``tool_use_ids`` rows of an append; ToolPairingError if one of its ids is in the
    ledger already (the batch itself was checked by :func:`check_tool_pairing`).

    The Messages API refuses a request that repeats a tool_use id, and a fold keeps tool calls
    in the window for turns, so the id must be new to the whole ledger, not only its tail. Run
    under the session lock: no other append can take the id between the lookup and the insert.
    """
    found: dict[str, tuple[int, int, int]] = {}  # digest -> (batch index, block position, seq)
    for offset, message in enumerate(messages):
        for pos, block in enumerate(message.blocks()):
            if isinstance(block, ToolUseBlock):
                found[tool_use_id_digest(block.id)] = (offset, pos, first_seq + offset)
    if not found:
        return []
    digests = list(found)
    used = [row for start in range(0, len(digests), _LOOKUP_CHUNK)
            for row in conn.execute(sa.select(tool_use_ids.c.id_digest, tool_use_ids.c.seq).where(
                tool_use_ids.c.session_id == sid,
                tool_use_ids.c.id_digest.in_(digests[start:start + _LOOKUP_CHUNK])))]
    if used:
        first = min(used, key=lambda r: found[r.id_digest][:2])
        index, pos, _ = found[first.id_digest]
        block = messages[index].blocks()[pos]
        assert isinstance(block, ToolUseBlock)
        raise ToolPairingError(
            f"tool_use id {block.id!r} was used before in session {sid!r} (ledger "
            f"#{first.seq}); tool_use ids must be unique in a conversation",
            index=index, field=f"content[{pos}].id")
    return [{"session_id": sid, "id_digest": digest, "seq": seq}
            for digest, (_, _, seq) in found.items()]


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
                    f"(seqs {hit.first_seq}–{hit.last_seq}); a retry must send the same messages "
                    "as the same origin (agent or recall)")
            return AppendResult(hit.first_seq, hit.last_seq, hit.revision, duplicate=True)

    _check_tail_pairing(prepared.messages, row.tail_tool_use_ids, row.next_seq)
    first_seq: int = row.next_seq
    new_ids = _new_tool_use_ids(conn, sid, prepared.messages, first_seq)
    policy = FoldPolicy.from_json(row.policy)
    revision: int = row.revision + 1
    kind: ItemKind = "recall" if prepared.origin == "recall" else "message"
    ledger_rows: list[dict[str, Any]] = []
    item_rows: list[dict[str, Any]] = []
    for offset, (message, encoded, tokens) in enumerate(
            zip(prepared.messages, prepared.encoded, prepared.tokens, strict=True)):
        seq = first_seq + offset
        item = _window_item(seq, message, tokens, policy, counter, kind)
        ledger_rows.append({"session_id": sid, "seq": seq, "message": encoded,
                            "tokens": tokens, "appended_at": now, "discarded_at": None,
                            "origin": prepared.origin})
        item_rows.append({
            "session_id": sid, "start_seq": seq, "end_seq": seq, "kind": kind,
            "message": encoded if item.message is message else encode_message(item.message),
            "edits": list(item.edits), "version": revision,
            "tokens": item.tokens if item.tokens is not None else tokens,
        })
    conn.execute(ledger.insert(), ledger_rows)
    conn.execute(window_items.insert(), item_rows)
    if prepared.chunks is not None:
        insert_chunks(conn, chunk_rows(sid, first_seq, prepared.chunks))
    if new_ids:
        conn.execute(tool_use_ids.insert(), new_ids)
    last_seq = first_seq + len(ledger_rows) - 1
    if key is not None:
        conn.execute(append_keys.insert().values(
            session_id=sid, key=key, first_seq=first_seq, last_seq=last_seq, revision=revision,
            digest=prepared.digest, created_at=now))

    added = sum(r["tokens"] for r in item_rows)
    window_tokens = row.window_tokens + added
    pending = row.pending_tokens + added
    current = current_tokens(
        measured_tokens=row.measured_tokens, pending_tokens=pending,
        system_tokens=row.system_tokens, window_tokens=window_tokens,
        calibration=Calibration.model_validate(row.calibration))
    # One assistant message of the agent's own is one model call (the planner's age prior);
    # a recall exchange is the client's, not a call the agent made.
    calls = 0 if prepared.origin == "recall" else sum(
        1 for m in prepared.messages if m.role == "assistant")
    update_session(conn, sid, {
        "next_seq": last_seq + 1,
        "revision": revision,
        "tail_tool_use_ids": prepared.messages[-1].tool_use_ids(),
        "window_tokens": window_tokens,
        "pending_tokens": pending,
        "current_tokens": current,
        "calls": row.calls + calls,
        "updated_at": now,
    })
    notify_window_change(conn, sid, row.incarnation, revision, "append")
    crossed = (not past_trigger(row.current_tokens, row.trigger_tokens, paused=row.paused)
               and past_trigger(current, row.trigger_tokens, paused=row.paused))
    return AppendResult(first_seq, last_seq, revision, current_tokens=current,
                        crossed_trigger=crossed)


def _check_seq(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def read_ledger(conn: Connection, sid: str, start: int = 0,
                end: int | None = None) -> list[LedgerEntry]:
    """Ledger rows with ``start <= seq < end`` (``end=None``: to the tail), in seq order."""
    _check_seq("start", start)
    query = (sa.select(ledger.c.seq, ledger.c.message, ledger.c.tokens, ledger.c.appended_at,
                       ledger.c.discarded_at, ledger.c.origin)
             .where(ledger.c.session_id == sid, ledger.c.seq >= start)
             .order_by(ledger.c.seq))
    if end is not None:
        query = query.where(ledger.c.seq < _check_seq("end", end))
    rows = conn.execute(query).all()
    if not rows:
        load_session(conn, sid)  # SessionNotFoundError when there is no such session
    return [LedgerEntry(seq=r.seq,
                        message=decode_message(r.message) if r.message is not None else None,
                        tokens=r.tokens, appended_at=r.appended_at, discarded_at=r.discarded_at,
                        origin=r.origin)
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

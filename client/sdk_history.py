"""What the SDK wrappers share: the caller's history against the ledger, and the reply recorded.

Plain SDK code sends its whole history on every call. A wrapper (:mod:`.sdk_anthropic`,
:mod:`.sdk_openai`) checks it against what the session's ledger holds and appends only what is
new (:class:`HistoryLedger`): the caller's messages must begin with the ledger's, in ledger order
and without the recall exchanges the wrapper made itself. When the two differ,
:class:`HistoryMismatchError` names the first index where they part, and a ``system=`` that is
not the session's system prompt is refused the same way. Nothing is appended on a mismatch. A
reply that mixed recall with the agent's own tools is answered by the caller for the agent's
tools only: the recall answers are added to its next message before it is appended.

After a reply's usage is reported, :func:`record_reply` writes it to the ledger (keyed by the
reply's id, so a retry does not add it twice). A reply that cannot be recorded (the store is
down, the session was deleted meanwhile, the store refuses the message, a chat completion does
not convert) is not lost: :class:`ReplyNotRecordedError` carries it as ``response``, saying
why. Raised rather than logged because the wrapper's contract is that the ledger holds what the
caller was given; a reply returned unrecorded would break it silently, to surface one call
later as a history mismatch or a missing turn.

Errors of the wrappers besides the library's and the provider SDK's own::

    InvalidMessageError
    └── HistoryMismatchError     the history does not begin with the ledger; nothing appended
    SessionfoldError
    └── ReplyNotRecordedError    the reply was paid for and reported but not recorded
                                 (``response``: the reply; ``__cause__``: why)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.core.errors import InvalidMessageError, SessionfoldError
from sessionfold.core.frame import RECALL_TOOL_NAME
from sessionfold.core.messages import (
    Message,
    ToolResultBlock,
    ToolUseBlock,
    parse_message,
    parse_messages,
)
from sessionfold.store import AppendResult

from .recall_round import reply_content
from .session import SessionHandle

__all__ = [
    "HistoryLedger",
    "HistoryMismatchError",
    "ReplyNotRecordedError",
    "checked_history",
    "record_reply",
    "system_text",
]


class HistoryMismatchError(InvalidMessageError):
    """The caller's history does not begin with what the session holds, or its ``system``
    is not the session's. ``index`` is the first message where the two part (None for the
    system prompt, ``field="system"``). Nothing was appended."""


class ReplyNotRecordedError(SessionfoldError):
    """The model's reply was paid for, and its usage reported, but it could not be recorded in
    the session's ledger.

    ``response`` is the reply as the call would have returned it: the SDK's ``Message`` or
    ``ChatCompletion``; for a stream read to its end, the final ``Message`` (also
    ``get_final_message()``) or the assistant message in OpenAI's shape (also ``message()``).
    ``reason`` says why, and ``__cause__`` is the error met (StoreError, SessionNotFoundError,
    InvalidMessageError...). The ledger does not hold the reply: put it in the history as
    usual and the next call appends it with the messages after it (a fault that lasts fails
    that call's append, before anything is sent), or deal with the cause.
    """

    def __init__(self, session_id: str, response: Any, cause: BaseException) -> None:
        self.session_id = session_id
        self.response = response
        self.reason = f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"session {session_id!r}: the model's reply was not recorded in the ledger "
            f"({self.reason}); its usage was reported, and the reply is this error's "
            "`response`")



# --- the caller's history against the ledger ---------------------------------------------------

def _comparable(message: Message, recall_ids: set[str]) -> Any:
    """``message`` as compared: string content as one text block, without ``cache_control``
    markers (the SDK's caller moves them from call to call), and without the tool results
    answering recall calls (the wrapper writes those, whatever the caller sent)."""
    blocks = []
    for block in message.blocks():
        if isinstance(block, ToolResultBlock) and block.tool_use_id in recall_ids:
            continue
        data = block.model_dump(mode="json", exclude_unset=True)
        data.pop("cache_control", None)
        blocks.append(data)
        if isinstance(block, ToolUseBlock) and block.name == RECALL_TOOL_NAME:
            recall_ids.add(block.id)
    return [message.role, blocks]


@dataclass
class _Known:
    """The ledger as the caller would have sent it, read once and kept: one comparable form
    per row the caller saw (None for a row discarded under ``retain="discard"``: anything goes
    there), the recall calls met so far, and the last row (the reply the caller answers)."""

    next_seq: int = 0
    rows: list[Any] = field(default_factory=list)
    recall_ids: set[str] = field(default_factory=set)
    last: Message | None = None

    def refresh(self, handle: SessionHandle, ledger_len: int) -> None:
        if ledger_len < self.next_seq:  # the session was deleted and made again
            self.next_seq, self.rows, self.recall_ids, self.last = 0, [], set(), None
        if ledger_len == self.next_seq:
            return
        for entry in handle.ledger(self.next_seq):
            self.next_seq = entry.seq + 1
            if entry.origin == "recall":  # the wrapper's own exchange: the caller never saw it
                continue
            self.last = entry.message
            self.rows.append(None if entry.message is None
                             else _comparable(entry.message, self.recall_ids))


def system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    parts = []
    for block in system if isinstance(system, list) else []:
        text = block.get("text") if isinstance(block, Mapping) else getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
    return "".join(parts)


class HistoryLedger:
    """What one wrapper knows of its session's ledger, and the step every call starts with."""

    def __init__(self, handle: SessionHandle) -> None:
        self.handle = handle
        self.known = _Known()

    def new_messages(self, messages: Sequence[Message], system: str | None) -> list[Message]:
        """The caller's ``messages`` past the ledger, the recall answers added to the first
        (see the module doc); HistoryMismatchError when the caller's history does not begin
        with the ledger or ``system`` (None: not given) is not the session's."""
        info = self.handle.info()
        if system is not None and system != info.system:
            raise HistoryMismatchError(
                f"system= differs from session {self.handle.session_id!r}'s system prompt "
                f"(given {len(system)} characters starting {system[:60]!r}; the session's "
                f"starts {info.system[:60]!r}); the system prompt is fixed when the session "
                "is made: leave system out to send the session's", field="system")
        self.known.refresh(self.handle, info.ledger_len)
        rows = self.known.rows
        recall_ids: set[str] = set()  # the caller's side: the recall calls met in its own history
        for i, message in enumerate(messages[:len(rows)]):
            theirs = _comparable(message, recall_ids)
            if rows[i] is not None and theirs != rows[i]:
                raise HistoryMismatchError(
                    f"the history differs from session {self.handle.session_id!r}'s ledger "
                    f"from message {i} on (a {message.role} message here, a {rows[i][0]} "
                    f"message with other content in the ledger); the messages must begin "
                    f"with the {len(rows)} the session holds, in order", index=i)
        if len(messages) < len(rows):
            raise HistoryMismatchError(
                f"the history has {len(messages)} messages but session "
                f"{self.handle.session_id!r}'s ledger holds {len(rows)}: the messages must "
                "begin with all of them", index=len(messages))
        new = list(messages[len(rows):])
        if new and new[0].role == "user" and self.known.last is not None:
            new[0] = self._with_recall_answers(self.known.last, new[0])
        return new

    def _with_recall_answers(self, reply: Message, answer: Message) -> Message:
        """``answer`` (the user message after ``reply``) with ``reply``'s recall calls
        answered from the ledger, in the order ``reply`` made its calls."""
        recalls = {b.id for b in reply.blocks()
                   if isinstance(b, ToolUseBlock) and b.name == RECALL_TOOL_NAME}
        if not recalls:
            return answer
        own = [b.model_dump(mode="json", exclude_unset=True) for b in answer.blocks()
               if not (isinstance(b, ToolResultBlock) and b.tool_use_id in recalls)]
        content = self.handle.tool_results(reply.to_json(), own)
        return Message(role="user", content=parse_message(
            {"role": "user", "content": content}).content)


def checked_history(messages: Any) -> list[Message]:
    if not isinstance(messages, list | tuple):
        raise InvalidMessageError(f"messages is a list of messages, got "
                                  f"{type(messages).__name__}")
    return parse_messages(list(messages), check_pairing=False)


def _reply_message(content: Any) -> list[dict[str, Any]]:
    """The ledger row of a reply with ``content`` ([] for a reply with no content)."""
    if not content:
        return []
    return [{"role": "assistant", "content": content}]


def _id_of(reply: Any) -> str | None:
    value = reply.get("id") if isinstance(reply, Mapping) else getattr(reply, "id", None)
    return value if isinstance(value, str) and 0 < len(value) <= 180 else None


def record_reply(handle: SessionHandle, reply: Any, response: Any) -> AppendResult | None:
    """Append the reply (the SDK's object or its JSON) to the ledger, once per reply id; the
    append's result (None: a reply with no content, nothing appended).

    Called once its usage has been reported. Whatever fails here, the caller must still get
    what it paid for: :class:`ReplyNotRecordedError` carrying ``response`` (the reply as the
    caller would have got it)."""
    try:
        rows = _reply_message(reply_content(reply))
        if not rows:
            return None
        reply_id = _id_of(reply)
        return handle.append(rows, key=f"sdk-reply-{reply_id}" if reply_id else None)
    except Exception as exc:
        raise ReplyNotRecordedError(handle.session_id, response, exc) from exc


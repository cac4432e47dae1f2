"""Messages in and out in either shape: Anthropic Messages or OpenAI chat completions.

The store keeps the Anthropic shape; the OpenAI shape is converted on the way in
(:func:`~sessionfold.core.messages.from_openai`) and on the way out
(:func:`~sessionfold.core.messages.to_openai`). The client's ``append``/``window`` and the HTTP
API's append and window routes take it through this module.

**Which shape.** ``shape="openai"`` or ``"anthropic"`` says it; ``"auto"`` (the default of an
append) reads it from the messages, and only where they are unambiguous (:func:`detect_shape`,
with the markers session files are read by,
:func:`~sessionfold.core.messages.openai_marker` and
:func:`~sessionfold.core.messages.anthropic_marker`): a ``tool`` / ``system`` / ``developer``
role, a field only the chat shape has (``tool_calls``, ``tool_call_id``, ``refusal``,
``reasoning_content``...), an assistant message with ``content: null`` or a content part only it
has (``image_url``, ``file``, ``input_audio``, ``refusal``) is OpenAI; a content block of any
type that is not an OpenAI part type (``tool_use``, ``tool_result``, ``thinking``, ``image``, a
server tool's block...) or a :class:`~sessionfold.core.messages.Message` is Anthropic; a plain
text message reads the same in both and is taken as Anthropic. A batch holding both kinds is
refused: pass ``shape=``.

**The grouping rule.** sessionfold's pairing rule is the Messages API's: the message after an
assistant message with tool calls is one user message answering *all* of them (a turn, which a
fold keeps or takes whole). OpenAI agents send one ``tool`` message per call instead. So:

1. Consecutive ``tool`` messages are merged into one user message of ``tool_result`` blocks, in
   the order given (within one append, they all answer the assistant message before them, or
   the ledger's last message when they open the append).
2. A set that answers only part of the open tool calls of the ledger's last message is never
   written as a partial answer (a turn must stay whole, and the Messages API refuses a request
   whose tool calls are not all answered). The client's handle *holds* it
   (:class:`HeldToolResults`) and writes nothing; the append that brings the rest writes the
   held results and its own as one user message, in arrival order. The held results live in
   that handle only (one handle per agent thread, as always): a result held when the agent's
   process dies is lost with the rest of its turn, while the ledger still ends with the open
   calls (an agent mid-call), which a restart runs again.
3. The HTTP API holds nothing between requests (an agent's requests may reach different API
   processes): a request must carry every ``tool`` message answering one assistant message,
   and a partial set is refused (422 ``tool-pairing``) with nothing written.

**Out.** A window read with ``shape="openai"`` is the ``messages=`` of a chat completion
(:func:`~sessionfold.core.messages.to_openai`): the system prompt first as a ``system``
message, tool calls as ``tool_calls`` (as they came in: a custom call as ``custom``, arguments
that were not a JSON object as the text the model wrote), each tool result its own ``tool``
message, then the user's text, images (``image_url``) and PDFs (``file``). The chat shape has
no place for thinking, server tools' blocks, images inside tool results or documents other than
base64 PDFs: they are left out of that rendering (never out of the ledger), and an assistant
message with nothing else is left out whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sessionfold.core.errors import InvalidInputError, InvalidMessageError, ToolPairingError
from sessionfold.core.messages import Message, ToolResultBlock, sdk_dict
from sessionfold.core.openai_shape import (
    anthropic_marker,
    from_openai,
    in_openai_terms,
    leading_system_count,
    openai_marker,
)
from sessionfold.store import AppendResult

__all__ = [
    "SHAPES",
    "WINDOW_SHAPES",
    "HeldAppend",
    "HeldToolResults",
    "OpenAIAppend",
    "Shape",
    "WindowShape",
    "check_shape",
    "check_system",
    "check_window_shape",
    "detect_shape",
    "openai_append",
    "pairing_hint",
    "partial_answer",
    "resolve_shape",
]

#: The shape of an append: ``auto`` reads it from the messages (see the module doc).
Shape = Literal["auto", "anthropic", "openai"]
#: The shape a window is rendered in.
WindowShape = Literal["anthropic", "openai"]
SHAPES: tuple[str, ...] = get_args(Shape)
WINDOW_SHAPES: tuple[str, ...] = get_args(WindowShape)



def check_shape(shape: object) -> Shape:
    if shape not in SHAPES:
        raise InvalidInputError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r:.40}")
    return shape  # type: ignore[return-value]


def check_window_shape(shape: object) -> WindowShape:
    if shape not in WINDOW_SHAPES:
        raise InvalidInputError(f"a window's shape is {' or '.join(WINDOW_SHAPES)}, got "
                                f"{shape!r:.40}")
    return shape  # type: ignore[return-value]


def detect_shape(raw: Sequence[Any]) -> WindowShape:
    """The shape of ``raw`` where it is unambiguous (see the module doc); plain text messages
    are the same in both and read as Anthropic. InvalidMessageError for a batch of both."""
    openai = next(((i, why) for i, m in enumerate(raw)
                   if (why := openai_marker(sdk_dict(m)))), None)
    if openai is None:
        return "anthropic"
    anthropic = next(((i, why) for i, m in enumerate(raw)
                      if (why := anthropic_marker(sdk_dict(m)))), None)
    if anthropic is not None:
        raise InvalidMessageError(
            f"the messages mix the OpenAI chat shape (message {openai[0]}: {openai[1]}) and "
            f"the Anthropic Messages shape (message {anthropic[0]}: {anthropic[1]}); pass "
            "shape='openai' or shape='anthropic'", index=anthropic[0])
    return "openai"


def resolve_shape(raw: Sequence[Any], shape: object) -> WindowShape:
    """The shape to read ``raw`` in: ``shape`` when it says one, else :func:`detect_shape`."""
    checked = check_shape(shape)
    return detect_shape(raw) if checked == "auto" else checked


@dataclass(frozen=True)
class OpenAIAppend:
    """An append's OpenAI messages converted: the Anthropic-shape ``messages`` to write, the
    system prompt the input carried (None: no system message), and the input, for errors."""

    messages: list[Message]
    system: str | None
    raw: list[Any]

    def readdress(self, exc: InvalidMessageError, *, shift: int = 0) -> InvalidMessageError:
        """``exc`` (raised about :attr:`messages`, maybe by the store) in terms of the OpenAI
        input. ``shift``: held tool results put in front of the first message's blocks."""
        if shift and exc.index == 0 and exc.field and exc.field.startswith("content["):
            pos, _, rest = exc.field[len("content["):].partition("]")
            if pos.isdigit() and int(pos) >= shift:
                exc = type(exc)(exc.reason, index=0, field=f"content[{int(pos) - shift}]{rest}")
            else:
                return type(exc)(exc.reason, index=None, field=None)
        return in_openai_terms(exc, self.raw)

    @property
    def opens_with_results(self) -> bool:
        """Whether the first message is a group of tool results only (``tool`` messages)."""
        return bool(self.messages) and _results_only(self.messages[0])


def _results_only(message: Message) -> bool:
    blocks = message.blocks()
    return message.role == "user" and bool(blocks) and all(
        isinstance(b, ToolResultBlock) for b in blocks)


def openai_append(raw: Sequence[Any]) -> OpenAIAppend:
    """Convert an append's OpenAI messages (dicts or SDK objects); errors name the OpenAI
    input. The pairing is left to the store, which checks it against the ledger tail."""
    if isinstance(raw, Mapping | str | bytes):
        raise InvalidMessageError("messages must be a list; pass [message] for one")
    dicts = [sdk_dict(m) for m in raw]
    conversation = from_openai(dicts, check_pairing=False)
    # Only system messages that open the append are the prompt re-sent (checked against the
    # session's); a later one is kept at its place among the messages.
    return OpenAIAppend(messages=conversation.messages,
                        system=(conversation.system if leading_system_count(dicts) else None),
                        raw=dicts)


def check_system(given: str | None, session_system: str) -> None:
    """A ``system`` message in an append must be the session's own prompt (fixed at creation):
    an agent that keeps it at the head of its list may send it along, never change it."""
    if given is not None and given != session_system:
        raise InvalidInputError(
            "the system message differs from the session's system prompt, which is fixed at "
            "creation; leave it out of the append, or create the session with it")


def pairing_hint(exc: InvalidMessageError, converted: OpenAIAppend) -> InvalidMessageError:
    """A tool-pairing error of an OpenAI append that opens with tool results, saying the rule
    (a request carries every tool message answering one assistant message)."""
    if not (isinstance(exc, ToolPairingError) and exc.index == 0
            and converted.opens_with_results):
        return exc
    return type(exc)(f"{exc.reason} (OpenAI shape: send every tool message answering one "
                     "assistant message in one request; they become one user message of "
                     "tool results)", index=exc.index, field=exc.field)


# --- results held until the set is complete (the client's handle) ------------------------------

@dataclass(frozen=True, slots=True)
class HeldAppend(AppendResult):
    """What an append that was held returns: nothing written (``last_seq`` is ``first_seq - 1``;
    ``first_seq`` is the seq the held results will take), the tool call ids held so far
    (``held``) and those still owed (``owed``)."""

    held: tuple[str, ...] = ()
    owed: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeldToolResults:
    """Tool results answering part of the open calls of ledger row ``seq`` (see the module doc,
    rule 2), kept by a handle until the rest arrives."""

    seq: int
    open_ids: tuple[str, ...]
    blocks: tuple[ToolResultBlock, ...]

    @property
    def answered(self) -> tuple[str, ...]:
        return tuple(b.tool_use_id for b in self.blocks)

    @property
    def owed(self) -> tuple[str, ...]:
        return tuple(i for i in self.open_ids if i not in self.answered)

    def merged_into(self, messages: list[Message]) -> list[Message]:
        """``messages`` with the held results at the head of the first one (a user message),
        or as a user message of their own before it. InvalidMessageError for a second result
        of a held call that says something else (the same one again is a retry)."""
        first = messages[0] if messages else None
        if first is None or first.role != "user":
            return [Message(role="user", content=list(self.blocks)), *messages]
        fresh = []
        held = {b.tool_use_id: b for b in self.blocks}
        for pos, block in enumerate(first.blocks()):
            if isinstance(block, ToolResultBlock) and block.tool_use_id in held:
                if block != held[block.tool_use_id]:
                    raise ToolPairingError(
                        f"a second, different result for tool call {block.tool_use_id!r}, "
                        "whose result is held until the rest arrives", index=0,
                        field=f"content[{pos}].tool_use_id")
                continue
            fresh.append(block)
        merged = Message(role="user", content=[*self.blocks, *fresh])
        return [merged, *messages[1:]]


def partial_answer(message: Message, seq: int, open_ids: Sequence[str]) -> HeldToolResults | None:
    """The results to hold when ``message`` (tool results only) answers some, not all, of the
    open calls ``open_ids`` of ledger row ``seq``, and nothing else; None otherwise (the store
    then writes it, or says what is wrong)."""
    if not _results_only(message):
        return None
    answered = set(message.tool_result_ids())
    if not answered < set(open_ids):
        return None
    blocks = tuple(b for b in message.blocks() if isinstance(b, ToolResultBlock))
    return HeldToolResults(seq, tuple(open_ids), blocks)

"""A session's window as read, ready to send, and where its prompt-cache breakpoints go.

::

    view = handle.window(cache_breakpoints=True)
    client.messages.create(model=MODEL, system=view.system, messages=view.messages, ...)
    handle.report_usage(reply.usage, seq=view.last_seq, revision=view.revision)

``place_cache_breakpoints`` marks the end of the window's stable head (the task and the summary
that leads the folded history, unchanged until the next fold) and the last message (the growing
conversation): see its docstring for why both.

**Recall hints.** For a session with recall on, the view tells the model how to read back what a
fold took out: each mask stub and clip seam gets ``; call sessionfold_recall with seq "12" to
read it`` before its closing bracket (a seam also names the offset where the part left out
starts), and each summary or notice frame line whose originals are retained ends with the same
clause for its range. The hint goes *into* the authored line it belongs to, not on a line of its
own, so the model reads the pointer where it reads the gap, and a hinted frame is still one line
that :func:`~sessionfold.core.frame.frame_info` reads. Hints are rendered here, at read time,
never stored: the same item renders the same bytes on every read (the prompt cache holds), the
items a fold compares stay as planned, and a session that opted out (``recall=False``, or a
``call()`` whose ``fn`` takes no tools) is never told of a tool it does not have. A request
without the tool may not carry calls of it either: a recall exchange still in the window is then
sent as the one line a dropped one leaves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionfold.core.errors import InvalidInputError
from sessionfold.core.messages import Conversation, Message
from sessionfold.core.openai_write import to_openai
from sessionfold.core.recall_hints import as_sent, out_of_sight
from sessionfold.core.window import WindowItem
from sessionfold.store import Window

from .shapes import WindowShape, check_window_shape

__all__ = ["WindowView", "place_cache_breakpoints", "rendered", "view_of"]

_CACHE_CONTROL = {"type": "ephemeral"}
# Blocks the Messages API does not let carry cache_control.
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class WindowView:
    """A session's window as read: ready to send, with what a usage report must name.

    ``messages`` are JSON for the SDK: the Anthropic shape, or with ``shape="openai"`` the
    ``messages=`` of an OpenAI chat completion (the system prompt first, see
    :mod:`.shapes`); ``revision`` and ``last_seq`` (the highest ledger seq in the window, -1
    when empty) go into the usage report of a call built from this view.
    """

    session_id: str
    system: str
    revision: int
    last_seq: int
    messages: list[dict[str, Any]]
    items: list[WindowItem] = field(repr=False)
    #: Rendered for a request that carries the recall tool (hints in stubs, seams, frames).
    recall: bool = False
    #: The shape of ``messages``.
    shape: WindowShape = "anthropic"
    #: Calibrated tokens of the stored window that ``messages`` leave out: what the pre-send
    #: guard took off this request (0 for a window sent as stored).
    unsent_tokens: int = 0
    #: The estimate of the tool definitions sessionfold adds to this request (the recall
    #: tool), which the session's calibration leaves out: a usage report of the request takes
    #: them off again, so the calibration learns the window and the agent's own tools alone
    #: whether or not the recall tool was offered (see ``SessionHandle.call``).
    tool_tokens: int = 0

    @property
    def edited(self) -> bool:
        """Whether the request holds an item sessionfold edited out of sight: something only
        the recall tool gives back (:func:`~sessionfold.core.recall_hints.out_of_sight`)."""
        return out_of_sight(self.items)

    @property
    def tokens(self) -> int:
        """Estimate of the items (uncalibrated, system prompt excluded)."""
        return sum(item.tokens or 0 for item in self.items)


def place_cache_breakpoints(messages: Sequence[Mapping[str, Any]],
                            head: int) -> list[dict[str, Any]]:
    """Copies of ``messages`` with ``cache_control`` after message ``head`` and after the last.

    ``head`` ends the stable head of the window (the task and the summary that leads the folded
    history): it is unchanged until the next fold. The marker on the last message caches the
    growing conversation from call to call; the head marker still hits when more than the
    provider's look-back of blocks was appended between two calls. The marker goes on the last
    block that may carry one (not on thinking blocks). Inputs are not modified.
    """
    out = [dict(m) for m in messages]
    for index in sorted({head, len(out) - 1}):
        if 0 <= index < len(out):
            out[index] = _with_marker(out[index])
    return out


def _with_marker(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        blocks = [dict(b) if isinstance(b, Mapping) else b for b in content]
    else:
        return message
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if isinstance(block, dict) and block.get("type") not in _UNCACHEABLE:
            blocks[i] = {**block, "cache_control": dict(_CACHE_CONTROL)}
            return {**message, "content": blocks}
    return message


def _stable_head(items: Sequence[WindowItem]) -> int:
    """Index of the last item of the stable head: the last summary/notice, else the first item."""
    last_folded = max((i for i, item in enumerate(items) if item.kind in ("summary", "notice")),
                      default=0)
    return last_folded


def rendered(item: WindowItem, *, recall: bool) -> Message:
    """The message ``item`` is sent as (:func:`sessionfold.core.recall_hints.as_sent`)."""
    return as_sent(item, recall=recall)


def view_of(window: Window, *, cache_breakpoints: bool, recall: bool = False,
            shape: WindowShape = "anthropic") -> WindowView:
    """The :class:`WindowView` of a window read from the store, rendered for a request that
    carries the recall tool (``recall``) or not, in ``shape``. InvalidInputError for cache
    breakpoints in the OpenAI shape (``cache_control`` is the Messages API's; OpenAI caches
    prompt prefixes by itself)."""
    if check_window_shape(shape) == "openai" and cache_breakpoints:
        raise InvalidInputError("cache_breakpoints mark cache_control, which only the Anthropic "
                                "shape has; OpenAI caches prompt prefixes by itself")
    items = list(window.items)
    shown = [rendered(item, recall=recall) for item in items]
    if shape == "openai":
        messages = to_openai(Conversation(system=window.system, messages=shown))
    else:
        messages = [m.to_json() for m in shown]
    if cache_breakpoints and messages:
        messages = place_cache_breakpoints(messages, _stable_head(items))
    return WindowView(session_id=window.session_id, system=window.system,
                      revision=window.revision, last_seq=items[-1].end_seq if items else -1,
                      messages=messages, items=items, recall=recall, shape=shape)

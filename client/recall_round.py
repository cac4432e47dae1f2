"""One reply's recall calls answered together: sized so the request carrying them fits.

A reply may ask for many things at once (B1 at 16k: 34 queries in one reply), and its answers
go out together in the next request. So each answer is sized by the room the ones before it
left, counted as the ``tool_result`` block it goes out as and in the provider's tokens (the
calibration's slope), with every call still to come holding back the smallest answer there is;
and the room starts from the request the calls answer as it went out
(:func:`answer_basis`), not from the store's size alone. The client's recall round
(:mod:`.call_loop`) and the handle's helpers (``answer_recall``, ``tool_results``) use these.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.messages import parse_message
from sessionfold.core.tokens import TokenCounter, count_text
from sessionfold.store import SessionInfo

from .call_plan import CallPlan
from .recall import RecallAnswer, RecallStore, ToolCall, answer_tool_input, least_answer_tokens

__all__ = ["answer_basis", "answer_calls", "recall_exchange", "reply_content", "reply_id"]


def reply_content(reply: Any) -> Any:
    """The ``content`` of a model reply (the SDK's object or its JSON)."""
    return reply.get("content") if isinstance(reply, Mapping) else getattr(
        reply, "content", None)


def reply_id(reply: Any) -> str | None:
    """The id of a model reply, when it has a usable one."""
    value = reply.get("id") if isinstance(reply, Mapping) else getattr(reply, "id", None)
    return value if isinstance(value, str) and 0 < len(value) <= 200 else None


def answer_calls(store: RecallStore, session_id: str, calls: Sequence[ToolCall],
                 info: SessionInfo, counter: TokenCounter) -> list[RecallAnswer]:
    """Answer recall ``calls`` in order, each sized by the room the ones before it left (see
    the module doc); ``info`` is the session with the size to size them by."""
    slope = max(info.calibration.a if info.calibration.samples else 1.0, 0.0)
    # Every call gets an answer: those still to come hold back at least a no-room one each.
    least = math.ceil(least_answer_tokens(info, counter) * slope)
    answers: list[RecallAnswer] = []
    for k, call in enumerate(calls):
        pending = least * (len(calls) - k - 1)
        sized = dataclasses.replace(info, current_tokens=info.current_tokens + pending)
        result = answer_tool_input(store, session_id, call.input, info=sized, share=len(calls))
        answers.append(result)
        block = counter.message(parse_message(
            {"role": "user", "content": [result.tool_result(call.id)]}))
        grown = math.ceil(block * slope)  # the block holds the answer's text
        info = dataclasses.replace(info, current_tokens=info.current_tokens + grown)
    return answers


def answer_basis(info: SessionInfo, plan: CallPlan, sent_tokens: int | None, reply: Any,
                 counter: TokenCounter) -> SessionInfo:
    """The session with the size its recall answers are sized by: the larger of the size the
    store knows and the request just sent as it went out (``sent_tokens``: the system prompt,
    the window as rendered, with its recall hints and as the guard let it out, the tool
    definitions the calibration has not seen yet) plus the model's recall call, which the
    exchange appends. The store's size alone leaves out the hints, the call and, until a usage
    report is read back, the tools: answers sized by it took the request after them past the
    budget (B1, 16k, with the recall tool). ``sent_tokens`` None: the store's size."""
    if sent_tokens is None:
        return info
    estimate = sent_tokens
    try:
        estimate += counter.message(parse_message(
            {"role": "assistant", "content": reply_content(reply)}))
    except InvalidMessageError:
        estimate += count_text(json.dumps(reply_content(reply), default=str))
    basis = max(info.current_tokens, plan.calibration.predict(estimate))
    return dataclasses.replace(info, current_tokens=basis)


def recall_exchange(reply: Any, calls: Sequence[ToolCall],
                    answers: Sequence[RecallAnswer]) -> list[dict[str, Any]]:
    """The two ledger rows of a recall round: the reply, and a user message of its answers."""
    return [{"role": "assistant", "content": reply_content(reply)},
            {"role": "user", "content": [a.tool_result(c.id)
                                         for c, a in zip(calls, answers, strict=True)]}]

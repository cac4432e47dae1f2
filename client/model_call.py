"""The agent's model call as ``call()`` takes it: ``fn(system, messages[, tools])``.

``fn`` is the one piece of I/O the call loop (:mod:`.call_loop`) leaves to its adapters. How it
takes the tools sessionfold adds (the recall tool) is read from its signature: a ``tools``
keyword, a third positional argument, or neither -- the old two-argument contract, which gets
no tool and so no recall.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .call_loop import SendRequest

__all__ = ["AsyncModelCall", "ModelCall", "ModelCallWithTools", "ToolsMode", "invoke",
           "tools_mode"]

#: ``fn(system, messages)``: one model call; returns the provider's response (with ``.usage``).
ModelCall = Callable[[str, list[dict[str, Any]]], Any]
#: ``fn(system, messages, tools)`` (or ``tools=`` as a keyword): the tools to send beside the
#: agent's own, the recall tool among them.
ModelCallWithTools = Callable[[str, list[dict[str, Any]], list[dict[str, Any]]], Any]
AsyncModelCall = Callable[..., Awaitable[Any]]
#: How a model call takes the tools: as the ``tools`` keyword, as a third argument, or not.
ToolsMode = Literal["keyword", "positional", "none"]

_MODES: dict[tuple[object, bool], ToolsMode] = {}
_MODES_LOCK = threading.Lock()


def _inspect_mode(fn: Callable[..., Any]) -> ToolsMode:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: the old contract
        return "none"
    kinds = inspect.Parameter
    if any(p.name == "tools" and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
           for p in params):
        return "keyword"
    positional = [p for p in params
                  if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 3:
        return "positional"
    if any(p.kind == kinds.VAR_KEYWORD for p in params):
        return "keyword"  # forwards keywords: to the SDK's create(), most likely
    if any(p.kind == kinds.VAR_POSITIONAL for p in params):
        return "positional"
    return "none"


def tools_mode(fn: Callable[..., Any]) -> ToolsMode:
    """How ``fn`` takes the tools to send, read from its signature once per function (a lambda
    made anew on every turn has the same code, so it is inspected once too)."""
    if inspect.ismethod(fn):
        key: tuple[object, bool] = (fn.__func__.__code__, True)
    elif inspect.isfunction(fn):
        key = (fn.__code__, False)
    else:
        return _inspect_mode(fn)  # a partial, a callable object: cheap enough to read again
    mode = _MODES.get(key)
    if mode is None:
        mode = _inspect_mode(fn)
        with _MODES_LOCK:
            _MODES[key] = mode
    return mode


def invoke(fn: Callable[..., Any], mode: ToolsMode, step: SendRequest) -> Any:
    """Call ``fn`` with the request ``step`` says to send, and its tools if ``fn`` takes them
    (a fresh list each time: ``fn`` may keep or change it). An async ``fn`` returns what the
    caller awaits."""
    view = step.view
    if mode == "keyword":
        return fn(view.system, view.messages, tools=step.tools())
    if mode == "positional":
        return fn(view.system, view.messages, step.tools())
    return fn(view.system, view.messages)

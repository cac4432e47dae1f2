"""What a model call's usage report says: the usage read from the provider's reply, and the
report made to measure the stored window when the pre-send guard sent less of it.

A guarded request leaves part of the window out, so the provider counts fewer prompt tokens
than the window holds. The report names the window's ``(revision, seq)``, so it must measure
that window: :func:`with_prompt_tokens` adds back what was left out (less the tools
sessionfold added, which the calibration leaves out), or the session would look smaller than
it is, no background fold would come, and the calibration would learn a false offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sessionfold.runtime.usage import UsageEvent

__all__ = ["response_usage", "with_prompt_tokens"]


def response_usage(response: Any) -> tuple[Any, str | None]:
    """``(usage, model)`` of a provider response: an SDK object or a dict."""
    if isinstance(response, Mapping):
        return response.get("usage"), response.get("model")
    return getattr(response, "usage", None), getattr(response, "model", None)


def with_prompt_tokens(event: UsageEvent, tokens: int) -> UsageEvent:
    """``event`` measuring ``tokens`` more (or fewer) prompt tokens: added to its uncached
    input, or taken from it and then from its cache reads and writes, never below 0 (only the
    prompt's total is read by the scheduler and the calibration)."""
    if tokens >= 0:
        return dataclasses.replace(event, input_tokens=event.input_tokens + tokens)
    left = -tokens
    parts = []
    for value in (event.input_tokens, event.cache_read_input_tokens,
                  event.cache_creation_input_tokens):
        take = min(value, left)
        parts.append(value - take)
        left -= take
    return dataclasses.replace(event, input_tokens=parts[0], cache_read_input_tokens=parts[1],
                               cache_creation_input_tokens=parts[2])

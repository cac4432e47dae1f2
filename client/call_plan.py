"""What one ``call()`` decides before its first request: :class:`CallPlan`.

The plan is read from the session once per call (its policy, calibration and system prompt's
estimate) and holds what every request of the call is built and guarded with: whether the
recall tool is offered, and what the pre-send guard measures the request by. It is derived
from the store, never carried: a loop continued elsewhere (:meth:`.call_loop.CallLoop.resume`)
reads it again, keeping the tools the call offered.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sessionfold.core.errors import InvalidInputError
from sessionfold.core.frame import RECALL_TOOL_NAME
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.tokens import Calibration, count_text

from .recall import anthropic_tool

__all__ = ["OVER_BUDGET_CHOICES", "CallPlan", "OverBudget", "check_over_budget", "tool_tokens"]

#: What ``call()`` does with a request past the budget less its margin (see
#: :mod:`.request_guard`): ``cap`` (the default) folds the session inline and sends the folded
#: window, refusing to send what still cannot fit; ``shrink`` sends the guard's shrink of the
#: request alone when it fits (no summarizer call on the agent's path), folding inline only when
#: it does not; ``send`` sends the best shrink, fitting or not; ``fold`` is ``cap`` that also
#: folds before any request while the stored window is past the budget.
OverBudget = Literal["cap", "shrink", "send", "fold"]
OVER_BUDGET_CHOICES: tuple[str, ...] = ("cap", "shrink", "send", "fold")


def check_over_budget(choice: object) -> OverBudget:
    """``choice`` if it is one of :data:`OVER_BUDGET_CHOICES`; InvalidInputError otherwise."""
    if choice not in OVER_BUDGET_CHOICES:
        raise InvalidInputError(f"over_budget must be one of {list(OVER_BUDGET_CHOICES)}, "
                                f"got {choice!r}")
    return choice  # type: ignore[return-value]


def tool_tokens(tools: Sequence[Mapping[str, Any]]) -> int:
    """The estimate of the tool definitions sessionfold adds to a request (see
    :attr:`~.window_view.WindowView.tool_tokens`)."""
    return sum(count_text(json.dumps(tool, ensure_ascii=False)) for tool in tools)


@dataclass(frozen=True)
class CallPlan:
    """What one call decided before its first request: whether recall is on for it, the tools
    to send and the policy read; and what the pre-send guard estimates each request with (the
    session's calibration, its system prompt's estimate, and the estimate of what else is sent
    that the calibration has not seen). ``current_tokens``: the session's size when planned
    (``over_budget="fold"`` folds first when it is past the budget)."""

    recall: bool
    tools: list[dict[str, Any]]
    policy: FoldPolicy
    cache_breakpoints: bool
    calibration: Calibration = dataclasses.field(default_factory=Calibration)
    system_tokens: int = 0
    #: The estimate of the tools sessionfold adds (the recall tool), which the calibration
    #: leaves out (see :attr:`~.window_view.WindowView.tool_tokens`).
    extra_tokens: int = 0
    over_budget: OverBudget = "cap"
    current_tokens: int = 0

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(str(tool.get("name")) for tool in self.tools)

    def offering(self, names: Sequence[str]) -> CallPlan:
        """This plan with only the tools ``names`` offered (what a call continued elsewhere
        offered when it began: never more than this plan would)."""
        recall = self.recall and RECALL_TOOL_NAME in names
        if recall == self.recall:
            return self
        tools = [anthropic_tool()] if recall else []
        return dataclasses.replace(self, recall=recall, tools=tools,
                                   extra_tokens=tool_tokens(tools))

    def without_recall(self) -> CallPlan:
        return self.offering(())

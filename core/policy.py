"""FoldPolicy: when a session folds, how deep, and what a fold may do.

A fold starts when the measured window passes ``trigger_ratio × budget_tokens`` (early enough
that a background fold lands before the budget is reached) and goes down to
``target_ratio × budget_tokens`` (deep enough that the next turns do not fold again, so the
provider's prompt cache is invalidated rarely)::

    FoldPolicy(budget_tokens=32_000)                      # defaults: 0.85 trigger, 0.6 target
    FoldPolicy(budget_tokens=64_000, layers=("mask-tool-results", "drop-oldest"),
               measure="estimate")                        # no summarizer, no reported usage
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from .errors import InvalidPolicyError

__all__ = ["LAYERS", "FoldPolicy", "LayerName"]

LayerName = Literal["mask-tool-results", "drop-thinking", "summarize", "drop-oldest"]
LAYERS: tuple[str, ...] = get_args(LayerName)


class FoldPolicy(BaseModel):
    """A session's compaction policy. Immutable; invalid values raise InvalidPolicyError."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget_tokens: int
    trigger_ratio: float = 0.85
    target_ratio: float = 0.6
    keep_recent_turns: int = 4
    keep_first_user: bool = True
    max_item_ratio: float = 0.25
    layers: tuple[LayerName, ...] = ("mask-tool-results", "drop-thinking", "summarize")
    retain: Literal["ledger", "discard"] = "ledger"
    retention_min: float = 0.8
    measure: Literal["reported", "estimate"] = "reported"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidPolicyError(_explain(exc)) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> FoldPolicy:
        """Like pydantic's, but invalid values raise InvalidPolicyError (as the constructor)."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            # pydantic runs the custom __init__ and wraps what it raised: unwrap ours.
            for err in exc.errors(include_url=False):
                inner = (err.get("ctx") or {}).get("error")
                if isinstance(inner, InvalidPolicyError):
                    raise inner from None
            raise InvalidPolicyError(_explain(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> FoldPolicy:
        if self.budget_tokens < 1000:
            raise ValueError(f"budget_tokens must be at least 1000, got {self.budget_tokens}")
        if not 0 < self.target_ratio < self.trigger_ratio <= 1:
            raise ValueError(
                "need 0 < target_ratio < trigger_ratio <= 1, got "
                f"target_ratio={self.target_ratio}, trigger_ratio={self.trigger_ratio}"
            )
        if self.keep_recent_turns < 0:
            raise ValueError(f"keep_recent_turns must be >= 0, got {self.keep_recent_turns}")
        if not 0 < self.max_item_ratio <= 0.5:
            raise ValueError(f"max_item_ratio must be in (0, 0.5], got {self.max_item_ratio}")
        if not 0 <= self.retention_min <= 1:
            raise ValueError(f"retention_min must be in [0, 1], got {self.retention_min}")
        if not self.layers:
            raise ValueError("layers must name at least one layer; allowed: "
                             + ", ".join(LAYERS))
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layers must not repeat a layer, got {list(self.layers)}")
        if "summarize" in self.layers and "drop-oldest" in self.layers:
            raise ValueError("'drop-oldest' is used instead of 'summarize', not beside it")
        return self

    @property
    def trigger_tokens(self) -> int:
        return int(self.budget_tokens * self.trigger_ratio)

    @property
    def target_tokens(self) -> int:
        return int(self.budget_tokens * self.target_ratio)

    @property
    def max_item_tokens(self) -> int:
        return int(self.budget_tokens * self.max_item_ratio)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FoldPolicy:
        if not isinstance(data, dict):
            raise InvalidPolicyError(f"a policy is a JSON object, got {type(data).__name__}")
        return cls.model_validate(data)


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        field = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error":
            msg += f" (got {err['input']!r})"
        elif err["type"] == "extra_forbidden":
            msg = "unknown policy field; allowed: " + ", ".join(FoldPolicy.model_fields)
        parts.append(f"{field}: {msg}" if field else msg)
    return "invalid FoldPolicy: " + "; ".join(parts)

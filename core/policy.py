"""FoldPolicy: when a session folds, how deep, and what a fold may do.

When a background fold is due is the scheduler's, by the trigger the store keeps per session,
never above :attr:`FoldPolicy.trigger_tokens` (docs/architecture.md, "Deciding to fold"). A
fold goes down to ``target_ratio`` of the budget (deep enough that the next turns do not fold
again, so the provider's prompt cache breaks rarely)::

    FoldPolicy(budget_tokens=32_000)                      # defaults: 0.85 trigger, 0.6 target
    FoldPolicy(budget_tokens=64_000, layers=("mask-tool-results", "drop-oldest"),
               measure="estimate")                        # no summarizer, no reported usage
    FoldPolicy(budget_tokens=32_000, economics="window")  # the window's size over dollars

With ``economics="dollars"`` (the default) every background visit is priced with the cost
model (:mod:`sessionfold.core.economics`): the fold goes as deep as pays best, and a fold that
would not pay for its cache break is refused (``would-not-pay``) unless the budget needs it. A
session idle longer than its prompt cache's lifetime is visited from ``idle_trigger_ratio`` of
the budget on (its next call rewrites the cache anyway).

Between folds, ``call()`` guards each request (``guard``, on by default, paused sessions
included): one whose calibrated estimate passes ``(1 - guard_margin_ratio) × budget_tokens``
meets the handle's ``over_budget`` choice (:mod:`sessionfold.core.guard`,
``sessionfold.client.request_guard``).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from .errors import InvalidPolicyError
from .pydantic_errors import explain

__all__ = ["LAYERS", "MAX_POLICY_INT", "MAX_RECALL_ROUNDS", "MAX_SUMMARIZER_CALLS",
           "MIN_RECALL_TOKENS", "FoldPolicy", "LayerName"]

LayerName = Literal["mask-tool-results", "drop-thinking", "summarize", "drop-oldest"]
LAYERS: tuple[str, ...] = get_args(LayerName)
#: The largest integer a policy takes (``budget_tokens``, ``keep_recent_turns``): what a 32-bit
#: signed column holds, so every backend stores it and the sizes derived from it (trigger, target)
#: as they are; no model's window comes within a thousandth of it.
MAX_POLICY_INT = 2**31 - 1
#: The smallest cap on a recall answer: below it an answer holds little more than its framing.
MIN_RECALL_TOKENS = 256
#: The most a recall answer holds when the policy leaves ``recall_max_tokens`` to the budget.
DEFAULT_RECALL_MAX_TOKENS = 4000
#: Recall rounds one ``call()`` may answer at most: each is a paid model call.
MAX_RECALL_ROUNDS = 16
#: The largest ``max_summarizer_calls`` a policy takes.
MAX_SUMMARIZER_CALLS = 64


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
    #: The share of a span's identifiers a summary must keep. Below it, where the originals
    #: stay one recall away (``retain="ledger"`` and ``recall`` on), the summary folds anyway
    #: with a line naming what it left out; elsewhere the fold is refused
    #: (``retention-check-failed``).
    retention_min: float = 0.8
    #: The most summarizer calls one fold may make (the chunks of a long span, a retry of a
    #: summary that missed identifiers, further runs); past it the fold stops summarizing and
    #: its record says so. The session's spend cap (a setting) bounds the sum of its folds.
    max_summarizer_calls: int = 4
    measure: Literal["reported", "estimate"] = "reported"
    #: The recall tool (``sessionfold_recall``): the client offers it to the model and answers
    #: it from the ledger; False opts the session out (no tool, no hints in the window).
    recall: bool = True
    #: When the tool is offered: ``"edited"`` (the default) from the first request that holds
    #: something only recall gives back (an item sessionfold masked or summarized; a clip
    #: keeps head and tail in sight), so its definition rides on no request that could not
    #: use it; ``"always"`` on every request from the first.
    recall_offer: Literal["edited", "always"] = "edited"
    #: The most one recall answer may hold; the room left in the window caps it further.
    #: None: a thirty-second of the budget, 512 to 4,000 tokens (:attr:`recall_answer_tokens`):
    #: an answer is written to the cache and read on every call until a fold drops it, and a
    #: model asks for several at once. B1 (dense identifier sessions, an oracle agent asking for
    #: every identifier it lacks) at 16k/32k/64k: a sixteenth cost 0.96x/1.17x/1.30x of no
    #: compaction with 0.996/1.000/1.000 of the needed identifiers recalled, a thirty-second
    #: 0.79x/0.95x/1.09x with 0.975/0.997/1.000, a sixty-fourth 0.73x/0.80x/0.93x with
    #: 0.919/0.975/0.999.
    recall_max_tokens: int | None = None
    #: Recall rounds the client answers itself within one ``call()`` before it hands the
    #: reply back to the agent as it is.
    recall_max_rounds: int = 3
    #: What a background fold is judged by. ``"dollars"``: priced with the cost model, it folds
    #: when and as deep as pays (the cache break against the reads it saves), and refuses a fold
    #: that would not pay (``would-not-pay``) unless the budget needs it. ``"window"``: it folds
    #: at the trigger down to the target whatever that costs (the window's size over dollars).
    economics: Literal["dollars", "window"] = "dollars"
    #: With ``economics="dollars"``: a session idle longer than its prompt cache's lifetime is
    #: folded from this share of the budget on (at most the trigger), if that pays; None: no
    #: idle folds.
    idle_trigger_ratio: float | None = 0.5
    #: The pre-send guard of ``call()``: a request whose calibrated estimate passes
    #: ``(1 - guard_margin_ratio) × budget_tokens`` is sent with the cheap layers applied to it
    #: (never to the stored window), paused sessions included; False sends the window as it is.
    guard: bool = True
    #: The guard's safety margin, a share of the budget kept free for the estimate's error.
    guard_margin_ratio: float = 0.05
    #: The model calls this session is expected to make in all, when the agent knows (a task
    #: of about that many steps). A priced fold is made only if it pays back before the
    #: session ends (``economics="dollars"``); None: the session's own age is the prior (one
    #: that has made n calls is expected to make about n more).
    expected_calls: int | None = None

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
        for name in ("budget_tokens", "keep_recent_turns"):
            value = getattr(self, name)
            if value > MAX_POLICY_INT:
                raise ValueError(f"{name} must be at most {MAX_POLICY_INT:,} (what every "
                                 f"backend's integer columns hold), got {_show(value)}")
        if not 0 < self.target_ratio < self.trigger_ratio <= 1:
            raise ValueError(
                "need 0 < target_ratio < trigger_ratio <= 1, got "
                f"target_ratio={self.target_ratio}, trigger_ratio={self.trigger_ratio}"
            )
        if self.idle_trigger_ratio is not None and not 0 < self.idle_trigger_ratio <= 1:
            raise ValueError("idle_trigger_ratio must be in (0, 1] (or None: no idle folds), "
                             f"got {self.idle_trigger_ratio}")
        if not 0 <= self.guard_margin_ratio <= 0.5:
            raise ValueError(f"guard_margin_ratio must be in [0, 0.5], got "
                             f"{self.guard_margin_ratio}")
        if self.recall_max_tokens is not None and not (
                MIN_RECALL_TOKENS <= self.recall_max_tokens <= MAX_POLICY_INT):
            raise ValueError(f"recall_max_tokens must be in [{MIN_RECALL_TOKENS}, "
                             f"{MAX_POLICY_INT:,}] (or None: derived from the budget), got "
                             f"{_show(self.recall_max_tokens)}")
        if not 1 <= self.recall_max_rounds <= MAX_RECALL_ROUNDS:
            raise ValueError(f"recall_max_rounds must be in [1, {MAX_RECALL_ROUNDS}], got "
                             f"{_show(self.recall_max_rounds)}")
        if self.keep_recent_turns < 0:
            raise ValueError(f"keep_recent_turns must be >= 0, got {self.keep_recent_turns}")
        if not 0 < self.max_item_ratio <= 0.5:
            raise ValueError(f"max_item_ratio must be in (0, 0.5], got {self.max_item_ratio}")
        if not 0 <= self.retention_min <= 1:
            raise ValueError(f"retention_min must be in [0, 1], got {self.retention_min}")
        if self.expected_calls is not None and not 1 <= self.expected_calls <= MAX_POLICY_INT:
            raise ValueError(f"expected_calls must be in [1, {MAX_POLICY_INT:,}] (or None: "
                             f"the session's age is the prior), got {_show(self.expected_calls)}")
        if not 1 <= self.max_summarizer_calls <= MAX_SUMMARIZER_CALLS:
            raise ValueError(f"max_summarizer_calls must be in [1, {MAX_SUMMARIZER_CALLS}], got "
                             f"{_show(self.max_summarizer_calls)}")
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
    def idle_trigger_tokens(self) -> int | None:
        """Where idle folds start, at most the trigger (None: never, or ``economics="window"``)."""
        if self.economics != "dollars" or self.idle_trigger_ratio is None:
            return None
        return min(int(self.budget_tokens * self.idle_trigger_ratio), self.trigger_tokens)

    def over_idle_trigger(self, tokens: float) -> bool:
        """Whether an idle session of ``tokens`` (its cache cold) is worth a visit: past
        :attr:`idle_trigger_tokens`. Whether the fold pays is the cost model's answer."""
        idle = self.idle_trigger_tokens
        return idle is not None and tokens > idle

    def over_budget(self, tokens: float) -> bool:
        """Whether a window of ``tokens`` is past the budget itself (the line ``call()`` guards
        and the ``sessions_over_budget`` gauge counts): past the trigger and then some."""
        return tokens > self.budget_tokens

    @property
    def guard_tokens(self) -> int:
        """The most a request may hold by the pre-send guard's estimate: the budget less the
        safety margin (:attr:`guard_margin_ratio`)."""
        return int(self.budget_tokens * (1 - self.guard_margin_ratio))

    @property
    def target_tokens(self) -> int:
        return int(self.budget_tokens * self.target_ratio)

    @property
    def recall_answer_tokens(self) -> int:
        """The most one recall answer holds: ``recall_max_tokens``, or when it is None a
        thirty-second of the budget, at least 512 and at most 4,000 tokens."""
        if self.recall_max_tokens is not None:
            return self.recall_max_tokens
        return min(DEFAULT_RECALL_MAX_TOKENS,
                   max(2 * MIN_RECALL_TOKENS, self.budget_tokens // 32))

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


def _show(value: int) -> str:
    """``value`` for an error message (Python refuses to print an int of 4,300+ digits)."""
    if value.bit_length() < 128:
        return f"{value:,}"
    return f"an integer of {value.bit_length()} bits"


def _explain(exc: ValidationError) -> str:
    return explain("FoldPolicy", exc, unknown="unknown policy field; allowed: "
                   + ", ".join(FoldPolicy.model_fields))

"""sessionfold.core: the pure fold engine (no I/O but the summarizer call it is handed).

The public API in one place::

    from sessionfold.core import FoldPolicy, ExtractiveSummarizer, compact, load_conversation_json

    conv = load_conversation_json(text, source="session.json")   # the caller reads the file
    result = compact(conv.messages, FoldPolicy(budget_tokens=32_000), ExtractiveSummarizer(),
                     system=conv.system)
    result.messages, result.record, result.spans

The store and the workers use :func:`fold_window` on stored window items; see
``docs/internals.md``.
"""

from .clip import clip_oversized
from .compact import CompactResult, FoldResult, FoldVisit, compact, fold_window
from .errors import (
    ContextOverflowError,
    DiscardedOriginalsError,
    InvalidInputError,
    InvalidMessageError,
    InvalidPolicyError,
    PermanentSummarizerError,
    SchemaError,
    SessionfoldError,
    SessionNotFoundError,
    StaleSpanError,
    SummarizerError,
    ToolPairingError,
    TransientSummarizerError,
    UsageUnmeasurableError,
)
from .frame import (
    EarlierFold,
    fingerprint,
    frame_info,
    notice_message,
    summary_body,
    summary_message,
)
from .layers import drop_thinking, mask_tool_results
from .messages import (
    Block,
    Conversation,
    DocumentBlock,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    SummaryMark,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    check_tool_pairing,
    dump_messages,
    parse_message,
    parse_messages,
)
from .openai_shape import from_openai
from .openai_write import to_openai
from .overflow import is_context_overflow, overflow_tokens
from .policy import LAYERS, FoldPolicy, LayerName
from .retention import RetentionResult, check_retention, extract_identifiers
from .session_files import load_conversation, load_conversation_json
from .summarizers import (
    DEFAULT_MODEL,
    ExtractiveSummarizer,
    Summarizer,
    Summary,
)
from .tokens import Calibration, TokenCounter, default_counter, reported_prompt_tokens
from .turns import Protection, Run, Turn, foldable_runs, group_turns, protect
from .window import (
    CompactionRecord,
    FoldEdit,
    FoldedSpan,
    Outcome,
    Refusal,
    RefusalReason,
    SummarizerUsage,
    Trigger,
    WindowItem,
    items_from_messages,
    window_messages,
)

__all__ = [
    "DEFAULT_MODEL",
    "LAYERS",
    "Block",
    "Calibration",
    "CompactResult",
    "CompactionRecord",
    "ContextOverflowError",
    "Conversation",
    "DiscardedOriginalsError",
    "DocumentBlock",
    "EarlierFold",
    "ExtractiveSummarizer",
    "FoldEdit",
    "FoldPolicy",
    "FoldResult",
    "FoldVisit",
    "FoldedSpan",
    "ImageBlock",
    "InvalidInputError",
    "InvalidMessageError",
    "InvalidPolicyError",
    "LayerName",
    "Message",
    "Outcome",
    "PermanentSummarizerError",
    "Protection",
    "RedactedThinkingBlock",
    "Refusal",
    "RefusalReason",
    "RetentionResult",
    "Run",
    "SchemaError",
    "SessionNotFoundError",
    "SessionfoldError",
    "StaleSpanError",
    "Summarizer",
    "SummarizerError",
    "SummarizerUsage",
    "Summary",
    "SummaryMark",
    "TextBlock",
    "ThinkingBlock",
    "TokenCounter",
    "ToolPairingError",
    "ToolResultBlock",
    "ToolUseBlock",
    "TransientSummarizerError",
    "Trigger",
    "Turn",
    "UsageUnmeasurableError",
    "WindowItem",
    "check_retention",
    "check_tool_pairing",
    "clip_oversized",
    "compact",
    "default_counter",
    "drop_thinking",
    "dump_messages",
    "extract_identifiers",
    "fingerprint",
    "fold_window",
    "foldable_runs",
    "frame_info",
    "from_openai",
    "group_turns",
    "is_context_overflow",
    "items_from_messages",
    "load_conversation",
    "load_conversation_json",
    "mask_tool_results",
    "notice_message",
    "overflow_tokens",
    "parse_message",
    "parse_messages",
    "protect",
    "reported_prompt_tokens",
    "summary_body",
    "summary_message",
    "to_openai",
    "window_messages",
]


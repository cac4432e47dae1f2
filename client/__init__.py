"""sessionfold.client: what agents and app servers import. Turns in, usage out, compacted
windows back.

::

    from sessionfold.client import connect

    client = connect()                         # settings from the environment (embedded defaults)
    agent = client.session("agent-7", policy=FoldPolicy(budget_tokens=64_000), system=SYSTEM)
    agent.append([{"role": "user", "content": task}], key="task")
    reply = agent.call(lambda system, messages, tools: anthropic_client.messages.create(
        model=MODEL, max_tokens=4096, system=system, messages=messages,
        tools=[*MY_TOOLS, *tools]))            # tools: sessionfold_recall, answered by call()
    agent.append([{"role": "assistant", "content": reply.content}], key="turn-1")

    view = client.session("agent-7").window()  # an app server: the window as it stands now

One idea per module:

- :mod:`.connection`: :class:`Client`, a connection to one deployment (store, usage bus, the
  guarded summarizer of inline folds), and :func:`connect`, which builds one from the settings.
- :mod:`.session`: :class:`SessionHandle`, one session seen by an agent or an app server:
  ``append``, ``window``, ``report_usage``, ``call`` (with the inline overflow fallback),
  ``fold_inline``, ``recover``.
- :mod:`.window_view`: :class:`WindowView`, the window as read and ready to send, and
  :func:`place_cache_breakpoints`.
- :mod:`.aio`: :class:`AsyncClient` / :class:`AsyncSessionHandle`, the asyncio flavour.
- :mod:`.recall`: the recall tool (``sessionfold_recall``): its definitions in the Anthropic
  and OpenAI shapes, requests, bounded answers from the ledger, the tool calls of a reply.
- :mod:`.sdk`: drop-in SDK wrappers, :class:`SessionAnthropic` / :class:`AsyncSessionAnthropic`
  / :class:`SessionOpenAI`: an ``anthropic`` or ``openai`` client bound to a session, so the
  agent's loop is plain SDK code (``messages.create``, ``messages.stream``,
  ``chat.completions.create``) that sends the compacted window. They import neither SDK.

The client sits on the shared runtime
(:mod:`sessionfold.runtime`: the fold procedure for inline folds, the usage publisher, the
wiring); the runtime never imports the client, and the client imports nothing of Celery.
"""

from .aio import AsyncClient, AsyncSessionHandle
from .connection import Client, connect
from .recall import (
    RECALL_TOOL_NAME,
    RECALL_TOOL_VERSION,
    RecallAnswer,
    RecallRequest,
    anthropic_tool,
    openai_tool,
)
from .sdk import (
    AsyncSessionAnthropic,
    AsyncSessionMessageStream,
    HistoryMismatchError,
    ReplyNotRecordedError,
    SessionAnthropic,
    SessionChatStream,
    SessionMessageStream,
    SessionOpenAI,
)
from .session import AsyncModelCall, ModelCall, ModelCallWithTools, OverBudget, SessionHandle
from .window_view import WindowView, place_cache_breakpoints

__all__ = [
    "RECALL_TOOL_NAME",
    "RECALL_TOOL_VERSION",
    "AsyncClient",
    "AsyncModelCall",
    "AsyncSessionAnthropic",
    "AsyncSessionHandle",
    "AsyncSessionMessageStream",
    "Client",
    "HistoryMismatchError",
    "ModelCall",
    "ModelCallWithTools",
    "OverBudget",
    "RecallAnswer",
    "RecallRequest",
    "ReplyNotRecordedError",
    "SessionAnthropic",
    "SessionChatStream",
    "SessionHandle",
    "SessionMessageStream",
    "SessionOpenAI",
    "WindowView",
    "anthropic_tool",
    "connect",
    "openai_tool",
    "place_cache_breakpoints",
]

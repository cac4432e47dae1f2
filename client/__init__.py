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
  ``append``, ``window``, ``report_usage``, ``call``, ``fold_inline``, ``recover``.
- :mod:`.call_loop`: :class:`CallLoop`, what ``call()`` does (guard, send, fold and retry once
  on overflow, answer recall rounds), written once without the model call's I/O; its state a
  value (:class:`CallState`). :mod:`.call_plan` is what a call decides before its first
  request, :mod:`.model_call` how ``fn`` takes the tools, :mod:`.request_guard` the hard cap
  on each request, :mod:`.recall_round` the answers to one reply's recall calls.
- :mod:`.window_view`: :class:`WindowView`, the window as read and ready to send, and
  :func:`place_cache_breakpoints`.
- :mod:`.aio`: :class:`AsyncClient` / :class:`AsyncSessionHandle`, the asyncio flavour.
- :mod:`.shapes`: messages in either shape (Anthropic Messages, OpenAI chat).
- :mod:`.recall`: the recall tool (``sessionfold_recall``): its definitions in the Anthropic
  and OpenAI shapes, requests, bounded answers from the ledger, the tool calls of a reply
  (:mod:`.recall_request` what is asked and answered, :mod:`.recall_ledger` how an answer is
  written from the ledger).
- :mod:`.sdk_anthropic` / :mod:`.sdk_openai`: drop-in SDK wrappers,
  :class:`SessionAnthropic` / :class:`AsyncSessionAnthropic` / :class:`SessionOpenAI`: an
  ``anthropic`` or ``openai`` client bound to a session, so the agent's loop is plain SDK code
  (``messages.create``, ``messages.stream``, ``chat.completions.create``) that sends the
  compacted window. They import neither SDK. :mod:`.sdk_history` is what they share (the
  caller's history against the ledger, the reply recorded), :mod:`.stream_rounds` the call
  loop's streaming adapters.

The client sits on the shared runtime
(:mod:`sessionfold.runtime`: the fold procedure for inline folds, the usage publisher, the
wiring); the runtime never imports the client, and the client imports nothing of Celery.
"""

from .aio import AsyncClient, AsyncSessionHandle
from .call_loop import CallLoop, CallState, RaiseError, ReturnReply, SendRequest
from .call_plan import OverBudget
from .connection import Client, connect
from .model_call import AsyncModelCall, ModelCall, ModelCallWithTools
from .recall import (
    RECALL_TOOL_NAME,
    RECALL_TOOL_VERSION,
    RecallAnswer,
    RecallRequest,
    anthropic_tool,
    openai_tool,
)
from .sdk_anthropic import (
    AsyncSessionAnthropic,
    AsyncSessionMessageStream,
    SessionAnthropic,
    SessionMessageStream,
)
from .sdk_history import HistoryMismatchError, ReplyNotRecordedError
from .sdk_openai import SessionChatStream, SessionOpenAI
from .session import SessionHandle
from .window_view import WindowView, place_cache_breakpoints

__all__ = [
    "RECALL_TOOL_NAME",
    "RECALL_TOOL_VERSION",
    "AsyncClient",
    "AsyncModelCall",
    "AsyncSessionAnthropic",
    "AsyncSessionHandle",
    "AsyncSessionMessageStream",
    "CallLoop",
    "CallState",
    "Client",
    "HistoryMismatchError",
    "ModelCall",
    "ModelCallWithTools",
    "OverBudget",
    "RaiseError",
    "RecallAnswer",
    "RecallRequest",
    "ReplyNotRecordedError",
    "ReturnReply",
    "SendRequest",
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

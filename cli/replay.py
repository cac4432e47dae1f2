"""Replay session files as standing agents through the client, against a running pipeline.

``sessionfold replay FILE... [--budget N] [--concurrency C] [--prefix P] [--context-window W]``

Each file becomes one session, ``P + the file's stem``, driven as a live agent would drive it:
messages are appended one by one, and before each assistant message the agent makes one model
call with the window as it stands (:meth:`SessionHandle.call`), which reports the usage to the
usage bus. The model is the scripted provider (:mod:`.standin.fakeprovider`): it counts the
request with its own tokenizer ratio plus a fixed overhead (so calibration has work to do) and
rejects a request over ``context_window`` with Anthropic's real 400, so an overflow takes the
client's inline path exactly as a real one would. The assistant message itself comes from the
file.

Folds are the pipeline's business (scheduler + workers on whatever ``REDIS_URL`` and
``DATABASE_URL`` name, the embedded defaults otherwise): the replay never waits on them while it
runs, and at the end it waits until no fold is pending (usage bus drained, no fold lock held, no
session still over its trigger without a verdict). It then reports, per session: messages,
folds, window tokens against ledger tokens, and summarizer calls on the agent's path (0 unless
an overflow forced an inline fold).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionfold.cli.files import load_conversation_file
from sessionfold.client import Client, SessionHandle
from sessionfold.core.errors import InvalidInputError, SessionNotFoundError
from sessionfold.core.messages import Conversation
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import mapped_errors, redis_client
from sessionfold.store import SessionInfo
from sessionfold.workers.locks import FoldLock
from sessionfold.workers.scheduler import skip_reason

from .standin.fakeprovider import FakeProvider

__all__ = ["ReplayOptions", "ReplayResult", "SessionReport", "format_table", "pending_folds",
           "replay"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay: the budget of every session, how many agents at once, naming, the model."""

    budget: int = 16_000
    concurrency: int = 4
    prefix: str = "replay-"
    context_window: int = 200_000
    #: Seconds each scripted model call takes (gives background folds time to land).
    model_latency_s: float = 0.0
    keep_recent_turns: int = 4
    #: Delete sessions of the same name first (otherwise an existing session is an error).
    replace: bool = False
    #: How long to wait at the end for pending folds.
    wait_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise InvalidInputError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.context_window < 1000:
            raise InvalidInputError(
                f"--context-window must be at least 1000 tokens, got {self.context_window}")
        if self.model_latency_s < 0 or self.wait_timeout_s <= 0:
            raise InvalidInputError("model latency must be >= 0 and the wait timeout positive")

    def policy(self) -> FoldPolicy:
        return FoldPolicy(budget_tokens=self.budget, keep_recent_turns=self.keep_recent_turns)


@dataclass(frozen=True)
class SessionReport:
    """One replayed session at the end."""

    session_id: str
    source: str
    messages: int
    calls: int
    folds: int
    window_tokens: int
    ledger_tokens: int
    agent_summarizer_calls: int
    inline_folds: int
    peak_prompt_tokens: int


@dataclass
class ReplayResult:
    sessions: list[SessionReport] = field(default_factory=list)
    #: Seconds spent replaying, and waiting for the last folds.
    replay_s: float = 0.0
    settle_s: float = 0.0
    #: True when every fold had landed before the wait timed out.
    settled: bool = True

    @property
    def agent_summarizer_calls(self) -> int:
        return sum(s.agent_summarizer_calls for s in self.sessions)


#: A session file read and checked: its path (the session id is its stem) and its conversation.
Loaded = tuple[Path, Conversation]


def load_files(files: Sequence[str | Path]) -> list[Loaded]:
    """Read and check every session file before anything is replayed: a bad file is named
    (InvalidMessageError) before the pipeline is even asked for."""
    loaded = [(Path(f), load_conversation_file(f)) for f in files]
    if not loaded:
        raise InvalidInputError("replay needs at least one session file")
    return loaded


def replay(client: Client, files: Sequence[str | Path] | Sequence[Loaded],
           options: ReplayOptions | None = None, *,
           progress: Progress | None = None) -> ReplayResult:
    """Replay ``files`` (paths, or what :func:`load_files` read) through ``client`` (see the
    module doc); returns per-session reports."""
    options = options or ReplayOptions()
    say = progress or (lambda _line: None)
    loaded = [f if isinstance(f, tuple) else (Path(f), load_conversation_file(f))
              for f in files]
    if not loaded:
        raise InvalidInputError("replay needs at least one session file")
    ids = [options.prefix + path.stem for path, _ in loaded]
    if len(set(ids)) != len(ids):
        raise InvalidInputError("two files share a stem; their sessions would collide")
    for sid, (_, conv) in zip(ids, loaded, strict=True):
        _fresh_session(client, sid, conv, options)
    start = time.monotonic()
    results: dict[str, tuple[SessionHandle, int]] = {}
    done = threading.Lock()

    def run(sid: str, conv: Conversation) -> None:
        provider = FakeProvider(context_window=options.context_window,
                                latency_s=options.model_latency_s)
        handle = client.session(sid)
        _drive(handle, conv, provider)
        with done:
            results[sid] = (handle, provider.stats.max_prompt_tokens)
            say(f"{sid}: {len(conv.messages)} messages, {handle.calls} calls "
                f"({len(results)}/{len(loaded)} sessions done)")

    with ThreadPoolExecutor(max_workers=options.concurrency,
                            thread_name_prefix="replay-agent") as pool:
        futures = [pool.submit(run, sid, conv)
                   for sid, (_, conv) in zip(ids, loaded, strict=True)]
        for future in futures:
            future.result()  # an agent's error ends the replay with that error
    replay_s = time.monotonic() - start
    say(f"replayed {len(ids)} sessions in {replay_s:.1f}s; waiting for pending folds")
    settled = wait_settled(client, ids, timeout_s=options.wait_timeout_s, progress=say)
    settle_s = time.monotonic() - start - replay_s
    reports = [_report(client, sid, path, results[sid]) for sid, (path, _) in
               zip(ids, loaded, strict=True)]
    return ReplayResult(reports, replay_s, settle_s, settled)


def _fresh_session(client: Client, sid: str, conv: Conversation, options: ReplayOptions) -> None:
    try:
        info = client.store.get_session(sid)
    except SessionNotFoundError:
        info = None
    if info is not None:
        if not options.replace:
            raise InvalidInputError(
                f"session {sid!r} already exists; pass --replace, or another --prefix")
        client.store.delete_session(sid)
    client.store.create_session(sid, options.policy(), conv.system)


def _drive(handle: SessionHandle, conv: Conversation, provider: FakeProvider) -> None:
    """One standing agent: a model call before each assistant message, appends in order."""
    for index, message in enumerate(conv.messages):
        if message.role == "assistant" and index > 0:
            handle.call(provider)
        handle.append([message], key=f"replay-{index}")


def pending_folds(client: Client, session_ids: Sequence[str],
                  redis: Any | None = None) -> list[str]:
    """Sessions with a fold still to come: usage events the schedulers have not acted on, a
    fold lock held (a job queued or running), or over the trigger without a verdict yet.

    ``redis``: a client on the usage bus's Redis (None: only the store is asked).
    """
    settings = client.settings
    pending: list[str] = []
    if redis is not None:
        if not _bus_drained(redis, Keys.from_settings(settings), settings.scheduler_group):
            return list(session_ids)
        lock = FoldLock.from_settings(settings, redis)
        pending += [sid for sid in session_ids if lock.holder(sid) is not None]
    for sid in session_ids:
        if sid not in pending and skip_reason(client.store.get_session(sid)) is None:
            pending.append(sid)
    return pending


def wait_settled(client: Client, session_ids: Sequence[str], *, timeout_s: float,
                 progress: Progress | None = None, poll_s: float = 0.25) -> bool:
    """Wait until :func:`pending_folds` is empty; False when ``timeout_s`` passed first."""
    if client.publisher is not None:
        client.publisher.flush()  # usage buffered during an outage counts as pending too
    redis = redis_client(client.redis_url, retries=1) if client.redis_url else None
    deadline = time.monotonic() + timeout_s
    last_said = time.monotonic()
    try:
        while True:
            pending = pending_folds(client, session_ids, redis)
            if not pending:
                return True
            now = time.monotonic()
            if now >= deadline:
                if progress:
                    progress(f"gave up waiting: folds still pending for {', '.join(pending)} "
                             "(is a scheduler and a worker running? `sessionfold up` runs both)")
                return False
            if progress and now - last_said >= 5:
                progress(f"waiting for folds of {len(pending)} sessions")
                last_said = now
            time.sleep(poll_s)
    finally:
        if redis is not None:
            redis.close()


def _bus_drained(redis: Any, keys: Keys, group: str) -> bool:
    """Every usage event delivered to the schedulers' group and acknowledged, on every
    partition's stream."""
    return all(_stream_drained(redis, stream, group) for stream in keys.usage_streams())


def _stream_drained(redis: Any, stream: str, group: str) -> bool:
    with mapped_errors("reading the usage stream's state"):
        if not redis.exists(stream):
            return True
        last_id = redis.xinfo_stream(stream)["last-generated-id"]
        groups = {g["name"]: g for g in redis.xinfo_groups(stream)}
    entry = groups.get(group.encode()) or groups.get(group)
    if entry is None:
        return False  # no scheduler has read the stream yet
    return bool(entry["last-delivered-id"] == last_id and int(entry["pending"]) == 0)


def _report(client: Client, sid: str, path: Path,
            result: tuple[SessionHandle, int]) -> SessionReport:
    handle, peak = result
    info: SessionInfo = client.store.get_session(sid)
    ledger = client.store.read_ledger(sid)
    window = client.store.read_window(sid)
    return SessionReport(
        session_id=sid, source=path.name, messages=info.ledger_len, calls=handle.calls,
        folds=len(client.store.spans(sid)),
        window_tokens=window.tokens + info.system_tokens,
        ledger_tokens=sum(e.tokens for e in ledger) + info.system_tokens,
        agent_summarizer_calls=handle.summarizer_calls, inline_folds=handle.inline_folds,
        peak_prompt_tokens=peak)


def format_table(result: ReplayResult) -> str:
    """The per-session table the CLI prints."""
    head = ("session", "messages", "calls", "folds", "window tok", "ledger tok", "ratio",
            "peak prompt", "agent summarizer calls")
    rows = [head]
    for s in result.sessions:
        ratio = s.window_tokens / s.ledger_tokens if s.ledger_tokens else 0.0
        rows.append((s.session_id, str(s.messages), str(s.calls), str(s.folds),
                     str(s.window_tokens), str(s.ledger_tokens), f"{ratio:.2f}",
                     str(s.peak_prompt_tokens), str(s.agent_summarizer_calls)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    total = result.agent_summarizer_calls
    lines.append(f"summarizer calls on the agents' path: {total}"
                 + ("" if total else " (every fold ran in the background)"))
    if not result.settled:
        lines.append("warning: some folds were still pending when the wait timed out")
    return "\n".join(lines)

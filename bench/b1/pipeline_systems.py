"""sessionfold in B1 through the real client and pipeline (``sessionfold.workers``).

- ``sessionfold-background`` (pipeline): ``sessionfold up --no-flower`` runs in a temporary data
  dir (embedded Redis, a SQLite store, the scheduler and a Celery worker); the agent is a
  :class:`~sessionfold.client.SessionHandle` with ``over_budget="send"``. Folds are the
  scheduler's and the workers' business, and land whenever they land. The workers' summarizer
  is sessionfold's ``AnthropicSummarizer`` pointed (``ANTHROPIC_BASE_URL``) at a local HTTP
  server answering with the shared fake summarizer, so its calls run on the server's threads.
- ``sessionfold-inline`` (client, inline-only): no scheduler or workers; the handle's
  ``over_budget="fold"`` rule -- past the budget, ``fold_inline`` before the call -- with the
  client's own summarizer (the same fake, in process), so its calls run on the agent's thread.
- ``sessionfold-background-recall`` / ``sessionfold-inline-recall``: the same, with the recall
  tool: ``call(fn)`` also sends the window's recall hints and the ``sessionfold_recall``
  definition, answers a recall-only reply from the ledger (the store's full-text search),
  appends the exchange and calls ``fn`` again; the scripted model plays the recall oracle
  (:mod:`b1.oracle`).

Every system's agent calls as a real agent does, through ``SessionHandle.call(fn)``: the request
is the stored window through the pre-send guard (the cheap layers on the outgoing request when
the window plus what is sent would exceed the budget), a request over the model's context window
(200 k) is refused as the provider refuses it and the client folds inline and retries once, and
the client reports the usage. ``fn`` is the harness's scripted model: every request it is sent is
billed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from sessionfold.cli.replay import wait_settled
from sessionfold.client import Client, SessionHandle, connect
from sessionfold.core.errors import ContextOverflowError
from sessionfold.runtime.settings import Settings
from sessionfold.workers.celery_app import make_celery

from .counting import Counter, Request
from .fakes import FakeSummarizer
from .idle import CACHE_TTL_S, SWEEP_INTERVAL_S
from .replay import Env, ModelFn
from .sessionfold_systems import (
    CONTEXT_WINDOW,
    describe_policy,
    fake_summarizer,
    make_policy,
    messages_api_reply,
)
from .transcripts import Transcript

__all__ = [
    "Pipeline",
    "PipelineBackground",
    "PipelineBackgroundRecall",
    "PipelineInline",
    "PipelineInlineRecall",
]

READY_TIMEOUT_S = 90.0
SETTLE_TIMEOUT_S = 180.0


class _FakeMessagesAPI:
    """``POST /v1/messages`` answered by the shared fake summarizer, on a local port."""

    def __init__(self, fake: FakeSummarizer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                payload = json.dumps(messages_api_reply(fake, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="b1-fake-api",
                                       daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Pipeline:
    """A private sessionfold deployment for one benchmark run (``workers=False``: client only)."""

    def __init__(self, fake: FakeSummarizer, *, workers: bool, log: Path | None = None,
                 clock_scale: float | None = None) -> None:
        self.fake = fake
        self.workers = workers
        #: The idle-gap scenario's scaled clock: the cache's lifetime (300 s) and the
        #: scheduler's sweep (every 30 s) run at this scale; None: the defaults.
        self.clock_scale = clock_scale
        self.dir = Path(tempfile.mkdtemp(prefix="b1-pipeline-"))
        self.log_path = log or self.dir / "pipeline.log"
        self.api = _FakeMessagesAPI(fake)
        self.process: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None
        self._connected: Client | None = None

    def settings(self) -> Settings:
        return Settings(data_dir=self.dir / "data",
                        database_url=f"sqlite:///{self.dir / 'store.db'}",
                        anthropic_api_key="b1-fake", anthropic_base_url=self.api.base_url,
                        summarizer="anthropic", metrics_port=0)

    def start(self) -> Client:
        self.api.start()
        settings = self.settings()
        if self.workers:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("SESSIONFOLD_") and k not in ("REDIS_URL",
                                                                      "DATABASE_URL")}
            env.update({"SESSIONFOLD_DATA_DIR": str(settings.data_dir),
                        "DATABASE_URL": str(settings.database_url),
                        "ANTHROPIC_API_KEY": "b1-fake", "ANTHROPIC_BASE_URL": self.api.base_url,
                        "SESSIONFOLD_SUMMARIZER": "anthropic", "SESSIONFOLD_METRICS_PORT": "0"})
            if self.clock_scale is not None:
                env.update({
                    "SESSIONFOLD_CACHE_LIFETIME_S": str(CACHE_TTL_S * self.clock_scale),
                    "SESSIONFOLD_SCHEDULER_SWEEP_INTERVAL_S":
                        str(SWEEP_INTERVAL_S * self.clock_scale)})
            with self.log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "sessionfold.cli", "up", "--no-flower"],
                    env=env, stdout=log, stderr=subprocess.STDOUT)
            self._wait_until_up(settings)
        # The client's inline folds use the same fake summarizer in process: on the agent's path.
        # ``connect`` owns the store, the publisher and any embedded Redis it started (closed in
        # stop()); the handles use a Client sharing them with that summarizer.
        self._connected = connect(settings)
        self.client = Client(settings, self._connected.store, self._connected.publisher,
                             redis_url=self._connected.redis_url,
                             summarizer=fake_summarizer(self.fake))
        return self.client

    def _wait_until_up(self, settings: Settings) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        url_file = settings.data_dir / "redis"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"`sessionfold up` exited; see {self.log_path}")
            url = _embedded_url(url_file)
            if url is not None:
                app = make_celery(settings, redis_url=url)
                try:
                    if app.control.ping(timeout=1.0):
                        return
                except Exception:  # not up yet
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"the pipeline did not come up in {READY_TIMEOUT_S:.0f} s; see "
                           f"{self.log_path}")

    def stop(self) -> None:
        if self._connected is not None:
            self._connected.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.api.stop()
        # The data dir (store, embedded Redis files) is this run's alone; the log, when it
        # should outlive the run, was written elsewhere (``log=``).
        shutil.rmtree(self.dir, ignore_errors=True)


def _embedded_url(redis_dir: Path) -> str | None:
    """The URL ``sessionfold up`` wrote for its embedded Redis server (``redis.url`` in the
    server's data dir, where ``EmbeddedRedis`` keeps it), once it is there."""
    path = redis_dir / "redis.url"
    text = path.read_text(encoding="utf-8").strip() if path.is_file() else ""
    return text if text.startswith(("unix://", "redis://")) else None


class _Session:
    def __init__(self, handle: SessionHandle, client: Client, counter: Counter,
                 mode: Literal["send", "fold"]) -> None:
        self.handle = handle
        self.client = client
        self.counter = counter
        self.mode = mode
        self.seq = 0
        self.replies = 0

    def append(self, message: Mapping[str, Any]) -> None:
        self.handle.append([dict(message)], key=f"m{self.seq}")
        self.seq += 1

    #: The client offers the recall tool (the scripted model may then ask for what it lacks).
    offers_recall = False

    def call(self, model: ModelFn) -> None:
        """The agent's next call, made as a real agent makes it: through ``call(fn)``, so the
        request is the window through the pre-send guard, an overflow is folded inline and
        retried, and the usage is reported by the client."""
        def fn(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
            return self._reply(model, Request(system, messages))

        self.handle.call(fn, over_budget=self.mode)

    def _reply(self, model: ModelFn, request: Request) -> dict[str, Any]:
        tokens = self.counter.request(request)
        if tokens > CONTEXT_WINDOW:  # the provider's 400: the client folds and retries
            raise ContextOverflowError(f"prompt is too long: {tokens} tokens > "
                                       f"{CONTEXT_WINDOW} maximum")
        reply = model(request)
        self.replies += 1
        return {"id": f"msg_b1_{self.replies}", "type": "message", "role": "assistant",
                "model": "b1-scripted", "content": reply.content,
                "stop_reason": reply.stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": reply.input_tokens, "output_tokens": 1}}

    def finish(self) -> None:
        if self.mode == "send" and not wait_settled(self.client, [self.handle.session_id],
                                                    timeout_s=SETTLE_TIMEOUT_S):
            raise RuntimeError(f"folds of {self.handle.session_id} still pending after "
                               f"{SETTLE_TIMEOUT_S:.0f} s")

    def retained(self) -> list[dict[str, Any]]:
        # A discarded original (retain="discard") has no message left: it is not retrievable.
        return [e.message.to_json() for e in self.handle.ledger() if e.message is not None]


class _RecallSession(_Session):
    """A session whose client offers and answers the recall tool (``call(fn)`` with a ``fn``
    that takes the tools)."""

    offers_recall = True

    def call(self, model: ModelFn) -> None:
        def fn(system: str, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]]) -> dict[str, Any]:
            return self._reply(model, Request(system, messages, tools))

        self.handle.call(fn, over_budget=self.mode)


class _PipelineSystem:
    name = ""
    mode: Literal["send", "fold"] = "send"
    #: The agent calls through ``call(fn)`` with the recall tool (the oracle asks for recall).
    recall = False

    def __init__(self, pipeline: Pipeline, overrides: Mapping[str, Any] | None = None) -> None:
        self.pipeline = pipeline
        self.overrides = dict(overrides or {})
        self.run_id = uuid.uuid4().hex[:8]

    def session(self, transcript: Transcript, budget: int, env: Env) -> _Session:
        client = self.pipeline.client
        if client is None:
            raise RuntimeError("start the pipeline before replaying through it")
        handle = client.session(f"b1-{self.run_id}-{budget}-{transcript.id}",
                                policy=make_policy(budget, self.overrides),
                                system=transcript.system, over_budget=self.mode)
        kind = _RecallSession if self.recall else _Session
        return kind(handle, client, env.counter, self.mode)


class PipelineBackground(_PipelineSystem):
    name = "sessionfold-background"
    mode: Literal["send", "fold"] = "send"
    #: Its scheduler folds idle sessions on the clock: the idle-gap replay waits gaps out.
    sleeps_through_idle_gaps = True

    def describe(self, budget: int) -> str:
        return ("client (over_budget='send') + `sessionfold up` (scheduler + Celery worker, "
                "embedded Redis, SQLite store), "
                + describe_policy(make_policy(budget, self.overrides), self.overrides))


class PipelineInline(_PipelineSystem):
    name = "sessionfold-inline"
    mode: Literal["send", "fold"] = "fold"

    def describe(self, budget: int) -> str:
        return ("client inline-only (over_budget='fold': past the budget, fold_inline before "
                "the call; no scheduler or workers), "
                + describe_policy(make_policy(budget, self.overrides), self.overrides))


_RECALL = ("; with the recall tool: the agent calls through SessionHandle.call(fn), which sends "
           "sessionfold_recall and answers recall-only replies from the ledger; the scripted "
           "agent is the recall oracle (one recall turn, a query per missing identifier, before "
           "any call whose window lacks identifiers its answer needs)")


class PipelineBackgroundRecall(PipelineBackground):
    name = "sessionfold-background-recall"
    recall = True

    def describe(self, budget: int) -> str:
        return super().describe(budget) + _RECALL


class PipelineInlineRecall(PipelineInline):
    name = "sessionfold-inline-recall"
    recall = True

    def describe(self, budget: int) -> str:
        return super().describe(budget) + _RECALL

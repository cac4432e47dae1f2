"""An agent in TypeScript (examples/typescript: plain Anthropic SDK code on the package in
clients/typescript, Node 20) against a live ``sessionfold serve``, with a scheduler and a worker
on the same store and Redis whose summarizer takes 2 s a call, and the stand-in model: 40
requests, none over the 16k budget as the stand-in counts them (the guarded request), the
planted authorization recalled through the tool the API offers and answers (no schema copied
by hand), the session folded in the background. Then an agent in Python, plain anthropic SDK
code through the drop-in wrapper, on the same deployment: its session folds in the background
too.

Needs node and npm (the registry, for the pinned dependencies): skipped on a laptop without
them, failed under CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from pipeline_harness import (
    PipelineProcess,
    child_env,
    free_port,
    scheduler_process,
    started,
    wait_until,
    worker_process,
)
from sessionfold.cli.standin.fakeprovider import FakeProvider, Reply, ToolUse
from sessionfold.client import RECALL_TOOL_NAME, SessionAnthropic, connect
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.service.auth import create_key
from sessionfold.store import SessionStore

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "clients" / "typescript"
EXAMPLE = REPO / "examples" / "typescript"

BUDGET = 16_000
#: Model requests the stand-in answers before its final reply (recall rounds included).
REQUESTS = 40
PLANTED = "RA-7731-QX"
#: The stand-in model asks for the authorization from this request on (page 1, which holds
#: it, is long out of the window by then), again 3 requests after an answer without it.
FIRST_ASK = 20
SUMMARIZER_LATENCY_S = 2.0
#: How long one request of the agent's model takes.
MODEL_LATENCY_S = 0.3

pytestmark = pytest.mark.slow


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not on PATH (CI must provide Node.js 20)")
        pytest.skip(f"{tool} is not on PATH")
    return found


def _npm(npm: str, where: Path, *args: str) -> None:
    proc = subprocess.run([npm, *args], cwd=where, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"npm {' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"


@pytest.fixture
def built_agent(tmp_path: Path) -> Path:
    """The package and the example, each installed from its lockfile and built, in a copy that
    keeps their relative places (the example depends on ../../clients/typescript)."""
    npm = _need("npm")
    _need("node")
    for source, target in ((PACKAGE, tmp_path / "clients" / "typescript"),
                           (EXAMPLE, tmp_path / "examples" / "typescript")):
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("node_modules", "dist"))
        _npm(npm, target, "ci", "--no-audit", "--no-fund")
        _npm(npm, target, "run", "build")
    return tmp_path / "examples" / "typescript" / "dist" / "agent.js"


def _recall_answer(messages: list[Mapping[str, Any]]) -> str | None:
    """The text of the recall answer the request ends with, if it ends with one."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return None
    asked = {block.get("id") for block in messages[-2].get("content") or []
             if isinstance(block, Mapping) and block.get("name") == RECALL_TOOL_NAME}
    texts = [json.dumps(block.get("content")) for block in messages[-1].get("content") or []
             if isinstance(block, Mapping) and block.get("tool_use_id") in asked]
    return "\n".join(texts) if texts else None


class StandInAgentModel:
    """The agent's model: reads the log page by page; once the recall tool is offered (from
    request :data:`FIRST_ASK` on) asks it for the planted authorization until an answer holds
    it; its last reply names the authorization when it got it back."""

    def __init__(self) -> None:
        self.requests = 0
        self.asked_at: list[int] = []
        self.answers: list[str] = []
        self.recalled = False

    def __call__(self, request: Mapping[str, Any]) -> Reply:
        self.requests += 1
        n = self.requests
        answer = _recall_answer(list(request.get("messages") or []))
        if answer is not None:
            self.answers.append(answer)
            self.recalled = self.recalled or PLANTED in answer
        if n >= REQUESTS:
            return (f"ACCT-8842 is reconciled; refund authorization {PLANTED}." if self.recalled
                    else "ACCT-8842 is reconciled; the authorization is out of my sight.")
        offered = any(tool.get("name") == RECALL_TOOL_NAME for tool in request.get("tools") or [])
        if (offered and not self.recalled and n >= FIRST_ASK
                and n - max(self.asked_at, default=-10) >= 3):
            self.asked_at.append(n)
            return ToolUse(RECALL_TOOL_NAME, {"query": PLANTED})
        return ToolUse("read_log", {"page": n})


def test_a_typescript_agent_on_the_package_stays_under_budget_and_recalls(
        built_agent: Path, make_settings: Callable[..., Settings], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    model = StandInAgentModel()
    agent_model = FakeProvider(reply=model, latency_s=MODEL_LATENCY_S)
    summarizer = FakeProvider(latency_s=SUMMARIZER_LATENCY_S)
    with agent_model.serve() as model_server, summarizer.serve() as summarizer_server:
        port = free_port()
        settings = make_settings(metrics_port=0, scheduler_sweep_interval_s=2,
                                 scheduler_block_ms=200, api_port=port, summarizer="anthropic",
                                 anthropic_api_key="sk-fake",
                                 anthropic_base_url=summarizer_server.base_url)
        store = SessionStore.from_url(settings.store_url)
        store.migrate()
        key = create_key(store, "ts-team").key
        started(request, scheduler_process(settings, tmp_path / "scheduler.log"))
        started(request, worker_process(settings, tmp_path / "worker.log"))
        started(request, PipelineProcess(["serve"], child_env(settings), tmp_path / "serve.log",
                                         "sessionfold serve: http://"))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{base}/healthz"), timeout_s=60,
                   what="the API to answer /healthz")
        env = {**os.environ, "SESSIONFOLD_URL": base, "SESSIONFOLD_API_KEY": key,
               "ANTHROPIC_BASE_URL": model_server.base_url, "ANTHROPIC_API_KEY": "standin",
               "SESSION_ID": "refund-bot", "PLANTED": PLANTED, "FOLD_WAIT_S": "60"}
        proc = subprocess.run([shutil.which("node") or "node", str(built_agent)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        report = json.loads(proc.stdout.strip().splitlines()[-1])

        prompts = list(agent_model.stats.recent_prompt_tokens)
        over = [tokens for tokens in prompts if tokens > BUDGET]
        stats = report["stats"]
        sid = "tenant:ts-team/refund-bot"
        try:
            folds = [r for r in store.records(sid) if r.outcome == "folded"]
            ledger = store.read_ledger(sid)
            numbers = {"requests": len(prompts), "over_budget": len(over),
                       "largest_request": max(prompts), "recall": stats["recall"],
                       "recall_asks": len(model.asked_at), "shrunk": stats["shrunk"],
                       "inline_folds": stats["inlineFolds"],
                       "background_folds": sum(r.trigger == "threshold" for r in folds)}
            print(f"typescript agent: {json.dumps(numbers)}")

            assert len(prompts) == stats["requests"] == REQUESTS
            assert over == [], f"{len(over)} of {len(prompts)} requests over {BUDGET}: {over}"
            # Recall answered: the authorization came back through the tool, and the agent's
            # last reply names it.
            answered = stats["recall"].get("served", 0) + stats["recall"].get("clipped", 0)
            assert answered >= 1, stats
            assert model.recalled and PLANTED in report["text"], model.answers
            # The session folds in the background; the agent's own messages are each
            # recorded once (the recall exchanges are the API's).
            assert folds and any(r.trigger == "threshold" for r in folds), folds
            assert report["fold_revision"] > 0 and report["window_kinds"][0] == "message"
            assert sum(e.origin != "recall" for e in ledger) == report["messages"]
            _python_agent_through_the_wrapper(settings, store)
        finally:
            store.close()


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=5).status_code == 200
    except httpx2.HTTPError:
        return False


def _python_agent_through_the_wrapper(settings: Settings, store: SessionStore) -> None:
    """A Python agent on the same deployment, written as plain anthropic SDK code through
    SessionAnthropic: its session folds in the background too (no fold on its path)."""
    provider = FakeProvider()
    with provider.serve() as server, contextlib.closing(connect(settings)) as client:
        handle = client.session("py-agent", policy=FoldPolicy(budget_tokens=4000),
                                system="You are the Python agent. Cite item ids.")
        # The agent outruns the 2 s summarizer: "send" keeps every fold off its path (the
        # guard's shrink of each request goes out until the background fold lands).
        llm = SessionAnthropic(anthropic.Anthropic(api_key="sk-fake", base_url=server.base_url),
                               handle, over_budget="send")
        history: list[dict[str, Any]] = []
        for turn in range(16):
            history.append({"role": "user", "content": f"page {turn}: " + " ".join(
                f"ITEM-{turn}-{i} ok" for i in range(90))})
            reply = llm.messages.create(model="claude-sonnet-4-5", max_tokens=256,
                                        system="You are the Python agent. Cite item ids.",
                                        messages=history)
            history.append({"role": "assistant",
                            "content": [b.to_dict() for b in reply.content]})

        def folded_in_background() -> bool:
            return any(r.outcome == "folded" and r.trigger == "threshold"
                       for r in store.records("py-agent"))

        wait_until(folded_in_background, timeout_s=120,
                   what="the wrapper agent's session to fold in the background")
        assert handle.inline_folds == 0 and handle.summarizer_calls == 0
        # The wrapper appended each message once: the ledger is the agent's own history.
        assert [e.message.role for e in store.read_ledger("py-agent")
                if e.message is not None] == [m["role"] for m in history]

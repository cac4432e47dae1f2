"""An agent in TypeScript (examples/typescript, Node 20, plain fetch) against a live
``sessionfold serve``, with a scheduler and a worker on the same store and Redis: its session
folds in the background, and the agent waits for that fold by long-poll. Then an agent in
Python, plain anthropic SDK code through the drop-in wrapper, on the same deployment: its
session folds in the background too.

Needs node and npm (the registry, for the pinned TypeScript compiler): skipped on a laptop
without them, failed under CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
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
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.client import SessionAnthropic, connect
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.service.auth import create_key
from sessionfold.store import SessionStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "typescript"

pytestmark = pytest.mark.slow


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not on PATH (CI must provide Node.js 20)")
        pytest.skip(f"{tool} is not on PATH")
    return found


@pytest.fixture
def built_agent(tmp_path: Path) -> Path:
    """The example compiled with its pinned TypeScript, in a copy (the checkout stays clean)."""
    node, npm = _need("node"), _need("npm")
    work = tmp_path / "agent"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("node_modules", "dist"))
    for argv in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "build"]):
        proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert subprocess.run([node, "--version"], capture_output=True, text=True,
                          check=True).stdout.startswith("v")
    return work / "dist" / "agent.js"


def test_a_typescript_agent_folds_in_the_background_and_waits_for_it_by_long_poll(
        built_agent: Path, make_settings: Callable[..., Settings], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    port = free_port()
    settings = make_settings(metrics_port=0, scheduler_sweep_interval_s=2,
                             scheduler_block_ms=200, api_port=port)
    store = SessionStore.from_url(settings.store_url)
    store.migrate()
    key = create_key(store, "ts-team").key
    started(request, scheduler_process(settings, tmp_path / "scheduler.log"))
    started(request, worker_process(settings, tmp_path / "worker.log"))
    started(request, PipelineProcess(["serve"], child_env(settings), tmp_path / "serve.log",
                                     "sessionfold serve: http://"))
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx2.get(f"{base}/healthz", timeout=5).status_code == 200
        except httpx2.HTTPError:
            return False

    wait_until(healthy, timeout_s=60, what="the API to answer /healthz")
    env = {**os.environ, "SESSIONFOLD_URL": base, "SESSIONFOLD_API_KEY": key,
           "SESSION_ID": "incident-bot", "TURNS": "14", "FOLD_WAIT_S": "120"}
    proc = subprocess.run([shutil.which("node") or "node", str(built_agent)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["folded"] is True and report["fold_revision"] > 0
    assert report["window_kinds"][0] == "message"  # the task stays first

    sid = "tenant:ts-team/incident-bot"
    try:
        records = store.records(sid)
        folded = [r for r in records if r.outcome == "folded"]
        assert folded and all(r.trigger == "threshold" for r in folded), records
        assert store.read_ledger(sid)[-1].message is not None
        assert len(store.read_ledger(sid)) == 28  # every turn's question and answer, once
        _python_agent_through_the_wrapper(settings, store)
    finally:
        store.close()


def _python_agent_through_the_wrapper(settings: Settings, store: SessionStore) -> None:
    """A Python agent on the same deployment, written as plain anthropic SDK code through
    SessionAnthropic: its session folds in the background too (no fold on its path)."""
    provider = FakeProvider()
    with provider.serve() as server, contextlib.closing(connect(settings)) as client:
        handle = client.session("py-agent", policy=FoldPolicy(budget_tokens=4000),
                                system="You are the Python agent. Cite item ids.")
        llm = SessionAnthropic(anthropic.Anthropic(api_key="sk-fake", base_url=server.base_url),
                               handle)
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

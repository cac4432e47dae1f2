"""``sessionfold demo``: a small real run on the embedded stack, and its pieces on their own.

The run (2 agents x 40 turns, budget 8,000) goes through the real CLI in a subprocess: embedded
Redis and SQLite under ``tmp_path``, two Celery workers, the scheduler, Flower and metrics. Its
JSON report is then held to what can be computed independently: the generated conversations,
the scripted provider's own token count of every ledger prefix, and the store the demo wrote.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sessionfold.cli.demo import (
    CHART_NAME,
    REPORT_NAME,
    AgentScript,
    generated_fleet,
    transcript_fleet,
)
from sessionfold.cli.demo.fleet import AgentRun, QuestionCheck, check_question, drive
from sessionfold.cli.demo.report import AgentReport, DemoReport, render_report
from sessionfold.cli.files import load_conversation_file
from sessionfold.cli.main import main
from sessionfold.cli.stack import free_port
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.cli.standin.opsagent import LateQuestion, generate_session
from sessionfold.client import Client
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.frame import summary_message
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.retention import mentions
from sessionfold.core.window import RefusalReason
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore

AGENTS, TURNS, BUDGET = 2, 40, 8000
#: The real agent transcripts shipped as test data, ``<repo>/tests/data/transcripts``.
TRANSCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: Variables of the test process that would point the demo elsewhere than its own tmp dir.
_FOREIGN = ("REDIS_URL", "DATABASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
            "PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


@dataclass
class DemoRun:
    returncode: int
    stdout: str
    report: dict[str, Any]
    out: Path
    data: Path
    flower_port: int
    metrics_port: int


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One small demo on the embedded stack, shared by the tests that read its report."""
    root = tmp_path_factory.mktemp("demo")
    out, data = root / "out", root / "data"
    flower_port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in _FOREIGN and not k.startswith("SESSIONFOLD_")}
    env.update(SESSIONFOLD_DATA_DIR=str(data), SESSIONFOLD_FLOWER_PORT=str(flower_port),
               SESSIONFOLD_METRICS_PORT=str(metrics_port))
    proc = subprocess.run(
        [sys.executable, "-m", "sessionfold.cli", "demo", "--agents", str(AGENTS),
         "--turns", str(TURNS), "--budget", str(BUDGET), "--out", str(out)],
        cwd=root, env=env, capture_output=True, text=True, timeout=480)
    report_path = out / REPORT_NAME
    if not report_path.exists():
        pytest.fail(f"the demo wrote no report (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
                    f"\n{proc.stderr[-4000:]}")
    return DemoRun(proc.returncode, proc.stdout + proc.stderr,
                   json.loads(report_path.read_text()), out, data, flower_port, metrics_port)


def _agents(demo: DemoRun) -> list[dict[str, Any]]:
    agents = demo.report["agents"]
    assert [a["name"] for a in agents] == [f"ops-agent-{n:02d}" for n in range(AGENTS)]
    return agents  # type: ignore[no-any-return]


# --- the run ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_exits_0_and_says_where_flower_metrics_and_the_summarizer_are(demo: DemoRun) -> None:
    assert demo.returncode == 0, demo.stdout[-4000:]
    assert f"http://127.0.0.1:{demo.flower_port}/tasks" in demo.stdout
    assert f"http://127.0.0.1:{demo.metrics_port}/metrics" in demo.stdout
    assert "offline extractive summarizer" in demo.stdout
    assert "ANTHROPIC_API_KEY is not set" in demo.stdout
    assert demo.report["summarizer_kind"] == "offline"
    assert demo.report["settled"] is True
    assert demo.report["totals"]["errors"] == 0


@pytest.mark.slow
def test_the_readmes_excerpt_has_the_shape_of_the_report_the_demo_prints(demo: DemoRun) -> None:
    """The README shows an excerpt of one `make demo` (tools/excerpts.py wrote it): this run's
    report has the same tables, columns and lines (its figures, ids and rows are its own)."""
    import importlib.util

    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("sessionfold_tools_excerpts",
                                                  repo / "tools" / "excerpts.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    (block,) = [b for b in tool.blocks(repo / "README.md") if tool.is_demo(b.command)]
    assert tool.shape_differences(block.text, tool.demo_report(demo.stdout)) == []


@pytest.mark.slow
def test_every_agent_folded_in_the_background_never_on_its_own_path(demo: DemoRun) -> None:
    for agent in _agents(demo):
        assert agent["folds"] > 0, agent["name"]
        assert agent["agent_summarizer_calls"] == 0
        assert agent["inline_folds"] == 0
        assert agent["overflow_rejections"] == 0
        assert len(agent["fold_turns"]) == agent["folds"]
        assert agent["fold_turns"] == sorted(agent["fold_turns"])
        assert all(1 <= t <= agent["calls"] + 1 for t in agent["fold_turns"])
    totals = demo.report["totals"]
    assert totals["folds"] == sum(a["folds"] for a in _agents(demo))
    assert totals["agent_summarizer_calls"] == 0
    assert "summarizer calls on the agents' path: 0" in demo.stdout


@pytest.mark.slow
def test_folds_and_refusals_match_the_records_in_the_store(demo: DemoRun) -> None:
    store = SessionStore.from_url(f"sqlite:///{demo.data / 'sessionfold.db'}")
    spans = 0
    try:
        for agent in _agents(demo):
            spans += len(store.spans(agent["session_id"]))
            records = store.records(agent["session_id"])
            assert agent["folds"] == sum(r.outcome == "folded" for r in records)
            assert agent["visits"] == len(records)
            reasons: dict[str, int] = {}
            for record in records:
                for refusal in record.refusals:
                    reasons[refusal.reason] = reasons.get(refusal.reason, 0) + 1
            assert agent["refusals"] == reasons
            assert set(reasons) <= set(RefusalReason.__args__)  # type: ignore[attr-defined]
    finally:
        store.close()
    # Masking old tool output alone cannot hold 40 turns under 8,000 tokens: summaries were made.
    assert spans > 0


@pytest.mark.slow
def test_ledgers_hold_every_message_unchanged(demo: DemoRun) -> None:
    store = SessionStore.from_url(f"sqlite:///{demo.data / 'sessionfold.db'}")
    try:
        for n, agent in enumerate(_agents(demo)):
            original = generate_session(n, TURNS).conversation.messages
            ledger = store.read_ledger(agent["session_id"])
            assert [e.message for e in ledger] == original
            assert agent["ledger_intact"] is True
            assert agent["messages"] == agent["ledger_messages"] == len(original)
            window = store.read_window(agent["session_id"])
            # The window was folded, the ledger not.
            assert window.tokens < sum(entry.tokens for entry in ledger) / 2
    finally:
        store.close()
    assert demo.report["totals"]["ledgers_intact"] is True


@pytest.mark.slow
def test_billed_tokens_without_sessionfold_are_the_whole_ledger_resent(demo: DemoRun) -> None:
    provider = FakeProvider()
    for n, agent in enumerate(_agents(demo)):
        conv = generate_session(n, TURNS).conversation
        messages = [m.to_json() for m in conv.messages]
        calls = [i for i, m in enumerate(conv.messages) if m.role == "assistant" and i > 0]
        resent = sum(provider.count_tokens({"system": conv.system, "messages": messages[:i]})
                     for i in calls)
        assert agent["calls"] == len(calls)
        assert agent["billed_without"] == resent
        assert 0 < agent["billed_with"] < agent["billed_without"]
        assert agent["peak_wire_tokens"] < agent["last_ledger_tokens"]
    totals = demo.report["totals"]
    assert totals["billed_with"] == sum(a["billed_with"] for a in _agents(demo))
    assert totals["billed_without"] == sum(a["billed_without"] for a in _agents(demo))


@pytest.mark.slow
def test_late_questions_about_early_identifiers_were_answered_from_the_window(
        demo: DemoRun) -> None:
    for n, agent in enumerate(_agents(demo)):
        asked = generate_session(n, TURNS).late_questions
        got = agent["questions"]
        assert [(q["identifier"], q["asked_seq"], q["first_seen_seq"]) for q in got] == \
            [(q.identifier, q.seq, q.first_seen_seq) for q in asked]
        for q in got:
            assert q["answered"] is True, q
            assert q["in_summary"] or q["kept_seqs"], q
    totals = demo.report["totals"]
    assert totals["questions"] == totals["questions_answered"] == 3 * AGENTS


@pytest.mark.slow
def test_chart_is_written_as_a_png(demo: DemoRun) -> None:
    chart = demo.out / CHART_NAME
    assert demo.report["chart_path"] == str(chart.resolve())
    data = chart.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20_000  # axes, two panels and lines, not an empty canvas


def _first_cells(table: str) -> list[str]:
    """The first column of a rich table's body rows, up to its total row."""
    cells = []
    for line in table.splitlines():
        if not line.startswith("│"):
            continue  # borders and the header (drawn with ┃)
        cell = line.split("│")[1].strip()
        if cell == "total":
            break
        if cell:  # a wrapped row's continuation line leaves it empty
            cells.append(cell)
    return cells


@pytest.mark.slow
def test_the_report_names_agents_by_the_ids_inspect_and_list_take(
        demo: DemoRun, capsys: pytest.CaptureFixture[str]) -> None:
    report = demo.stdout[demo.stdout.index("Billed input tokens per agent"):]
    shown = _first_cells(report)
    assert shown == [a["session_id"] for a in _agents(demo)]
    url = f"sqlite:///{demo.data / 'sessionfold.db'}"
    for sid in shown:
        assert main(["inspect", sid, "--database-url", url]) == 0
        assert capsys.readouterr().out.startswith(f"session {sid} ")
    assert main(["list", "--json", "--database-url", url]) == 0
    listed = json.loads(capsys.readouterr().out)["sessions"]
    assert [s["id"] for s in listed] == shown
    assert all(s["last_fold_at"] and s["budget_tokens"] == BUDGET for s in listed)
    assert f"sessionfold inspect {shown[0]} (every session: sessionfold list)" in demo.stdout


# --- the pieces, without the pipeline --------------------------------------------------------

def _one_agent_report(name: str, sid: str) -> DemoReport:
    question = QuestionCheck("ACCT-4242", asked_seq=9, first_seen_seq=2, in_summary=True,
                             kept_seqs=())
    agent = AgentReport(
        name=name, session_id=sid, source="generated", messages=10, calls=5, folds=1, visits=1,
        refusals={}, billed_with=100, billed_without=200, peak_wire_tokens=50,
        last_wire_tokens=40, last_ledger_tokens=90, over_context_without=0,
        agent_summarizer_calls=0, inline_folds=0, overflow_rejections=0,
        background_summarizer_calls=1, ledger_messages=10, ledger_intact=True,
        questions=[question], fold_turns=[3])
    return DemoReport(agents=[agent], summarizer="offline", summarizer_kind="offline",
                      budget_tokens=8000, context_window=200_000, model_latency_s=0.05)


def test_the_rendered_report_names_the_session_not_the_agent_script() -> None:
    console = Console(width=220, record=True, file=io.StringIO())
    console.print(render_report(_one_agent_report("ops-agent-00", "demo-abc123-ops-agent-00")))
    text = console.export_text()
    tables = text.split("Late questions about early identifiers")
    assert _first_cells(tables[0]) == ["demo-abc123-ops-agent-00"]
    assert _first_cells(tables[1]) == ["demo-abc123-ops-agent-00"]
    assert not re.search(r"│ ops-agent-00 ", text)
    assert ("a session's window, fold seams and all: sessionfold inspect "
            "demo-abc123-ops-agent-00 (every session: sessionfold list)") in text


@pytest.fixture
def transcripts_dir() -> Path:
    path = TRANSCRIPTS.resolve()
    if not path.is_dir():
        pytest.fail(f"the shared transcripts are missing: {path}")
    return path


def _question(identifier: str = "ACCT-4242") -> LateQuestion:
    return LateQuestion(seq=9, identifier=identifier, first_seen_seq=2)


def test_a_question_is_answered_from_a_summary_in_the_window() -> None:
    summary = summary_message("Identifiers: ACCT-4242; INC-1", start_seq=1, end_seq=6,
                              message_count=6, model="extractive").to_json()
    window = [{"role": "user", "content": "task"}, summary,
              {"role": "user", "content": "what was the account?"}]
    check = check_question(_question(), window, ledger=[])
    assert (check.answered, check.in_summary, check.kept_seqs) == (True, True, ())
    assert check.where == "summary"


def test_a_question_is_answered_from_a_kept_message_found_by_its_seq() -> None:
    ledger = [{"role": "user", "content": "task"},
              {"role": "assistant", "content": "Looking at ACCT-4242 now."},
              {"role": "user", "content": "ok"}]
    window = [*ledger, {"role": "user", "content": "which account?"}]
    check = check_question(_question(), window, ledger)
    assert (check.in_summary, check.kept_seqs) == (False, (1,))
    assert check.where == "message #1"


def test_the_question_itself_does_not_answer_it() -> None:
    window = [{"role": "user", "content": "task"},
              {"role": "user", "content": "was it ACCT-4242? remind me"}]
    check = check_question(_question(), window, ledger=window)
    assert not check.answered
    assert check.where == "not in the window"
    # A longer identifier that merely starts with it is not a mention either.
    window = [{"role": "user", "content": "ACCT-42421 is another one"}, {"role": "user",
                                                                       "content": "?"}]
    assert not check_question(_question(), window, ledger=window).answered


def test_the_first_incident_is_not_named_between_the_handover_and_its_question() -> None:
    for agent, seed in [(a, 7) for a in range(6)] + [(0, 1), (1, 2), (2, 3)]:
        ops = generate_session(agent, 150, seed)
        texts = [json.dumps(m.to_json()) for m in ops.conversation.messages]
        handover = next(i for i, t in enumerate(texts) if "park the first escalation" in t)
        for q in ops.late_questions:
            assert mentions(texts[q.first_seen_seq], q.identifier)
            assert not any(mentions(t, q.identifier) for t in texts[:q.first_seen_seq])
            assert not any(mentions(t, q.identifier) for t in texts[handover + 1:q.seq + 1])


def test_fleet_options_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="--agents"):
        generated_fleet(0, 40)
    with pytest.raises(InvalidInputError, match="--turns"):
        generated_fleet(2, 5)
    fleet = generated_fleet(3, 20, seed=3)
    assert [a.name for a in fleet] == ["ops-agent-00", "ops-agent-01", "ops-agent-02"]
    assert all(len(a.late_questions) == 3 and a.source == "generated" for a in fleet)


def test_transcripts_folder_becomes_one_agent_per_file(transcripts_dir: Path,
                                                       tmp_path: Path) -> None:
    fleet = transcript_fleet(transcripts_dir, limit=2)
    files = sorted(transcripts_dir.glob("*.json"))[:2]
    assert [a.name for a in fleet] == [f.stem for f in files]
    assert [a.source for a in fleet] == [f.name for f in files]
    assert all(a.model_calls > 0 and not a.late_questions for a in fleet)
    with pytest.raises(InvalidInputError, match="not a folder"):
        transcript_fleet(tmp_path / "absent")
    with pytest.raises(InvalidInputError, match=r"no \*\.json"):
        transcript_fleet(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match=r"broken\.json"):
        transcript_fleet(tmp_path)


def _client(tmp_path: Path) -> Client:
    settings = Settings(data_dir=tmp_path / "data", redis_url=None, database_url=None,
                        anthropic_api_key=None, summarizer="offline")
    store = SessionStore.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    return Client(settings, store, publisher=None)


def _drive_alone(client: Client, script: AgentScript, budget: int) -> AgentRun:
    sid = f"alone-{script.name}"
    client.store.create_session(sid, FoldPolicy(budget_tokens=budget), script.conversation.system)
    run = AgentRun(script=script, session_id=sid)
    drive(client.session(sid), run, FakeProvider(), threading.Event())
    return run


def test_without_folds_the_window_sent_is_the_whole_ledger(tmp_path: Path) -> None:
    script = generated_fleet(1, 20)[0]
    with _client(tmp_path) as client:
        run = _drive_alone(client, script, budget=200_000)
    assert run.error is None and run.done
    assert run.appended == len(script.conversation.messages)
    assert len(run.calls) == script.model_calls
    assert [c.wire_tokens for c in run.calls] == [c.ledger_tokens for c in run.calls]
    assert [c.turn for c in run.calls] == list(range(1, len(run.calls) + 1))
    assert [q.answered for q in run.questions] == [True, True, True]


def test_a_real_transcript_drives_through_the_client(transcripts_dir: Path,
                                                     tmp_path: Path) -> None:
    path = min(transcripts_dir.glob("*.json"), key=lambda p: p.stat().st_size)
    script = AgentScript(path.stem, load_conversation_file(path), path.name)
    with _client(tmp_path) as client:
        run = _drive_alone(client, script, budget=24_000)
        ledger = client.store.read_ledger(run.session_id)
    assert run.error is None
    assert len(run.calls) == script.model_calls
    assert [e.message for e in ledger] == script.conversation.messages
    ledger_sizes = [c.ledger_tokens for c in run.calls]
    assert ledger_sizes == sorted(ledger_sizes)
    # Oversized tool output is clipped in the window on append: never more than the ledger.
    assert all(c.wire_tokens <= c.ledger_tokens for c in run.calls)

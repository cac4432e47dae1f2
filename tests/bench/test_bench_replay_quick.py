"""B1's harness measures what it claims, and ``bench_replay.py --quick`` still runs.

The quick mode replays one transcript (psf__requests-1142, with its stress step) through the
no-compaction baseline, sessionfold's real client in its inline-only mode, and the fold engine in
process (inline and on a background thread). The report is checked for its shape and for
invariants computed from the requests -- the task in every request, no broken tool pair, the
originals retrievable, the baseline's bill equal to an independent recount -- never for timings:
those belong to the benchmark, not to the test suite. The peers are not run here (they live in
virtualenvs of their own, made by bench/peers/setup_peers.sh).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sessionfold.core.messages import parse_message, parse_messages
from sessionfold.core.tokens import TokenCounter

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
sys.path.insert(0, str(BENCH))

from b1.baseline import NoCompaction  # noqa: E402
from b1.cache import common_prefix_tokens  # noqa: E402
from b1.checks import broken_tool_pairs, has_task, retrievable  # noqa: E402
from b1.counting import Counter, Request, Unit  # noqa: E402
from b1.idle import BURST_CALLS, CACHE_TTL_S, GAP_S, idle_gaps  # noqa: E402
from b1.needed import need_sets  # noqa: E402
from b1.prices import Prices  # noqa: E402
from b1.replay import SystemRun, replay  # noqa: E402
from b1.results import update_section  # noqa: E402
from b1.transcripts import load_transcripts  # noqa: E402
from sessionfold.core.prices import ModelPrices  # noqa: E402

QUICK = "psf__requests-1142"


def _use(tid: str, name: str = "bash") -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": {"command": "ls"}}


def _result(tid: str, text: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tid, "content": text, "is_error": False}


def _transcript(name: str) -> dict[str, Any]:
    path = TRANSCRIPTS / f"{name}.json"
    if not path.exists():
        pytest.fail(f"the shared transcripts are missing: {path.resolve()}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


# --- the harness's own pieces -------------------------------------------------------------------

def test_counter_agrees_with_sessionfold_on_every_transcript_message() -> None:
    """The harness bills with the same numbers sessionfold's trigger uses."""
    ours, theirs = Counter(), TokenCounter()
    for path in sorted(TRANSCRIPTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert ours.system(data["system"]) == theirs.system(data["system"])
        for index, raw in enumerate(data["messages"]):
            assert ours.message(raw) == theirs.message(parse_message(raw, index)), (path, index)
    for content in ("short", "x" * 200, [{"type": "text", "text": "a"}, _use("t1")]):
        raw = {"role": "assistant", "content": content}
        assert ours.message(raw) == theirs.message(parse_message(raw))


def test_request_units_add_up_to_the_request() -> None:
    counter = Counter()
    request = Request("be brief", [{"role": "user", "content": "hello there"},
                                   {"role": "assistant", "content": [{"type": "text",
                                                                      "text": "hi"},
                                                                     _use("t1")]}])
    units = counter.request_units(request)
    assert sum(u.count for u in units) == counter.request(request)
    assert counter.request(request) == counter.system("be brief") + counter.messages(
        request.messages)


def test_broken_tool_pairs_counts_each_break() -> None:
    task = {"role": "user", "content": "fix it"}
    ask = {"role": "assistant", "content": [_use("t1")]}
    answer = {"role": "user", "content": [_result("t1")]}
    assert broken_tool_pairs([task, ask, answer]) == 0
    assert broken_tool_pairs([task, ask]) == 0  # a call in flight is not broken
    assert broken_tool_pairs([task, answer]) == 1  # orphan result (its call was dropped)
    assert broken_tool_pairs([task, ask, {"role": "user", "content": "go on"}]) == 1
    two = {"role": "assistant", "content": [_use("a"), _use("b")]}
    assert broken_tool_pairs([task, two, {"role": "user", "content": [_result("a")]}]) == 1
    assert broken_tool_pairs([task, ask, ask, answer]) == 1


def test_has_task_wants_the_whole_task_in_a_user_message() -> None:
    task = "Fix the bug in models.py where content-length is always sent."
    assert has_task([{"role": "user", "content": [{"type": "text", "text": task}]}], task)
    assert has_task([{"role": "user", "content": "Summary first.\n\n" + task}], task)
    assert not has_task([{"role": "user", "content": task[:-1]}], task)
    assert not has_task([{"role": "assistant", "content": task}], task)


def test_retrievable_needs_every_original_byte_for_byte() -> None:
    originals = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert retrievable(originals, reversed(originals))
    assert not retrievable(originals, originals[:1])
    assert not retrievable(originals, [originals[0], {"role": "assistant", "content": "b "}])


def test_common_prefix_counts_equal_units_then_shared_tokens() -> None:
    before = [Unit("s", 10, (1, 2)), Unit("m", 4), Unit("x", 7, (5, 6, 7, 8))]
    assert common_prefix_tokens(before, before) == 21
    changed = [Unit("s", 10, (1, 2)), Unit("m", 4), Unit("y", 9, (5, 6, 9, 9, 9))]
    assert common_prefix_tokens(before, changed) == 10 + 4 + 2
    assert common_prefix_tokens(before, [Unit("z", 10, (9,)), *before[1:]]) == 0
    assert common_prefix_tokens([], before) == 0


def test_prices_bill_cache_reads_and_writes_with_the_cost_models_table() -> None:
    prices = Prices()  # core.prices' Sonnet 4.5 and Haiku 4.5
    assert (prices.agent.input_per_mtok, prices.agent.cache_read_multiplier,
            prices.agent.cache_write_5m_multiplier) == (3.0, 0.1, 1.25)
    assert prices.request_dollars(1_000_000, 600_000) == pytest.approx((60_000 + 500_000)
                                                                         * 3 / 1e6)
    assert prices.summarizer_dollars(2_000_000, 100_000) == pytest.approx(2.5)
    cheaper = Prices(agent=ModelPrices(input_per_mtok=1.0, output_per_mtok=5.0))
    assert cheaper.request_dollars(1_000_000, 0) == pytest.approx(1.25)


def test_idle_gaps_cut_a_day_into_bursts_the_same_way_every_time() -> None:
    gaps = idle_gaps("some-transcript", 200)
    assert gaps == idle_gaps("some-transcript", 200) != idle_gaps("another", 200)
    starts = [0, *sorted(gaps), 200]
    bursts = [b - a for a, b in itertools.pairwise(starts)]
    assert all(BURST_CALLS[0] <= n <= BURST_CALLS[1] for n in bursts[:-1])
    assert 0 < bursts[-1] <= BURST_CALLS[1]
    assert all(GAP_S[0] <= g <= GAP_S[1] for g in gaps.values())
    assert idle_gaps("some-transcript", 5) == {}


def test_after_an_idle_gap_past_the_cache_lifetime_the_whole_prompt_is_written() -> None:
    (transcript,) = load_transcripts(TRANSCRIPTS, [QUICK])
    warm = replay(NoCompaction(), [transcript], 32_000, time_scale=0.0)
    day = replay(NoCompaction(), [transcript], 32_000, time_scale=0.0, idle=True)
    assert day.idle and not warm.idle
    gaps = idle_gaps(transcript.id, len(warm.transcripts[0].requests))
    assert gaps and all(g > CACHE_TTL_S for g in gaps.values())
    for k, (w, d) in enumerate(zip(warm.transcripts[0].requests, day.transcripts[0].requests,
                                   strict=True)):
        assert d.tokens == w.tokens  # the same requests: only their billing differs
        assert not w.cold and w.idle_s == 0
        if k in gaps:
            assert d.cold and d.cached == 0 and d.idle_s == gaps[k]
            assert w.cached > 0  # warm, the same request read its prefix from the cache
        else:
            assert not d.cold and d.cached == w.cached
    # And the records read back as written.
    again = SystemRun.from_json(json.loads(json.dumps(day.to_json())))
    assert again.idle
    assert [r.to_json() for r in again.transcripts[0].requests] == \
        [r.to_json() for r in day.transcripts[0].requests]
    assert sum(r.cold for r in again.transcripts[0].requests) == len(gaps)


def test_update_section_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    update_section(results, "table one", title="## B1")
    text = results.read_text(encoding="utf-8")
    results.write_text("# Results\n\n" + text + "\nMy reading of it.\n\n## B2\nother\n",
                       encoding="utf-8")
    update_section(results, "table two", title="## B1")
    update_section(results, "extra table", title="## B1", part="extra")
    text = results.read_text(encoding="utf-8")
    assert "table two" in text and "table one" not in text
    assert "My reading of it." in text and "## B2\nother" in text and text.count("## B1") == 1
    # A new part follows the last one, inside the B1 section, not after B2.
    assert text.index("table two") < text.index("extra table") < text.index("My reading")


# --- the quick mode, end to end -----------------------------------------------------------------

@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("b1")
    proc = subprocess.run([sys.executable, str(BENCH / "bench_replay.py"), "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    report = (out / "report.md").read_text(encoding="utf-8")
    assert report.strip() == proc.stdout.strip()
    data: dict[str, Any] = json.loads((out / "runs.json").read_text(encoding="utf-8"))
    data["report"] = report
    return data


def _run(data: dict[str, Any], system: str) -> dict[str, Any]:
    runs = [r for r in data["runs"] if r["system"] == system]
    assert len(runs) == 1, [r["system"] for r in data["runs"]]
    run: dict[str, Any] = runs[0]
    return run


def _totals(data: dict[str, Any], system: str) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in data["totals"] if t["system"] == system)
    return found


@pytest.mark.slow
def test_quick_mode_replays_sessionfold_and_the_baseline_only(quick: dict[str, Any]) -> None:
    assert quick["transcripts"] == [QUICK]
    assert quick["budgets"] == [32000]
    assert sorted(r["system"] for r in quick["runs"]) == [
        "none", "sessionfold-background-inprocess", "sessionfold-inline",
        "sessionfold-inline-inprocess", "sessionfold-inline-recall"]
    calls = sum(1 for m in _transcript(QUICK)["messages"] if m["role"] == "assistant")
    for run in quick["runs"]:
        (transcript,) = run["transcripts"]
        assert transcript["id"] == QUICK
        assert len(transcript["requests"]) == calls
        assert run["stress"]["transcript"] == QUICK


@pytest.mark.slow
def test_quick_report_is_a_well_formed_table(quick: dict[str, Any]) -> None:
    lines = quick["report"].splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| system | billed"))
    columns = lines[header].count("|")
    rows = lines[header + 2: header + 7]
    assert [r.split("|")[1].strip() for r in rows] == [
        "none", "sessionfold-inline", "sessionfold-inline-recall",
        "sessionfold-inline-inprocess", "sessionfold-background-inprocess"]
    assert all(r.count("|") == columns for r in rows)
    assert "Stress step" in quick["report"] and "Time scale 0.001" in quick["report"]


@pytest.mark.slow
def test_baseline_bill_equals_an_independent_recount(quick: dict[str, Any]) -> None:
    """The no-compaction request before assistant message i is the system + messages[:i]."""
    data = _transcript(QUICK)
    counter = TokenCounter()
    messages = parse_messages(data["messages"])
    expected = [counter.system(data["system"]) + counter.messages(messages[:i])
                for i, m in enumerate(messages) if m.role == "assistant"]
    requests = _run(quick, "none")["transcripts"][0]["requests"]
    assert [r[0] for r in requests] == expected
    # An append-only conversation reads its whole previous request from the cache.
    assert [r[1] for r in requests[1:]] == expected[:-1]
    totals = _totals(quick, "none")
    assert totals["billed"] == sum(expected)
    assert totals["over_budget"] == sum(1 for n in expected if n > 32000) > 0
    assert totals["summarizer_calls"] == 0 and totals["prefix_breaks"] == 0
    assert _run(quick, "none")["stress"]["tokens"] == counter.system(data["system"]) + \
        counter.messages(messages)


@pytest.mark.slow
@pytest.mark.parametrize("system", ["sessionfold-inline", "sessionfold-inline-inprocess",
                                    "sessionfold-background-inprocess"])
def test_sessionfold_keeps_the_invariants(quick: dict[str, Any], system: str) -> None:
    totals, base = _totals(quick, system), _totals(quick, "none")
    run = _run(quick, system)
    assert totals["task_missing"] == 0
    assert totals["broken_pair_requests"] == 0
    assert totals["retrievable"] is True
    assert totals["prefix_breaks"] >= 1
    assert totals["billed"] < base["billed"]
    stress = run["stress"]
    assert stress["task"] and stress["newest_step"] and stress["broken_pairs"] == 0
    assert 0 < stress["newest_chars"] < 868_167  # clipped on append, not dropped
    # The model (200 k context) would take it; the baseline's 488 k-token request it would not.
    assert stress["tokens"] < 200_000 < _run(quick, "none")["stress"]["tokens"]
    if "inline" in system:  # folded before the call, so within the budget; a background
        assert stress["tokens"] <= 32000  # fold may not have landed yet (timing)


RECALL_COLUMNS = ("needed-context recall", "after 1st compaction", "calls under 0.5")


@pytest.mark.slow
def test_every_system_reports_needed_context_recall_and_the_baseline_scores_one(
        quick: dict[str, Any]) -> None:
    header = next(line for line in quick["report"].splitlines()
                  if line.startswith("| system | needed-context recall"))
    assert all(f"| {column} |" in header for column in RECALL_COLUMNS)
    assert "| with the recall tool (oracle: upper bound) |" in header
    need = need_sets(_transcript(QUICK)["messages"])
    needed = sum(len(n) for n in need)
    base = _totals(quick, "none")
    assert base["needed"] == needed > 100
    assert base["present"] == needed and base["recall"] == 1.0 and base["under_half"] == 0
    assert base["recall_after"] is None  # it never compacts
    requests = _run(quick, "none")["transcripts"][0]["requests"]
    assert [r[6] for r in requests] == [len(n) for n in need]
    assert all(r[7] == r[6] for r in requests)
    tool = _totals(quick, "sessionfold-inline-recall")
    assert tool["recall_tool"] is True
    assert tool["recall_with_tool"] >= tool["recall"]  # recall calls only ever add
    assert not _totals(quick, "sessionfold-inline")["recall_tool"]
    for system in ("sessionfold-inline", "sessionfold-inline-recall",
                   "sessionfold-inline-inprocess", "sessionfold-background-inprocess"):
        totals = _totals(quick, system)
        assert totals["needed"] == needed  # the same need, whatever the system sends
        assert 0 < totals["present"] <= needed
        assert totals["calls_after"] > 0 and totals["recall_after"] is not None


@pytest.mark.slow
def test_only_the_inline_system_summarizes_on_the_agents_thread(quick: dict[str, Any]) -> None:
    inline = _run(quick, "sessionfold-inline-inprocess")["summarizer_calls"]
    background = _run(quick, "sessionfold-background-inprocess")["summarizer_calls"]
    assert inline and all(c["on_agent_thread"] for c in inline)
    assert background and not any(c["on_agent_thread"] for c in background)


@pytest.mark.parametrize(("argv", "says"), [
    (["--policy", "bogus=1"], "unknown policy field"),
    (["--policy", "target_ratio=0.9"], "target_ratio < trigger_ratio"),
    (["--systems", "none,letta"], "unknown system(s) ['letta']"),
    (["--budgets", "32k"], "--budgets must be comma-separated integers"),
])
def test_bad_arguments_are_refused_with_a_reason(argv: list[str], says: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "bench_replay.py"), *argv],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert says in proc.stderr

"""``bench/bench_scheduler.py`` still runs and does what it says: every event read and
acknowledged, and in steady state (``--call-interval-s``) the share of reports it says written
(not a timed test: only what must hold whatever the machine's speed is checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_scheduler.py"

pytestmark = pytest.mark.redis


def run_bench(redis_url: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    out, numbers = tmp_path / "scheduler.md", tmp_path / "scheduler.json"
    done = subprocess.run([sys.executable, str(BENCH), "--redis-url", redis_url,
                           "--out", str(out), "--json", str(numbers), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data: dict[str, Any] = json.loads(numbers.read_text())
    return data


def test_steady_state_writes_one_report_in_refresh_over_interval(
        redis_url: str, tmp_path: Path) -> None:
    # 1,000 events over 200 sessions: one read takes them all, the newest of each session
    # counts. 1,000 × 30 / (300 × 200) = a half of the sessions made due: 100 written.
    result = run_bench(redis_url, tmp_path, "--sessions", "200", "--events", "1000",
                       "--policy-cache-s", "0", "--call-interval-s", "30")["result"]
    assert result["events"] == 1000 and result["unacked left"] == 0
    assert result["made due"] == 100
    assert result["store rows written"] == 100
    assert result["deferred"] == 100  # the other half: under the trigger, written lately
    assert result["jobs enqueued"] == 0
    assert "redis last calls (deferred reports)" in result["split"]


def test_without_a_warm_up_each_session_s_first_report_is_written(
        redis_url: str, tmp_path: Path) -> None:
    result = run_bench(redis_url, tmp_path, "--sessions", "200", "--events", "1000",
                       "--policy-cache-s", "0")["result"]
    assert result["unacked left"] == 0 and result["made due"] == 0
    assert result["store rows written"] == 200 and result["deferred"] == 0


@pytest.mark.slow
def test_processes_share_the_events_in_steady_state(redis_url: str, tmp_path: Path) -> None:
    data = run_bench(redis_url, tmp_path, "--processes", "1,2", "--sessions", "400",
                     "--events", "2000", "--policy-cache-s", "0", "--call-interval-s", "30")
    assert [run["processes"] for run in data["runs"]] == [1, 2]
    for run in data["runs"]:
        assert run["events"] == 2000 and run["unacked left"] == 0
        assert len(run["per process"]) == run["processes"]
        assert all(p["events"] > 0 for p in run["per process"])


def test_a_call_interval_needs_a_refresh(redis_url: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--redis-url", redis_url,
                           "--refresh-s", "0", "--call-interval-s", "30",
                           "--out", str(tmp_path / "x.md")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--refresh-s > 0" in done.stderr

"""``bench/bench_pipeline.py --quick`` still runs and measures what it says (not a timed test:
the numbers are only checked for what must hold whatever the machine's speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_pipeline.py"


@pytest.mark.slow
def test_quick_mode_folds_every_session_and_reports_a_causal_lag(
        redis_url: str, tmp_path: Path) -> None:
    out, numbers = tmp_path / "pipeline.md", tmp_path / "pipeline.json"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--redis-url", redis_url,
                           "--out", str(out), "--json", str(numbers)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(numbers.read_text())
    throughput, lag = result["throughput"], result["lag"]
    assert throughput["folded"] == throughput["sessions"] == 20
    assert throughput["folds/s"] > 0
    assert lag["folded"] == lag["sessions"] == 40
    # A fold cannot land before its summarizer answered: the lag has that floor.
    assert lag["summarizer s"] <= lag["lag p50"] <= lag["lag p99"] <= lag["lag max"]
    assert lag["summarizer calls"] >= lag["folded"]
    assert lag["redis bytes/session"] > 0
    assert "folds/s" in out.read_text() and "p50" in out.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_throughput_only_on_300_item_windows_reports_the_workers_cpu_per_fold(
        redis_url: str, tmp_path: Path, pool: str) -> None:
    out, numbers = tmp_path / "pipeline.md", tmp_path / "pipeline.json"
    done = subprocess.run([sys.executable, str(BENCH), "--throughput-only",
                           "--throughput-messages", "291", "--throughput-sessions", "4",
                           "--throughput-economics", "dollars", "--throughput-pool", pool,
                           "--redis-url", redis_url,
                           "--out", str(out), "--json", str(numbers)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(numbers.read_text())
    assert "lag" not in result
    throughput = result["throughput"]
    assert throughput["folded"] == throughput["sessions"] == 4
    assert throughput["messages"] == 291 and throughput["economics"] == "dollars"
    assert throughput["pool"] == pool and f"{pool} pool" in out.read_text()
    # The worker's own CPU over the run: positive, and one fold's share of it is what the
    # folds per CPU-second invert.
    assert throughput["worker cpu s"] > 0
    assert throughput["cpu ms/fold"] * throughput["folds per cpu-s"] == pytest.approx(1000)
    # Split between the consumer and the pool: a solo worker folds in the consumer itself; a
    # prefork worker's folds run in its child, which spends more than the consumer. The kernel
    # counts CPU in clock ticks (10 ms): a prefork consumer that only hands four jobs to its
    # child may spend less than one tick over the run, and read 0 (CI once did).
    consumer, pool_ms = throughput["consumer cpu ms/fold"], throughput["pool cpu ms/fold"]
    assert consumer + pool_ms == pytest.approx(throughput["cpu ms/fold"])
    if pool == "solo":
        assert pool_ms == pytest.approx(0.0, abs=1e-9) and consumer > 0
    else:
        assert pool_ms > consumer >= 0
    assert "291-message windows, every visit priced" in out.read_text()

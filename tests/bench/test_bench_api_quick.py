"""``bench/bench_api.py --quick`` still runs and measures what it says (not a timed test: the
numbers are only checked for what must hold whatever the machine's speed). The quick mode reads
with the bench's own asyncio load, so it needs no wrk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_api.py"


@pytest.mark.slow
def test_quick_mode_answers_every_read_and_wakes_every_waiter_with_a_new_etag(
        redis_url: str, tmp_path: Path) -> None:
    out, numbers = tmp_path / "api.md", tmp_path / "api.json"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--redis-url", redis_url,
                           "--out", str(out), "--json", str(numbers)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(numbers.read_text())
    http = [r for r in result["reads"] if r["path"] == "HTTP"]
    library = [r for r in result["reads"] if r["path"].startswith("library")]
    assert http and len(library) == 2
    for row in http + library:
        assert row["requests"] > 0
        assert row["non-200"] == 0 and row["socket errors"] == 0
        assert 0 < row["p50 ms"] <= row["p90 ms"] <= row["p99 ms"]
        assert row["requests/s"] > 0
    [poll] = result["long poll"]
    assert poll["waiting seen"] == poll["waiters"] == 200
    assert poll["folds"] == {"folded": poll["sessions"]}
    assert poll["statuses"] == {"200": 200} and poll["errors"] == {}
    assert poll["etag changed"] == poll["delays"] == 200
    # A response cannot arrive before its fold was stamped (inside the fold's transaction).
    assert 0 <= poll["delay min ms"] <= poll["delay p50 ms"] <= poll["delay p99 ms"] \
        <= poll["delay max ms"]
    assert poll["rss waiting"] > 0 and poll["rss after"] > 0
    text = out.read_text()
    assert "requests/s" in text and "delay p50" in text and "Goals:" in text

"""``bench/bench_api_memory.py --quick`` still runs and measures what it says: unauthenticated
bodies are all refused 401 and the server holds none of them (not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_api_memory.py"


@pytest.mark.slow
def test_quick_mode_refuses_every_body_and_the_server_holds_none(tmp_path: Path) -> None:
    numbers = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(numbers)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = json.loads(numbers.read_text())
    assert (run["bodies"], run["size_mb"]) == (3, 20)
    assert run["statuses"] == {"401": 3}
    assert run["sent"] == 3 * 20 * 1024 * 1024  # every byte went out, none was kept
    assert 0 < run["idle_rss"] <= run["peak_rss"]
    assert run["growth"] <= 20 * 1024 * 1024, "the server held what it refused"

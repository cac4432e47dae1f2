"""``bench/bench_worker_children.py --quick`` still runs and reads what it says from ``/proc``
(not a timed test: only what must hold whatever the machine's speed is checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_worker_children.py"


@pytest.mark.slow
def test_quick_mode_reads_every_child_at_start_and_after_its_folds(
        redis_url: str, tmp_path: Path) -> None:
    numbers = tmp_path / "children.json"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--redis-url", redis_url,
                           "--json", str(numbers)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(numbers.read_text())
    assert result["children"] == 2 and result["folds"] == 6
    assert len(result["start"]) == len(result["after"]) == 2
    for start, after in zip(result["start"], result["after"], strict=True):
        # The same child read twice: it only ever adds CPU; its own memory is part of its PSS.
        assert 0 <= start["cpu_s"] <= after["cpu_s"]
        assert 0 < start["private_dirty_mb"] <= start["pss_mb"]
        assert 0 < after["private_dirty_mb"] <= after["pss_mb"]
    # The six folds ran in the children: they spent CPU on them.
    assert result["fold_cpu_ms"] > 0
    assert "private dirty MB" in done.stdout

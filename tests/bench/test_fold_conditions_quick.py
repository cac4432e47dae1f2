"""``bench/fold_conditions.py --quick`` still runs every condition in a process of its own and
reports what it measured: every timed visit folded, a positive CPU median per condition, and
each round's run kept (never a timing assertion: the conditions' order on a shared machine says
nothing here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from quick_bench import BENCH, run_quick


@pytest.mark.slow
def test_quick_mode_runs_each_condition_in_its_own_process(tmp_path: Path) -> None:
    rows, stdout = run_quick("fold_conditions.py", tmp_path / "conditions.json")
    assert [row["condition"] for row in rows] == ["plain", "celery-heap", "cache-flush", "pause"]
    for row in rows:
        (run,) = row["rounds"]
        assert run["condition"] == row["condition"] and run["label"] == "40 messages"
        assert run["folds"] == run["folded"] == 5
        assert row["cpu_median_ms"] == run["cpu_median_ms"] > 0
    assert "| pause |" in stdout


def test_an_unknown_condition_is_refused_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "fold_conditions.py"), "--conditions", "plain,warp"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--conditions takes plain, celery-heap, cache-flush, pause" in done.stderr
    assert "'plain,warp'" in done.stderr

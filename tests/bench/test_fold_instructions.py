"""``bench/fold_instructions.py`` counts a fold's instructions under valgrind: the count is
positive, grows with the folds run, and is the same for the same code run twice (the reason it
exists: CPU time on a shared machine is not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fold_instructions.py"


def _count(out: Path) -> dict[str, int]:
    done = subprocess.run([sys.executable, str(BENCH), "--messages", "40", "--folds", "14",
                           "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "M instructions per fold" in done.stdout
    result: dict[str, int] = json.loads(out.read_text())
    return result


@pytest.mark.slow
def test_a_folds_instructions_are_counted_and_the_count_repeats(tmp_path: Path) -> None:
    if shutil.which("valgrind") is None:
        if os.environ.get("CI"):
            pytest.fail("valgrind is missing (Debian package valgrind)")
        pytest.skip("valgrind is not installed")
    first = _count(tmp_path / "a.json")
    second = _count(tmp_path / "b.json")
    assert first["messages"] == 40 and first["folds"] == 14
    totals = {int(k): v for k, v in first["totals"].items()}
    assert totals[14] > totals[10] > 0
    # One 40-message fold is millions of instructions, and counting it again gives the same
    # figure to within a hundredth (CPU time on this machine moves by far more).
    per_fold = first["instructions_per_fold"]
    assert per_fold > 1_000_000
    assert abs(second["instructions_per_fold"] - per_fold) <= per_fold / 100

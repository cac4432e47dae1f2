"""bench/bench_compact.py --quick still runs and writes a well-formed table.

Numbers are checked for sanity against the transcript itself, never for speed: timing belongs to
the benchmark, not to the test suite.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "bench_compact.py"
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"

# bench/ is scripts, not a package: load the script as a module.
_spec = importlib.util.spec_from_file_location("bench_compact", BENCH)
assert _spec is not None and _spec.loader is not None
bench_compact = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_compact)


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_quick_mode_writes_one_sane_row(tmp_path: Path) -> None:
    out = tmp_path / "compact.md"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text(encoding="utf-8")
    assert text.strip() == proc.stdout.strip()
    assert "Command: `.venv/bin/python bench/bench_compact.py --quick`" in text

    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 3, "header, rule and exactly one row"
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert tuple(header) == bench_compact.COLUMNS
    assert len(table[1].strip("|").split("|")) == len(header)
    row = dict(zip(header, (c.strip() for c in table[2].strip("|").split("|")), strict=True))

    name = row["transcript"]
    assert name == bench_compact.QUICK_TRANSCRIPT
    source = TRANSCRIPTS / f"{name}.json"
    assert _number(row["messages"]) == len(json.loads(source.read_text())["messages"])
    assert _number(row["chars"]) == source.stat().st_size
    before, after = _number(row["window before"]), _number(row["window after"])
    assert 0 < before <= _number(row["tokens in file"])
    assert row["outcome"] in ("folded", "nothing-to-fold", "refused")
    if row["outcome"] == "folded":
        assert after < before
    assert after <= bench_compact.DEFAULT_BUDGET
    assert int(row["runs"]) == 1
    for column in ("first run s", "median s", "CLI process s", "peak RSS MB",
                   "RSS after imports MB", "traced peak MB"):
        value = _number(row[column])
        assert math.isfinite(value) and value > 0, (column, value)
    assert _number(row["peak RSS MB"]) >= _number(row["RSS after imports MB"])


def test_update_results_replaces_only_its_own_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nintro\n\n## Compact (issue 2)\n\nold table\n\n"
                       "## Store (issue 3)\n\nstore table\n", encoding="utf-8")
    bench_compact.update_results("new table", results)
    text = results.read_text(encoding="utf-8")
    assert "old table" not in text
    assert text == ("# Benchmark results\n\nintro\n\n## Compact (issue 2)\n\nnew table\n\n"
                    "## Store (issue 3)\n\nstore table\n")

    bench_compact.update_results("newer table", results)
    assert results.read_text(encoding="utf-8").count("## Compact (issue 2)") == 1


def test_update_results_appends_a_missing_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Store (issue 3)\n\nstore table\n",
                       encoding="utf-8")
    bench_compact.update_results("the table", results)
    assert results.read_text(encoding="utf-8") == (
        "# Benchmark results\n\n## Store (issue 3)\n\nstore table\n\n"
        "## Compact (issue 2)\n\nthe table\n")

"""docs/capacity.md is what bench/capacity.py makes of the committed benchmark inputs, and the
model's arithmetic holds (rates scale with the fleet; every figure is positive)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "capacity.py"
INPUTS = REPO / "bench" / "results" / "capacity-inputs.json"

_spec = importlib.util.spec_from_file_location("capacity", SCRIPT)
assert _spec is not None and _spec.loader is not None
capacity = importlib.util.module_from_spec(_spec)
sys.modules["capacity"] = capacity  # dataclasses look their module up there
_spec.loader.exec_module(capacity)


def test_the_checked_in_document_is_what_the_script_makes_of_the_inputs(tmp_path: Path) -> None:
    doc = tmp_path / "capacity.md"
    done = subprocess.run([sys.executable, str(SCRIPT), "--doc", str(doc)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert doc.read_text(encoding="utf-8") == (REPO / "docs" / "capacity.md").read_text(
        encoding="utf-8"), "regenerate docs/capacity.md with `python bench/capacity.py`"


def test_the_plan_scales_with_the_fleet() -> None:
    raw = json.loads(INPUTS.read_text(encoding="utf-8"))
    raw.pop("budget")
    inputs = capacity.Inputs(**raw)
    small, large = capacity.plan(inputs, 10_000, 30.0), capacity.plan(inputs, 1_000_000, 30.0)
    assert math.isclose(large.events_per_s, small.events_per_s * 100)
    assert math.isclose(large.folds_per_s, small.folds_per_s * 100)
    assert math.isclose(large.ledger_rows_per_day, small.ledger_rows_per_day * 100)
    assert large.worker_cores >= small.worker_cores * 50  # ceilings round each one up
    assert large.summarizer_dollars_per_h > small.summarizer_dollars_per_h > 0
    assert large.redis_bytes > small.redis_bytes > 0
    assert 1 <= small.scheduler_processes <= large.scheduler_processes


def test_bad_arguments_are_refused_with_a_reason() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--agents", "ten"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "--agents must be comma-separated integers" in done.stderr

"""docs/capacity.md is what bench/capacity.py makes of the committed benchmark inputs, and the
model's arithmetic holds (rates scale with the fleet; every figure is positive)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
    for plan in (small, large):  # cores for a fold's CPU at the planned utilisation, rounded up
        assert plan.worker_cores == math.ceil(
            plan.folds_per_s * inputs.cpu_per_fold_s / capacity.UTILISATION)
    assert large.worker_cores >= small.worker_cores
    assert large.summarizer_dollars_per_h > small.summarizer_dollars_per_h > 0
    assert large.redis_bytes > small.redis_bytes > 0
    assert 1 <= small.scheduler_processes <= large.scheduler_processes


def test_bad_arguments_are_refused_with_a_reason() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--agents", "ten"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "--agents must be comma-separated integers" in done.stderr


def test_collect_keeps_the_figures_of_benchmarks_not_rerun_and_names_what_is_missing(
        tmp_path: Path, monkeypatch: Any) -> None:
    previous = json.loads(INPUTS.read_text(encoding="utf-8"))
    monkeypatch.setattr(capacity, "OUT", tmp_path)  # no benchmark JSON at all
    kept = capacity.collect(previous["budget"], previous)
    defaults = {f.name: f.default for f in dataclasses.fields(capacity.Inputs)}
    for name, value in vars(kept).items():  # the transcripts' figures recomputed alike
        assert value == previous.get(name, defaults[name]), name
    # A re-run benchmark refreshes its own figures alone.
    (tmp_path / "pg-footprint.json").write_text(json.dumps({
        "postgres": "16.4 (x)", "started": "2026-12-02T00:00",
        "footprint": {"sessions": 2, "appends": 9, "rows": {"ledger": 20},
                      "bytes": {"ledger": 10_000, "ledger_chunks": 9_000, "tool_use_ids": 1_000,
                                "window_items": 50_000, "sessions": 80_000}}}),
        encoding="utf-8")
    fresh = capacity.collect(previous["budget"], previous)
    # Only what grows with the ledger: windows and session rows are bounded per session.
    assert fresh.db_bytes_per_ledger_row == 1000.0 and "of 20 ledger rows" in fresh.db_source
    assert fresh.fold_cpu_s == previous["fold_cpu_s"]
    # With nothing to keep, the missing JSON is an error naming the command that makes it.
    with pytest.raises(SystemExit, match=r"profile-fold.json is missing; run `bench/"
                                         r"profile_fold.py"):
        capacity.collect(previous["budget"], None)


def test_a_measured_workers_cpu_plans_the_cores_and_without_it_the_fold_cpu_does(
        tmp_path: Path, monkeypatch: Any) -> None:
    previous = json.loads(INPUTS.read_text(encoding="utf-8"))
    monkeypatch.setattr(capacity, "OUT", tmp_path)
    (tmp_path / "pipeline-throughput.json").write_text(json.dumps({
        "run": "2026-12-02 20:00 UTC", "throughput": {
            "sessions": 200, "folded": 200, "messages": 291, "economics": "dollars",
            "cpu ms/fold": 25.0}}), encoding="utf-8")
    measured = capacity.collect(previous["budget"], previous)
    assert measured.worker_cpu_s == 0.025 and measured.cpu_per_fold_s == 0.025
    assert "200 folds of 291-message windows, every visit priced" in measured.worker_cpu_source
    plan = capacity.plan(measured, 1_000_000, 30.0)
    assert plan.worker_cores == math.ceil(plan.folds_per_s * 0.025 / capacity.UTILISATION)
    alone = capacity.Inputs(**{**vars(measured), "worker_cpu_s": None})
    assert alone.cpu_per_fold_s == alone.fold_cpu_s
    assert capacity.plan(alone, 1_000_000, 30.0).worker_cores == math.ceil(
        plan.folds_per_s * alone.fold_cpu_s / capacity.UTILISATION)
    doc = capacity.document(measured, [plan], 30.0, previous["budget"])
    assert "worker cores (whole worker's CPU)" in doc and "**Worker CPU**: 25.0 ms" in doc

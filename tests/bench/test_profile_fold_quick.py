"""``bench/profile_fold.py --quick`` still runs and measures what it says: every timed visit
folded, CPU time is positive and no more than wall time allows, and the profile names the fold's
own modules (never a timing assertion)."""

from __future__ import annotations

from pathlib import Path

import pytest
from quick_bench import run_quick


@pytest.mark.slow
def test_quick_mode_folds_every_session_and_profiles_the_fold(tmp_path: Path) -> None:
    (result,), stdout = run_quick("profile_fold.py", tmp_path / "profile.json")
    assert result["folds"] == result["folded"] == 5
    assert result["items"] == 40 and result["tokens_before"] > 0
    assert 0 < result["cpu_median_ms"] <= result["cpu_p90_ms"]
    assert result["folds_per_cpu_s"] > 0
    # The offline summarizer's share is counted apart: never more than the fold it ran in.
    assert result["summarizer_median_ms"] > 0
    assert 0 < result["without_summarizer_median_ms"] <= result["cpu_median_ms"]
    modules = [name for name, seconds in result["by_module"] if seconds > 0]
    # The fold's own code shows up under its module names, the planner among them.
    assert any(name.startswith("sessionfold.core.") for name in modules)
    assert "CPU ms/fold" in stdout
    # The three steps are timed inside each fold: together never more than the fold.
    steps = result["steps_median_ms"]
    assert set(steps) == {"begin", "plan", "finish"} and all(v > 0 for v in steps.values())
    assert 0 < result["steps_share"] <= 1.0
    # Every item the fold read is counted once: into a summary, rewritten and kept, or left.
    touched = result["touched"]
    assert touched["read"] == 40
    assert touched["into_spans"] + touched["rewritten_kept"] + touched["untouched"] == 40
    assert touched["into_spans"] > 0 and touched["untouched"] > 0
    assert 0 <= touched["tool_outputs_in_spans"] <= touched["tool_outputs"] <= 40
    assert "claim and read" in stdout

"""Helpers for the fold engine's tests: transcripts as a parameter, and message builders."""

from __future__ import annotations

from pathlib import Path

import pytest

TRANSCRIPTS_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # One test per shared transcript, named after its file; a missing folder fails collection
    # rather than silently producing zero tests.
    if "transcript_path" in metafunc.fixturenames:
        paths = sorted(TRANSCRIPTS_DIR.resolve().glob("*.json"))
        if not paths:
            raise pytest.UsageError(f"no transcripts in {TRANSCRIPTS_DIR.resolve()}")
        metafunc.parametrize("transcript_path", paths, ids=[p.stem for p in paths])

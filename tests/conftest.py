"""Fixtures every test area may use. Keep this small and generic."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The shared real agent transcripts: ``<repo>/../shared/data/transcripts`` (never copied here).
TRANSCRIPTS_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "transcripts"


@pytest.fixture(scope="session")
def transcripts_dir() -> Path:
    """The folder of the shared real agent transcripts (``*.json``)."""
    path = TRANSCRIPTS_DIR.resolve()
    if not path.is_dir():
        pytest.fail(f"the shared transcripts are missing: {path}")
    return path

"""The repository stands on its own: a clone in an empty folder has everything its tests read.

The real agent transcripts ship as test data under ``tests/data/transcripts``; nothing tracked may
reach outside the checkout for them (the developers' sibling data folder exists only beside their
checkout).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
_SIBLING = "shar" + "ed"  # spelled apart, so this file does not name the folder it looks for
OUTSIDE = re.compile(rf"\.\./{_SIBLING}|{_SIBLING}/data|[\"']{_SIBLING}[\"']\s*/")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an sdist or a copied tree)")
    return [line for line in out.splitlines() if line]


def test_no_tracked_code_reads_outside_the_checkout() -> None:
    leaning = []
    for name in _tracked():
        if name.endswith((".md", ".json", ".png")) or name.startswith("tests/data/"):
            continue
        path = REPO / name
        if not path.is_file():
            continue
        if OUTSIDE.search(path.read_text(encoding="utf-8", errors="replace")):
            leaning.append(name)
    assert leaning == [], f"these files read ../{_SIBLING}, which a user's clone lacks: {leaning}"


def test_the_transcripts_ship_with_their_license_and_provenance() -> None:
    files = sorted(TRANSCRIPTS.glob("*.json"))
    assert len(files) == 7
    assert "MIT License" in (TRANSCRIPTS / "LICENSE").read_text(encoding="utf-8")
    readme = (TRANSCRIPTS / "README.md").read_text(encoding="utf-8")
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["source"], f"{path.name} names no source"
        assert path.stem in readme, f"{path.name} is not listed in the transcripts' README"

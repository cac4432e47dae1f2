"""Helpers for the benches' quick-mode tests (imported as a plain module: pytest puts this folder
on the path)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_quick(script: str, out: Path) -> tuple[Any, str]:
    """Run ``bench/<script> --quick --json out``; it must exit 0. Returns its JSON and stdout."""
    done = subprocess.run([sys.executable, str(BENCH / script), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text()), done.stdout

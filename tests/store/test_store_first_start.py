"""Any number of processes may migrate one fresh database at the same moment.

Eight real processes import everything first, then wait at a start gate (a file the test creates
once all of them are ready), so their migrations overlap as closely as processes can.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from sessionfold.store import SCHEMA_REVISION, SessionStore

PROCESSES = 8

CHILD = textwrap.dedent("""
    import os, sys, time
    from sessionfold.store import SessionStore
    url, gate = sys.argv[1], sys.argv[2]
    store = SessionStore.from_url(url)
    print("ready", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.001)
    try:
        print("reached", store.migrate(), flush=True)
    except Exception as exc:
        print("failed", type(exc).__name__, exc, flush=True)
        sys.exit(1)
    finally:
        store.close()
""")


def run_at_once(argv_tail: list[str], gate: Path, child: str = CHILD) -> list[str]:
    """Start ``PROCESSES`` children, open the gate once all are ready; their last lines."""
    procs = [subprocess.Popen([sys.executable, "-c", child, *argv_tail, str(gate)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(PROCESSES)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", line + proc.stdout.read()
        gate.touch()
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [out.strip().splitlines()[-1] if out.strip() else "" for out in outputs]


def test_eight_processes_migrating_a_fresh_database_at_once_all_succeed(
        fresh_url: str, tmp_path: Path) -> None:
    lines = run_at_once([fresh_url], tmp_path / "gate")
    assert lines == [f"reached {SCHEMA_REVISION}"] * PROCESSES, "\n".join(lines)
    with SessionStore.from_url(fresh_url) as store:
        assert store.check_schema() == SCHEMA_REVISION

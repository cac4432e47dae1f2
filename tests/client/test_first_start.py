"""Eight agent processes calling ``connect()`` on one fresh data dir at the same moment all start.

``connect()`` migrates the embedded SQLite store. Each child imports everything first and then
waits at a start gate (a file the test creates once all are ready), so the eight first starts
overlap as closely as processes can; then each writes a session of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sessionfold.store import SessionStore

PROCESSES = 8

CHILD = textwrap.dedent("""
    import os, sys, time
    from sessionfold.core.policy import FoldPolicy
    from sessionfold.client import connect
    from sessionfold.runtime.settings import Settings
    data_dir, redis_url, prefix, gate = sys.argv[1:5]
    settings = Settings(data_dir=data_dir, redis_url=redis_url, key_prefix=prefix,
                        database_url=None, summarizer="offline", anthropic_api_key=None)
    print("ready", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.001)
    try:
        with connect(settings) as client:
            sid = f"agent-{os.getpid()}"
            client.store.create_session(sid, FoldPolicy(budget_tokens=4000))
            client.store.append(sid, [{"role": "user", "content": "hello"}])
            print("started", client.store.engine.url.database, flush=True)
    except Exception as exc:
        print("failed", type(exc).__name__, exc, flush=True)
        sys.exit(1)
""")


def test_eight_processes_connecting_to_a_fresh_data_dir_at_once_all_start(
        tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    data_dir = tmp_path / "data"
    gate = tmp_path / "gate"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    procs = [subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data_dir), redis_url, redis_prefix, str(gate)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
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
    lines = [out.strip().splitlines()[-1] if out.strip() else "" for out in outputs]
    assert all(line.startswith("started ") for line in lines), "\n\n".join(outputs)
    (database,) = {line.split(" ", 1)[1] for line in lines}  # one store for all of them
    with SessionStore.from_url(f"sqlite:///{database}") as store:
        assert len(store.list_sessions()) == PROCESSES

"""Benchmark: the HTTP API's memory under large unauthenticated bodies (issue 33, item 1).

``sessionfold serve`` is started as a real process on a spare port (a fresh data dir with its
SQLite store, the machine's Redis under a fresh key prefix, metrics off). Its RSS is read from
``/proc/PID/status`` while it is idle (after a few small warm-up requests), then ``--bodies``
(20) clients at once each POST a ``--size-mb`` (100 MB) JSON body to
``/v1/sessions/x/messages`` with no API key: one message whose text is the whole body, sent
with its ``Content-Length`` in 1 MiB writes (``--chunked``: chunked transfer encoding, no
length). A sampler reads the server's ``VmRSS`` every 5 ms from the first byte sent until every
client has its answer; the peak of those samples, less the idle figure, is what the bodies cost
the server. ``VmHWM`` (the kernel's own peak, since the process started) is reported beside it.

Every client sends its whole body and then reads the answer (as a plain HTTP client does), so
the server may answer early and go on reading what is left; the time to the answer's status
line is reported too.

``--source DIR`` runs the server from another checkout of this repository (a ``git worktree`` of
an older commit, for the figure before a change) through this virtualenv's editable install:
the child process points the install's package mapping at ``DIR`` before importing anything of
sessionfold, so the same interpreter and dependencies serve the other code.

Usage (from the repository root)::

    .venv/bin/python bench/bench_api_memory.py                       # this checkout
    git worktree add /tmp/sf-base HEAD~1                             # the code before a change
    .venv/bin/python bench/bench_api_memory.py --source /tmp/sf-base --label before
    .venv/bin/python bench/bench_api_memory.py --quick --json out.json  # 3 × 20 MB

Goal (issue 33): under 20 concurrent 100 MB unauthenticated bodies the server stays within
50 MB of its idle RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The issue's goal: the peak stays within this much of the idle RSS.
GOAL_BYTES = 50 * 1024 * 1024
CHUNK = 1 << 20
_MB = 1024 * 1024

#: Run ``sessionfold`` from the checkout named by the first argument: the editable install's
#: finder maps each ``sessionfold.<part>`` to a folder; pointing it elsewhere before the first
#: import serves that checkout's code with this interpreter and its packages.
_LAUNCH = """
import runpy, sys
source = sys.argv.pop(1)
for name, module in list(sys.modules.items()):
    mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
    if isinstance(mapping, dict):
        for package in mapping:
            mapping[package] = source + "/" + package.rsplit(".", 1)[1]
sys.argv[0] = "sessionfold"
runpy.run_module("sessionfold.cli", run_name="__main__", alter_sys=True)
"""


# --- the server --------------------------------------------------------------------------

def _spare_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) * 1024
    return out


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass(frozen=True)
class Server:
    pid: int
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def serving(workdir: Path, source: Path | None) -> Iterator[Server]:
    """``sessionfold serve`` (from ``source`` when given) until the block ends."""
    port = _spare_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SESSIONFOLD_", "ANTHROPIC_"))
           and k not in ("REDIS_URL", "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(SESSIONFOLD_DATA_DIR=str(workdir / "data"),
               DATABASE_URL=f"sqlite:///{workdir / 'data' / 'store.db'}",
               REDIS_URL=os.environ.get("SF_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
               SESSIONFOLD_KEY_PREFIX=f"bench-mem-{uuid.uuid4().hex[:8]}:",
               SESSIONFOLD_METRICS_PORT="0", SESSIONFOLD_SUMMARIZER="offline")
    head = ([sys.executable, "-c", _LAUNCH, str(source)] if source is not None
            else [sys.executable, "-m", "sessionfold.cli"])
    log = workdir / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([*head, "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=workdir)
    server = Server(proc.pid, port)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(server.base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- the clients -------------------------------------------------------------------------

_PREFIX = b'{"messages":[{"role":"user","content":"'
_SUFFIX = b'"}]}'


@dataclass
class Answer:
    status: int | None = None
    #: Seconds from the first byte sent to the answer's status line.
    answered_s: float | None = None
    sent: int = 0
    error: str | None = None


async def _post(port: int, size: int, chunked: bool) -> Answer:
    """One unauthenticated POST of a ``size``-byte JSON body (the text is ``size`` bytes less
    the envelope); the body is written in full, then the answer read."""
    answer = Answer()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def read_status() -> None:
        line = await reader.readline()
        if line.startswith(b"HTTP/1.1 "):
            answer.status = int(line.split()[1])
            answer.answered_s = time.perf_counter() - started

    status = asyncio.create_task(read_status())
    framing = (b"Transfer-Encoding: chunked\r\n" if chunked
               else f"Content-Length: {size}\r\n".encode())
    writer.write(b"POST /v1/sessions/x/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n" + framing + b"\r\n")
    text = size - len(_PREFIX) - len(_SUFFIX)
    block = b"a" * CHUNK
    pieces = [_PREFIX] + [block] * (text // CHUNK) + [block[:text % CHUNK], _SUFFIX]
    try:
        for piece in pieces:
            if not piece:
                continue
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
            answer.sent += len(piece)
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        await asyncio.wait_for(asyncio.shield(status), timeout=120)
    except (OSError, TimeoutError) as exc:
        answer.error = type(exc).__name__
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(status), timeout=5)
    finally:
        status.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return answer


async def _flood(port: int, bodies: int, size: int, chunked: bool) -> list[Answer]:
    return list(await asyncio.gather(*(_post(port, size, chunked) for _ in range(bodies))))


# --- one run -----------------------------------------------------------------------------

@dataclass
class Run:
    label: str
    source: str
    bodies: int
    size_mb: int
    chunked: bool
    idle_rss: int = 0
    peak_rss: int = 0
    end_rss: int = 0
    hwm: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    answered_s_median: float | None = None
    #: Bytes of the bodies the clients got to send (the server may close a connection first).
    sent: int = 0

    @property
    def growth(self) -> int:
        return self.peak_rss - self.idle_rss


class _Sampler(threading.Thread):
    """Reads the server's VmRSS every 5 ms until stopped; keeps the highest."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(OSError, KeyError):
                self.peak = max(self.peak, _status(self.pid)["VmRSS"])
            self.done.wait(0.005)


def _idle_rss(pid: int, seconds: float = 2.0) -> int:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(_status(pid)["VmRSS"])
        time.sleep(0.05)
    return int(statistics.median(samples))


def measure(label: str, source: Path | None, bodies: int, size_mb: int,
            chunked: bool) -> Run:
    run = Run(label, str(source or REPO), bodies, size_mb, chunked)
    with tempfile.TemporaryDirectory(prefix="sf-bench-mem-") as tmp, \
            serving(Path(tmp), source) as server:
        # Warm-up: what a first request costs (lazy imports, first allocations) is idle cost.
        asyncio.run(_flood(server.port, 4, 64 * 1024, chunked))
        time.sleep(1.0)
        run.idle_rss = _idle_rss(server.pid)
        sampler = _Sampler(server.pid)
        sampler.start()
        started = time.perf_counter()
        answers = asyncio.run(_flood(server.port, bodies, size_mb * _MB, chunked))
        run.seconds = time.perf_counter() - started
        time.sleep(0.5)  # what the last answers leave behind is still counted
        sampler.done.set()
        sampler.join()
        final = _status(server.pid)
        run.peak_rss = max(sampler.peak, final["VmRSS"])
        run.end_rss, run.hwm = final["VmRSS"], final["VmHWM"]
    run.statuses = dict(Counter(str(a.status) if a.error is None else f"{a.status} ({a.error})"
                                for a in answers))
    run.sent = sum(a.sent for a in answers)
    times = [a.answered_s for a in answers if a.answered_s is not None]
    run.answered_s_median = statistics.median(times) if times else None
    return run


# --- the report --------------------------------------------------------------------------

def _mb(n: int) -> str:
    return f"{n / _MB:,.0f} MB"


def table(runs: list[Run]) -> str:
    lines = ["| run | bodies | framing | idle RSS | peak RSS | peak − idle | VmHWM | RSS after "
             "| answers | answer after (median) | sent | seconds |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in runs:
        answers = ", ".join(f"{n}× {s}" for s, n in sorted(r.statuses.items()))
        answered = "–" if r.answered_s_median is None else f"{r.answered_s_median:.2f} s"
        lines.append(
            f"| {r.label} | {r.bodies} × {r.size_mb} MB | "
            f"{'chunked' if r.chunked else 'Content-Length'} | {_mb(r.idle_rss)} | "
            f"{_mb(r.peak_rss)} | {_mb(r.growth)} | {_mb(r.hwm)} | {_mb(r.end_rss)} | "
            f"{answers} | {answered} | {_mb(r.sent)} | {r.seconds:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=20, help="concurrent clients (20)")
    parser.add_argument("--size-mb", type=int, default=100, help="body size in MiB (100)")
    parser.add_argument("--chunked", action="store_true",
                        help="send the bodies chunked (no Content-Length)")
    parser.add_argument("--source", type=Path, default=None,
                        help="serve the code of another checkout (a git worktree)")
    parser.add_argument("--label", default=None, help="the run's name in the table")
    parser.add_argument("--json", type=Path, default=None, help="also write the run as JSON")
    parser.add_argument("--quick", action="store_true", help="3 bodies of 20 MB (a test runs it)")
    args = parser.parse_args(argv)
    if args.quick:
        args.bodies, args.size_mb = 3, 20
    source = args.source.resolve() if args.source is not None else None
    label = args.label or ("this checkout" if source is None else source.name)
    run = measure(label, source, args.bodies, args.size_mb, args.chunked)
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; server from {run.source}\n")
    print(table([run]))
    met = run.growth <= GOAL_BYTES
    print(f"\npeak − idle {_mb(run.growth)}: goal (≤ {_mb(GOAL_BYTES)}) "
          f"{'met' if met else 'NOT met'}")
    if args.json is not None:
        args.json.write_text(json.dumps({**asdict(run), "growth": run.growth}, indent=2) + "\n",
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

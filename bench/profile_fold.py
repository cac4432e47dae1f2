"""Where a fold's CPU goes: worker CPU time per fold, and a pyinstrument profile of the folds.

Issue 14 asks for the fold's cost to be measured before anything is changed: CPU time of the
worker, not wall time (the machine is shared; a fold waiting on the disk or a lock costs no
CPU). This runs the fold procedure the Celery task runs (``runtime.fold_procedure.run_fold``) in
this process, on sessions over their trigger made from a shipped transcript, with the offline
(instant) summarizer, and reports:

- CPU seconds per fold (``time.process_time`` around each ``run_fold``; setting the sessions up
  is not counted), median and p90, and the folds per CPU-second that makes;
- a pyinstrument profile of the same folds, summed by module and by function (self time), so
  the table says which part of the fold (planning, token counting, identifier extraction, the
  store's read and commit, JSON) costs what;
- the CPU of each of the procedure's three steps (claim and read, plan, commit), and what the
  first fold did with the items it read: how many went into a summary (the summarizer read
  them), were rewritten and kept, or were left as they were. That is the bound on any plan that
  would decode only the items it changes.

Two window sizes by default: the first 40 messages of django__django-15554 (the pipeline
bench's sessions) and all 291 messages of django__django-16560 (about 300 items), each folded
unpriced (``economics="window"``: every visit folds) and priced (``economics="dollars"``, the
default policy's visit, priced as a worker prices it: a dry run of the free layers, then the
fold the cost model chose). The store is opened as a fold worker opens it (no item cache).
Medians of CPU time are noisy on a shared machine; ``bench/fold_instructions.py`` counts the
instructions of the same folds under valgrind, which does not move with the machine's load::

    .venv/bin/python bench/profile_fold.py                       # both sizes, SQLite
    .venv/bin/python bench/profile_fold.py --folds 50 --json bench/out/profile-fold.json
    .venv/bin/python bench/profile_fold.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test

Nothing here is asserted: ``tests/bench/test_profile_fold_quick.py`` runs ``--quick`` for the
invariants.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
#: (label, transcript, messages): the pipeline bench's window, and a ~300-item one.
SIZES = (("40 messages", "django__django-15554.json", 40),
         ("291 messages", "django__django-16560.json", 291))
#: The budget puts each session at this multiple of its trigger's budget: every visit folds.
OVER = 2.0


@dataclass(frozen=True)
class SizeResult:
    label: str
    items: int
    tokens_before: int
    folds: int
    folded: int
    cpu_median_ms: float
    cpu_p90_ms: float
    wall_median_ms: float
    #: The summarizer's own CPU in each fold (median), and the fold's CPU without it.
    summarizer_median_ms: float
    without_summarizer_median_ms: float
    by_module: list[tuple[str, float]]
    by_function: list[tuple[str, float]]
    #: Median CPU ms of each step of the timed folds (:data:`STEPS`), and the median share of a
    #: fold's CPU the three take together (the rest: the procedure's own glue).
    steps_median_ms: dict[str, float] = field(default_factory=dict)
    steps_share: float = 0.0
    #: What the first timed fold did with the window's items (:func:`touched`).
    touched: dict[str, int] = field(default_factory=dict)

    @property
    def folds_per_cpu_s(self) -> float:
        return 1000.0 / self.cpu_median_ms if self.cpu_median_ms else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "items": self.items, "tokens_before": self.tokens_before,
                "folds": self.folds, "folded": self.folded,
                "cpu_median_ms": self.cpu_median_ms, "cpu_p90_ms": self.cpu_p90_ms,
                "wall_median_ms": self.wall_median_ms, "folds_per_cpu_s": self.folds_per_cpu_s,
                "summarizer_median_ms": self.summarizer_median_ms,
                "without_summarizer_median_ms": self.without_summarizer_median_ms,
                "by_module": self.by_module, "by_function": self.by_function,
                "steps_median_ms": self.steps_median_ms, "steps_share": self.steps_share,
                "touched": self.touched}


class _Timed:
    """The offline summarizer, with the CPU time of its calls counted (``spent``).

    It stands in for a summarizer that answers at once: an API summarizer's worker waits on the
    network and spends next to no CPU of its own, so the table gives the fold's CPU with and
    without what this one computes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model = inner.model
        self.context_tokens = inner.context_tokens
        self.spent = 0.0

    def summarize(self, messages: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return self.inner.summarize(messages, **kwargs)
        finally:
            self.spent += time.process_time() - start


def _sessions(store: Any, messages: list[Any], system: str, n: int,
              economics: str = "window") -> tuple[list[str], Any]:
    from sessionfold.core.policy import FoldPolicy

    probe = f"probe-{uuid.uuid4().hex[:6]}"
    store.create_session(probe, FoldPolicy(budget_tokens=1_000_000), system)
    store.append(probe, messages)
    estimate = store.get_session(probe).current_tokens
    store.delete_session(probe)
    # economics="window" (the default): the fold always happens (this measures what a fold
    # costs, not whether one pays). "dollars": the visit is priced first, as a worker prices a
    # default policy's visits (at twice the budget every priced visit here folds).
    policy = FoldPolicy(budget_tokens=max(1000, int(estimate / OVER)),
                        economics=economics)  # type: ignore[arg-type]
    ids = []
    for i in range(n):
        sid = f"pf-{i:05d}"
        store.create_session(sid, policy, system)
        store.append(sid, messages)
        ids.append(sid)
    return ids, estimate


def _profile_tables(session: Any, repo: Path) -> tuple[list[tuple[str, float]],
                                                        list[tuple[str, float]]]:
    """Self time of the profiled frames, summed by module and by function (seconds)."""
    by_module: dict[str, float] = defaultdict(float)
    by_function: dict[str, float] = defaultdict(float)
    root = session.root_frame()
    stack = [root] if root is not None else []
    while stack:
        frame = stack.pop()
        stack.extend(frame.children)
        if _synthetic(frame):
            continue  # pyinstrument's [self] / [await] frames: counted in their parent below
        exclusive = frame.time - sum(c.time for c in frame.children if not _synthetic(c))
        if exclusive <= 0:
            continue
        module = _module_name(frame.file_path or "?", repo)
        by_module[module] += exclusive
        by_function[f"{module}:{frame.function}"] += exclusive
    top = sorted(by_module.items(), key=lambda kv: -kv[1])[:15]
    topf = sorted(by_function.items(), key=lambda kv: -kv[1])[:15]
    return [(k, round(v, 4)) for k, v in top], [(k, round(v, 4)) for k, v in topf]


def _synthetic(frame: Any) -> bool:
    return str(frame.function).startswith("[")


def _module_name(path: str, repo: Path) -> str:
    """``sessionfold.core.retention`` for the project's files, the distribution's top-level name
    for an installed package's, ``<built-in>`` for C code."""
    if path.startswith("<"):
        return path
    parts = Path(path).parts
    if "site-packages" in parts:
        rest = parts[parts.index("site-packages") + 1:]
        return rest[0].removesuffix(".py") if rest else path
    try:
        rel = Path(path).resolve().relative_to(repo)
    except ValueError:
        return Path(path).stem
    return "sessionfold." + ".".join(rel.with_suffix("").parts)


@dataclass(frozen=True)
class Folding:
    """Sessions ready to fold (:func:`folding_sessions`)."""

    store: Any
    ids: list[str]
    items: int  # messages each session holds
    tokens_before: int  # each session's estimated tokens


@contextmanager
def folding_sessions(url: str, transcript: str, n_messages: int, count: int, summarizer: Any,
                     *, economics: str = "window", pricing: Any = None,
                     settle: bool = True) -> Iterator[Folding]:
    """The store at ``url`` opened as a fold worker opens it (no decoded items kept), and
    ``count`` sessions over their trigger, each the first ``n_messages`` of ``transcript``.
    One more session is folded first, untimed
    (imports, caches and the SQLite page cache warm up), and with ``settle`` the collector is
    then settled as a worker child settles it. The store is closed on the way out."""
    from sessionfold.cli.files import load_conversation_file
    from sessionfold.runtime.collector import freeze_startup_objects
    from sessionfold.runtime.fold_procedure import FoldJob, run_fold
    from sessionfold.store import SessionStore
    from sessionfold.workers.runtime import FOLD_WORKER_ITEM_CACHE

    conv = load_conversation_file(TRANSCRIPTS / transcript)
    messages = conv.messages[:n_messages]
    store = SessionStore.from_url(url, item_cache=FOLD_WORKER_ITEM_CACHE)
    try:
        store.migrate()
        ids, estimate = _sessions(store, messages, conv.system, 1 + count, economics)
        run_fold(store, summarizer, FoldJob(session_id=ids[0], job_id="warm"), pricing=pricing)
        if settle:
            freeze_startup_objects()
        yield Folding(store, ids[1:], len(messages), estimate)
    finally:
        store.close()


#: The fold procedure's three steps, as ``runtime.fold_procedure`` names them: the claim and the
#: read (``store.begin_fold``), the plan (``core.compact.fold_window``, the summarizer inside)
#: and the commit (``store.finish_fold``).
STEPS = ("begin", "plan", "finish")


class _Steps:
    """CPU time of each step of the folds run while it is on (:meth:`timing`), fold by fold;
    and the first plan's window and result, for :func:`touched`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = dict.fromkeys(STEPS, 0.0)
        self.first_plan: tuple[Any, Any] | None = None  # (items, FoldResult)

    def take(self) -> dict[str, float]:
        """The CPU seconds of each step since the last take."""
        spent, self.spent = self.spent, dict.fromkeys(STEPS, 0.0)
        return spent

    def _timed(self, step: str, call: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                result = call(*args, **kwargs)
            finally:
                self.spent[step] += time.process_time() - start
            if step == "plan" and self.first_plan is None:
                self.first_plan = (args[0], result)
            return result
        return timed

    @contextmanager
    def timing(self, store: Any) -> Iterator[_Steps]:
        """Count the steps of the folds run on ``store`` inside the block (its two methods and
        the procedure's planner wrapped, and put back on the way out)."""
        from sessionfold.runtime import fold_procedure

        plan = fold_procedure.fold_window
        fold_procedure.fold_window = self._timed("plan", plan)
        store.begin_fold = self._timed("begin", store.begin_fold)
        store.finish_fold = self._timed("finish", store.finish_fold)
        try:
            yield self
        finally:
            fold_procedure.fold_window = plan
            del store.begin_fold, store.finish_fold  # the class's methods again


def touched(items: list[Any], result: Any) -> dict[str, int]:
    """What one fold did with the items it read: how many went into a summary or notice (the
    summarizer read them), were rewritten and kept (masked, thinned, clipped), or were left as
    they were; and how many carried tool output, in all and inside the folded spans (the mask
    layer, which runs first, stubs those before the summarizer reads them)."""
    spans = [(s.start_seq, s.end_seq) for s in result.spans]

    folded = [i for i in items
              if any(lo <= i.start_seq and i.end_seq <= hi for lo, hi in spans)]
    rewritten = sum(1 for i in result.edit.inserted if i.kind not in ("summary", "notice"))
    return {"read": len(items), "into_spans": len(folded), "rewritten_kept": rewritten,
            "untouched": len(items) - len(folded) - rewritten,
            "tool_outputs": sum(1 for i in items if i.message.has_tool_results()),
            "tool_outputs_in_spans": sum(1 for i in folded if i.message.has_tool_results())}


def measure(url: str, label: str, transcript: str, n_messages: int, folds: int,
            profile: bool, settle: bool = True, economics: str = "window") -> SizeResult:
    from sessionfold.core.summarizers import ExtractiveSummarizer
    from sessionfold.runtime.fold_procedure import FoldJob, run_fold

    summarizer = _Timed(ExtractiveSummarizer())
    pricing = None
    if economics == "dollars":  # what a worker prices a default policy's visits with
        from sessionfold.runtime.prices import fold_pricing
        from sessionfold.runtime.settings import Settings

        pricing = fold_pricing(Settings(summarizer="offline", anthropic_api_key=None))
    # Timed folds run unprofiled; the profile is taken over as many other sessions.
    n_profiled = folds if profile else 0
    with folding_sessions(url, transcript, n_messages, folds + n_profiled, summarizer,
                          economics=economics, pricing=pricing,
                          settle=settle) as ready:
        store = ready.store
        timed, profiled = ready.ids[:folds], ready.ids[folds:]
        cpu: list[float] = []
        wall: list[float] = []
        own: list[float] = []  # the summarizer's share of each fold's CPU
        steps: list[dict[str, float]] = []
        folded = 0
        with _Steps().timing(store) as timer:
            for i, sid in enumerate(timed):
                summarizer.spent = 0.0
                c0, w0 = time.process_time(), time.perf_counter()
                report = run_fold(store, summarizer,
                                  FoldJob(session_id=sid, job_id=f"job-{i}"), pricing=pricing)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
                own.append(summarizer.spent)
                steps.append(timer.take())
                folded += report.outcome == "folded"
        by_module: list[tuple[str, float]] = []
        by_function: list[tuple[str, float]] = []
        if profiled:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
            for i, sid in enumerate(profiled):
                run_fold(store, summarizer, FoldJob(session_id=sid, job_id=f"prof-{i}"),
                         pricing=pricing)
            profiler.stop()
            by_module, by_function = _profile_tables(profiler.last_session, REPO)
        cpu_ms = sorted(c * 1000 for c in cpu)
        return SizeResult(
            label=label, items=ready.items, tokens_before=ready.tokens_before, folds=len(cpu),
            folded=folded, cpu_median_ms=round(statistics.median(cpu_ms), 2),
            cpu_p90_ms=round(cpu_ms[int(0.9 * (len(cpu_ms) - 1))], 2),
            wall_median_ms=round(statistics.median(wall) * 1000, 2),
            summarizer_median_ms=round(statistics.median(own) * 1000, 2),
            without_summarizer_median_ms=round(
                statistics.median((c - o) * 1000 for c, o in zip(cpu, own, strict=True)), 2),
            by_module=by_module, by_function=by_function,
            steps_median_ms={step: round(statistics.median(s[step] for s in steps) * 1000, 2)
                             for step in STEPS},
            steps_share=round(statistics.median(
                sum(s.values()) / c if c > 0 else 0.0 for s, c in zip(steps, cpu, strict=True)),
                3),
            touched=touched(*timer.first_plan) if timer.first_plan is not None else {})


def markdown(results: list[SizeResult], args: argparse.Namespace, backend: str) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = [f"Command: `.venv/bin/python bench/profile_fold.py --folds {args.folds}"
           f"{' --postgres …' if args.postgres else ''}"
           f"{' --gc default' if args.gc == 'default' else ''}"
           f"{'' if args.economics == 'both' else f' --economics {args.economics}'}"
           f"{' --no-profile' if args.no_profile else ''}`. Run "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine "
           f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
           f"store {backend}; collector {args.gc}; load average {load:.1f} at the end (CPU time, "
           "not wall time, is what the table reports).", "",
           "| window | tokens before | folds | folded | CPU ms/fold (median) | p90 | wall ms "
           "(median) | folds per CPU-second | of which the offline summarizer (median) | "
           "CPU ms/fold without it (median) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        out.append(f"| {r.label} | {r.tokens_before:,} | {r.folds} | {r.folded} | "
                   f"**{r.cpu_median_ms:.1f}** | {r.cpu_p90_ms:.1f} | {r.wall_median_ms:.1f} | "
                   f"{r.folds_per_cpu_s:.1f} | {r.summarizer_median_ms:.1f} | "
                   f"**{r.without_summarizer_median_ms:.1f}** |")
    out += ["", "The fold's steps (median CPU ms of each over the timed folds; the three "
                "together take the share given of a fold's CPU, the procedure's own glue the "
                "rest), and what the first timed fold did with the items it read:", "",
            "| window | claim and read | plan (summarizer inside) | commit | share | items "
            "read | into summaries | rewritten, kept | untouched | with tool output | of "
            "which into summaries |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r.touched
        step = r.steps_median_ms
        out.append(f"| {r.label} | {step['begin']:.1f} | {step['plan']:.1f} | "
                   f"{step['finish']:.1f} | {r.steps_share:.0%} | "
                   f"{t.get('read', 0)} | {t.get('into_spans', 0)} | "
                   f"{t.get('rewritten_kept', 0)} | {t.get('untouched', 0)} | "
                   f"{t.get('tool_outputs', 0)} | {t.get('tool_outputs_in_spans', 0)} |")
    for r in results:
        if not r.by_module:
            continue
        total = sum(s for _, s in r.by_module) or 1.0
        out += ["", f"Where the CPU of the {r.label} folds went (pyinstrument, self time, top "
                    "modules):", "", "| module | seconds | share |", "|---|---:|---:|"]
        out += [f"| `{m}` | {s:.3f} | {s / total:.0%} |" for m, s in r.by_module[:10]]
        out += ["", "Top functions:", "", "| function | seconds |", "|---|---:|"]
        out += [f"| `{f}` | {s:.3f} |" for f, s in r.by_function[:10]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folds", type=int, default=40, help="timed folds per size")
    parser.add_argument("--postgres", metavar="URL",
                        help="a PostgreSQL server to run on (a scratch database of the run's "
                             "own is made there and dropped)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="5 folds of the 40-message size")
    parser.add_argument("--gc", choices=("settled", "default"), default="settled",
                        help="settled (default): the collector as a worker child sets it "
                             "(runtime.collector.freeze_startup_objects) before the folds; "
                             "default: Python's own settings")
    parser.add_argument("--economics", choices=("window", "dollars", "both"), default="both",
                        help="window: every visit folds unpriced; dollars: visits priced as "
                             "a worker prices a default policy's (economics=\"dollars\"); "
                             "both (default): each size both ways (--quick: window only)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.folds < 1:
        parser.error("--folds must be at least 1")

    sizes = SIZES[:1] if args.quick else SIZES
    kinds = (["window"] if args.quick else ["window", "dollars"] if args.economics == "both"
             else [args.economics])
    if args.quick:
        args.folds = 5
    results = []
    with tempfile.TemporaryDirectory(prefix="sf-profile-fold-") as tmp:
        for (label, transcript, n), economics in itertools.product(sizes, kinds):
            if economics == "dollars":
                label = f"{label}, priced"
            scratch = None
            if args.postgres:  # a database of the run's own, dropped at the end
                from bench_pipeline import _Database

                scratch = _Database(args.postgres)
            url = scratch.url if scratch else f"sqlite:///{Path(tmp) / f'{n}-{economics}.db'}"
            try:
                results.append(measure(url, label, transcript, n, args.folds,
                                       profile=not args.no_profile,
                                       settle=args.gc == "settled", economics=economics))
            finally:
                if scratch is not None:
                    scratch.drop()
    text = markdown(results, args, "PostgreSQL" if args.postgres else "SQLite")
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        run = time.strftime("%Y-%m-%d", time.gmtime())
        args.json.write_text(json.dumps([
            {**r.to_json(), "collector": args.gc, "run": run,
             "economics": "dollars" if r.label.endswith(", priced") else "window"}
            for r in results], indent=2) + "\n", encoding="utf-8")
    return 0 if all(r.folded == r.folds for r in results) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "bench"))
    raise SystemExit(main())

"""``run_demo``: start the stack, run the fleet through it, wait for the last folds, report.

Top to bottom:

1. Start the pipeline (:class:`~sessionfold.cli.stack.Stack`): Redis (embedded unless
   ``REDIS_URL``), the store (SQLite unless ``DATABASE_URL``), two Celery workers, the
   scheduler, Flower and the metrics endpoint; wait until the workers answer and Flower serves.
2. Create one session per agent (``demo-<run id>-<agent>``, so a second run never meets the
   first one's state in Redis or the store) and run every agent on its own thread through the
   client, with its own scripted provider; the main thread watches the stack, counts folds in
   the store and refreshes the live view.
3. Wait until no fold is pending (:func:`~sessionfold.cli.replay.wait_settled`), read the
   records and ledgers, draw the chart, write ``sessionfold-demo.json``, print the report (before
   the stack stops, so ``keep_running`` can leave Flower up under it) and return it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from sessionfold.client import Client, connect
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings, redact_url

from ..replay import wait_settled
from ..stack import Stack, StackOptions
from ..standin.fakeprovider import FakeProvider
from .agents import AgentScript, generated_fleet, transcript_fleet
from .chart import CHART_NAME, ChartUnavailableError, write_chart
from .fleet import AgentRun, drive
from .live import Dashboard, progress_line
from .report import DemoReport, agent_report, render_report, write_json

__all__ = ["REPORT_NAME", "DemoOptions", "describe_summarizer", "run_demo"]

REPORT_NAME = "sessionfold-demo.json"
#: How often the main thread counts folds in the store while the agents run.
_POLL_S = 2.0


@dataclass(frozen=True)
class DemoOptions:
    """What ``sessionfold demo`` runs. ``agents=None``: 12 generated agents, or every file."""

    agents: int | None = None
    turns: int = 150
    out: Path = Path(".")
    transcripts: Path | None = None
    budget: int = 24_000
    context_window: int = 200_000
    #: Seconds per scripted model call: a real call takes seconds; the demo runs time-scaled.
    model_latency_s: float = 0.05
    seed: int = 7
    workers: int = 2
    settle_timeout_s: float = 180.0
    keep_running: bool = False

    def __post_init__(self) -> None:
        if self.budget < 1000:
            raise InvalidInputError(f"--budget must be at least 1000 tokens, got {self.budget}")
        if self.context_window < self.budget:
            raise InvalidInputError(
                f"--context-window ({self.context_window}) must not be below the budget "
                f"({self.budget})")
        if self.model_latency_s < 0:
            raise InvalidInputError("--model-latency must not be negative")
        if self.workers < 1:
            raise InvalidInputError(f"--workers must be at least 1, got {self.workers}")

    def fleet(self) -> list[AgentScript]:
        if self.transcripts is not None:
            return transcript_fleet(self.transcripts, self.agents)
        return generated_fleet(12 if self.agents is None else self.agents, self.turns,
                               seed=self.seed)


def describe_summarizer(settings: Settings) -> str:
    """Which summarizer the workers use, in words, and why."""
    if settings.summarizer_kind == "anthropic":
        return (f"{settings.summarizer_model} through the Anthropic API "
                "(ANTHROPIC_API_KEY is set)")
    if settings.summarizer_kind == "openai":
        where = redact_url(settings.openai_base_url) or "OpenAI's API"
        return (f"{settings.summarizer_model} through the chat completions of {where} "
                "(SESSIONFOLD_SUMMARIZER=openai)")
    why = ("SESSIONFOLD_SUMMARIZER=offline" if settings.anthropic_api_key is not None
           else "ANTHROPIC_API_KEY is not set")
    return (f"the offline extractive summarizer ({why}; with a key the workers call "
            f"{settings.summarizer_model})")


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> DemoReport:
    """Run the demo (see the module doc) and return its report; ``console`` shows progress."""
    scripts = options.fleet()
    run_id = uuid.uuid4().hex[:6]
    summarizer = describe_summarizer(settings)
    stack_options = StackOptions(workers=options.workers, worker_concurrency=1,
                                 log_dir=settings.data_dir / "logs" / f"demo-{run_id}",
                                 worker_name=f"demo-{run_id}-worker")
    with Stack(settings, stack_options) as stack:
        with console.status("starting Redis, the store, 2 workers, the scheduler, Flower..."):
            stack.wait_ready()
        header = _where(stack, summarizer)
        console.print("\n".join(header), style="cyan", highlight=False)
        with connect(stack.settings) as client:
            runs = _create_sessions(client, scripts, run_id, options)
            started = time.monotonic()
            _run_fleet(client, stack, runs, options, console, header)
            run_s = time.monotonic() - started
            with console.status("waiting for the last folds to land..."):
                settled = wait_settled(client, [r.session_id for r in runs],
                                       timeout_s=options.settle_timeout_s)
            settle_s = time.monotonic() - started - run_s
            report = DemoReport(
                agents=[agent_report(client.store, r, context_window=options.context_window)
                        for r in runs],
                summarizer=summarizer, summarizer_kind=settings.summarizer_kind,
                budget_tokens=options.budget, context_window=options.context_window,
                model_latency_s=options.model_latency_s, run_s=run_s, settle_s=settle_s,
                settled=settled, flower_url=stack.flower_url, metrics_url=stack.metrics_url)
        _write_outputs(report, runs, options)
        console.print(render_report(report))
        if options.keep_running:
            _linger(stack, console)
    return report


def _where(stack: Stack, summarizer: str) -> list[str]:
    redis = "embedded Redis" if stack.embedded_redis else "Redis at REDIS_URL"
    return [
        f"Flower (fold jobs):   {stack.flower_url}/tasks"
        + (f"  ({stack.flower_login.describe()})" if stack.flower_login else ""),
        f"metrics (Prometheus): {stack.metrics_url or 'off'}",
        f"pipeline: {redis}, store {_store_name(stack.database_url)}, "
        f"workers {', '.join(stack.worker_names)}, scheduler; logs in {stack.options.log_dir}",
        f"summarizer: {summarizer}",
    ]


def _store_name(url: str) -> str:
    if url.startswith("sqlite") and "///" in url:
        return url.split("///", 1)[1]
    return "at DATABASE_URL"


def _create_sessions(client: Client, scripts: Sequence[AgentScript], run_id: str,
                     options: DemoOptions) -> list[AgentRun]:
    policy = FoldPolicy(budget_tokens=options.budget)
    runs = []
    for script in scripts:
        sid = f"demo-{run_id}-{script.name}"
        client.store.create_session(sid, policy, script.conversation.system)
        runs.append(AgentRun(script=script, session_id=sid))
    return runs


def _run_fleet(client: Client, stack: Stack, runs: list[AgentRun], options: DemoOptions,
               console: Console, header: list[str]) -> None:
    """Every agent on its own thread; the caller's thread supervises until all are done."""
    stop = threading.Event()

    def agent(run: AgentRun) -> None:
        provider = FakeProvider(context_window=options.context_window,
                                latency_s=options.model_latency_s)
        drive(client.session(run.session_id), run, provider, stop)

    live = Live(Dashboard(runs, header), console=console, refresh_per_second=2) \
        if console.is_terminal else nullcontext()
    say: Callable[[str], None] = (lambda line: None) if console.is_terminal else \
        (lambda line: console.print(line, highlight=False))
    with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="demo-agent") as pool:
        futures = [pool.submit(agent, run) for run in runs]
        try:
            with live:
                _supervise(client, stack, runs, futures, say)
        finally:
            stop.set()  # on Ctrl-C or a dead child: agents end after their current call


def _supervise(client: Client, stack: Stack, runs: list[AgentRun],
               futures: list[Future[None]], say: Callable[[str], None]) -> None:
    next_line = time.monotonic() + 10
    while True:
        finished, _ = wait(futures, timeout=_POLL_S)
        stack.check()  # a worker or the scheduler died: stop, rather than wait for folds
        for run in runs:
            records = client.store.records(run.session_id)
            run.folds_seen = sum(r.outcome == "folded" for r in records)
        if len(finished) == len(futures):
            for future in futures:
                future.result()  # drive() keeps agent errors; anything else is a bug: raise it
            return
        if time.monotonic() >= next_line:
            say(progress_line(runs))
            next_line = time.monotonic() + 10


def _write_outputs(report: DemoReport, runs: list[AgentRun], options: DemoOptions) -> None:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        chart = write_chart(out / CHART_NAME, runs, [a.fold_turns for a in report.agents],
                            budget_tokens=options.budget,
                            trigger_tokens=FoldPolicy(budget_tokens=options.budget).trigger_tokens)
        report.chart_path = str(chart.resolve())
    except ChartUnavailableError as exc:
        report.notes.append(f"chart: {exc}")
    report_path = (out / REPORT_NAME).resolve()
    report.notes.append(f"report as JSON: {report_path}")
    write_json(report, report_path)


def _linger(stack: Stack, console: Console) -> None:
    console.print(f"the pipeline keeps running: Flower at {stack.flower_url}/tasks "
                  "(Ctrl-C stops it)", style="cyan")
    try:
        while True:
            stack.check()
            time.sleep(1.0)
    except KeyboardInterrupt:
        return

"""The pipeline's commands: run its processes, replay sessions, and operate sessions.

::

    sessionfold up                      # everything, on the embedded defaults, in one terminal
    sessionfold worker [--concurrency N] [--pool prefork|solo|threads]
    sessionfold scheduler
    sessionfold flower
    sessionfold replay FILE... [--budget N] [--concurrency C] [--prefix P] [--context-window W]
    sessionfold fold SESSION [--wait S]  # enqueue a fold now (trigger "manual")
    sessionfold pause SESSION | resume SESSION | delete SESSION

Settings come from the environment here, at the entry point (:class:`Settings`): ``REDIS_URL``
and ``DATABASE_URL`` name the services; without them the embedded Redis server of the data dir
and the SQLite store. ``worker``, ``scheduler`` and ``flower`` attach to an embedded server that
``up`` (or another process) started, and start one of their own otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessionfold.runtime.settings import Settings

    from ..stack import Stack

__all__ = ["register"]

log = logging.getLogger(__name__)

_POOLS = ("prefork", "solo", "threads")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the pipeline's subcommands."""
    up = subparsers.add_parser(
        "up", help="run Redis, the store, a scheduler, a worker, Flower and metrics at once",
        description="Run the whole pipeline in the foreground on the embedded defaults (or on "
                    "REDIS_URL / DATABASE_URL when set): the store is migrated, the scheduler "
                    "runs here, one worker and Flower run as child processes. Prints where each "
                    "listens. Ctrl-C stops everything.")
    up.add_argument("--concurrency", type=int, default=None, metavar="N",
                    help="worker processes (default SESSIONFOLD_WORKER_CONCURRENCY)")
    up.add_argument("--no-flower", action="store_true", help="do not start Flower")
    up.set_defaults(handler=_up)

    worker = subparsers.add_parser(
        "worker", help="run a Celery worker that folds sessions",
        description="Run a Celery worker consuming fold jobs.")
    worker.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="processes or threads (default SESSIONFOLD_WORKER_CONCURRENCY)")
    worker.add_argument("--pool", choices=_POOLS, default="prefork",
                        help="Celery execution pool (default prefork)")
    worker.add_argument("--hostname", default=None, help="the worker's node name")
    worker.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")
    worker.set_defaults(handler=_worker)

    scheduler = subparsers.add_parser(
        "scheduler", help="run the scheduler (usage bus → fold jobs)",
        description="Read the usage bus and enqueue fold jobs for sessions over their trigger; "
                    "sweep the store for sessions whose events Redis lost. SIGTERM stops it "
                    "after the current batch.")
    scheduler.set_defaults(handler=_scheduler)

    flower = subparsers.add_parser(
        "flower", help="run Flower, the Celery monitor, on the pipeline's broker",
        description="Run Flower on the broker, behind basic auth: "
                    "SESSIONFOLD_FLOWER_BASIC_AUTH, or a login made now and printed (kept in "
                    "<data dir>/flower-login), which is refused (exit 2) unless "
                    "SESSIONFOLD_FLOWER_HOST is a loopback address.")
    flower.set_defaults(handler=_flower)

    rep = subparsers.add_parser(
        "replay", help="replay session files as standing agents through the pipeline",
        description="Replay each FILE as one agent session (named PREFIX + the file's stem) "
                    "through the client, with a scripted model that counts tokens its own way "
                    "and rejects requests over --context-window; wait for pending folds; print "
                    "a table per session. Needs a running pipeline (sessionfold up).")
    rep.add_argument("files", nargs="+", metavar="FILE", help="session files (JSON)")
    rep.add_argument("--budget", type=int, default=16_000, metavar="N",
                     help="token budget of every session (default 16000)")
    rep.add_argument("--concurrency", type=int, default=4, metavar="C",
                     help="agents running at once (default 4)")
    rep.add_argument("--prefix", default="replay-", metavar="P",
                     help="session id prefix (default 'replay-')")
    rep.add_argument("--context-window", type=int, default=200_000, metavar="W",
                     help="the scripted model's context window (default 200000)")
    rep.add_argument("--model-latency", type=float, default=0.0, metavar="S",
                     help="seconds per scripted model call (default 0)")
    rep.add_argument("--replace", action="store_true",
                     help="delete sessions of the same names first")
    rep.add_argument("--wait-timeout", type=float, default=300.0, metavar="S",
                     help="how long to wait for pending folds at the end (default 300)")
    rep.set_defaults(handler=_replay)

    fold = subparsers.add_parser(
        "fold", help="enqueue a fold of SESSION now (trigger manual)",
        description="Enqueue one fold job for SESSION with trigger 'manual'; prints its job id.")
    fold.add_argument("session", metavar="SESSION")
    fold.add_argument("--wait", type=float, default=None, metavar="S",
                      help="wait up to S seconds for the job and print its result")
    fold.set_defaults(handler=_fold)

    for name, text in (("pause", "stop background folds of SESSION until resumed"),
                       ("resume", "let background folds of SESSION run again"),
                       ("delete", "delete SESSION with everything it holds")):
        p = subparsers.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("session", metavar="SESSION")
        p.set_defaults(handler=_session_command, action=name)


# --- shared pieces ---------------------------------------------------------------------------

def _settings(command: str) -> Settings:
    """The settings, from the environment; says where embedded data lives (one INFO line)."""
    from sessionfold.runtime.settings import Settings

    settings = Settings()
    embedded_data = settings.embedded_data()
    if embedded_data is not None:
        log.info("sessionfold %s: %s", command, embedded_data)
    return settings


def _check_count(name: str, value: int | None) -> None:
    from sessionfold.core.errors import InvalidInputError

    if value is not None and value < 1:
        raise InvalidInputError(f"{name} must be at least 1, got {value}")


# --- worker ----------------------------------------------------------------------------------

def _worker(args: argparse.Namespace) -> int:
    from sessionfold.runtime.exporter import start_host_metrics
    from sessionfold.runtime.keys import FOLD_QUEUE
    from sessionfold.runtime.wiring import open_store, redis_url_for
    from sessionfold.workers.celery_app import make_celery

    _check_count("--concurrency", args.concurrency)
    settings = _settings("worker")
    with redis_url_for(settings) as url:
        open_store(settings).close()  # migrated/checked in the parent; children open their own
        # Before the pool forks: its children count into the host's metrics directory too.
        exporter = start_host_metrics(settings, "worker")
        app = make_celery(settings, redis_url=url)
        argv = ["worker", f"--concurrency={args.concurrency or settings.worker_concurrency}",
                f"--pool={args.pool}", f"--loglevel={args.loglevel}", f"--queues={FOLD_QUEUE}",
                # Mingle syncs revoked ids between workers at start; fold jobs are never revoked.
                "--task-events", "--without-mingle"]
        if args.hostname:
            argv.append(f"--hostname={args.hostname}")
        try:
            app.worker_main(argv)
        finally:
            if exporter is not None:
                exporter.close()
    return 0


# --- scheduler -------------------------------------------------------------------------------

def _scheduler(args: argparse.Namespace) -> int:
    from sessionfold.runtime.collector import freeze_startup_objects
    from sessionfold.runtime.exporter import start_host_metrics
    from sessionfold.runtime.keys import Keys
    from sessionfold.runtime.redis_conn import redis_client
    from sessionfold.runtime.settings import redact_url
    from sessionfold.runtime.wiring import open_store, redis_url_for
    from sessionfold.workers.celery_app import make_celery, make_collect, make_enqueue
    from sessionfold.workers.scheduler import Scheduler, install_signal_handlers

    settings = _settings("scheduler")
    stop = threading.Event()
    install_signal_handlers(stop)
    with redis_url_for(settings) as url:
        store = open_store(settings)
        exporter = start_host_metrics(settings, "scheduler")
        client = redis_client(url)
        try:
            app = make_celery(settings, redis_url=url)
            scheduler = Scheduler(settings, store, client, make_enqueue(app),
                                  collect=make_collect(app))
            print(f"sessionfold scheduler: reading the usage streams of "
                  f"{Keys.from_settings(settings).partitions} partitions on {redact_url(url)}",
                  flush=True)
            freeze_startup_objects()  # set-up is done: the collector need not walk it again
            scheduler.run_forever(stop)
        finally:
            client.close()
            store.close()
            if exporter is not None:
                exporter.close()
    return 0


# --- flower ----------------------------------------------------------------------------------

def _flower(args: argparse.Namespace) -> int:
    from sessionfold.runtime.wiring import redis_url_for
    from sessionfold.workers.celery_app import make_celery

    from ..stack import FLOWER_TASKS_COLUMNS, check_flower_exposure, flower_login

    settings = _settings("flower")
    check_flower_exposure(settings)  # before the broker starts: exit 2 with the reason
    # Never FLOWER_UNAUTHENTICATED_API: Flower's API lists and enqueues tasks, and any web page
    # could post to it from the developer's browser. `up` passes the login it made.
    settings, login = flower_login(settings)
    assert settings.flower_basic_auth is not None
    with redis_url_for(settings) as url:
        app = make_celery(settings, redis_url=url)
        argv = ["flower", f"--port={settings.flower_port}", f"--address={settings.flower_host}",
                f"--basic-auth={settings.flower_basic_auth.get_secret_value()}"]
        # The task list shows the arguments (the session id) and the result (the outcome).
        os.environ.setdefault("FLOWER_TASKS_COLUMNS", FLOWER_TASKS_COLUMNS)
        print(f"sessionfold flower: http://{settings.flower_host}:{settings.flower_port} "
              f"({login.describe()})", flush=True)
        code = app.start(argv)
    return int(code or 0)


# --- up --------------------------------------------------------------------------------------

def _up(args: argparse.Namespace) -> int:
    from ..stack import Stack, StackOptions

    _check_count("--concurrency", args.concurrency)
    settings = _settings("up")
    options = StackOptions(workers=1, worker_concurrency=args.concurrency,
                           flower=not args.no_flower, worker_loglevel="INFO")
    stop = threading.Event()
    # SIGINT too, explicitly: a process started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then raises no KeyboardInterrupt (Ctrl-C, or a
    # supervisor's SIGINT, would be lost).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    print("sessionfold up: starting Redis, the store, a scheduler, a worker"
          + ("" if args.no_flower else ", Flower") + " and metrics", flush=True)
    with Stack(settings, options) as stack:
        stack.wait_ready()
        _print_up(stack, settings)
        while not stop.wait(0.5):  # Ctrl-C and SIGTERM set it; leaving stops the children
            stack.check()  # a child that died stops everything, with the reason
    print("sessionfold up: stopped", flush=True)
    return 0


def _print_up(stack: Stack, given: Settings) -> None:
    from sessionfold.runtime.keys import FOLD_QUEUE, Keys
    from sessionfold.runtime.settings import redact_url

    settings = stack.settings
    pids = stack.children
    concurrency = stack.options.worker_concurrency or settings.worker_concurrency
    store = "  (migrated)" if stack.database_url.startswith("sqlite") else ""
    lines = [
        "sessionfold up: the pipeline is running (Ctrl-C stops it)",
        f"  redis      {redact_url(stack.redis_url)}"
        + ("  (embedded)" if stack.embedded_redis else ""),
        f"  store      {redact_url(stack.database_url)}{store}",
        f"  scheduler  pid {pids['scheduler']}, reading "
        f"the usage streams of {Keys.from_settings(settings).partitions} partitions",
        f"  worker     pid {pids['worker-1']}, {concurrency} processes, queue {FOLD_QUEUE}",
    ]
    if stack.flower_url is not None and stack.flower_login is not None:
        lines.append(f"  flower     {stack.flower_url}  (pid {pids['flower']}, "
                     f"{stack.flower_login.describe()})")
    lines.append(f"  metrics    {stack.metrics_url}" if stack.metrics_url else "  metrics    off")
    if given.metrics_port and settings.metrics_port != given.metrics_port:
        lines.append(f"  (port {given.metrics_port} was taken; metrics moved to "
                     f"{settings.metrics_port})")
    print("\n".join(lines), flush=True)


# --- replay ----------------------------------------------------------------------------------

def _replay(args: argparse.Namespace) -> int:
    from sessionfold.client import connect
    from sessionfold.runtime.settings import Settings
    from sessionfold.runtime.wiring import redis_url_for

    from ..replay import ReplayOptions, format_table, load_files, replay

    options = ReplayOptions(budget=args.budget, concurrency=args.concurrency,
                            prefix=args.prefix, context_window=args.context_window,
                            model_latency_s=args.model_latency, replace=args.replace,
                            wait_timeout_s=args.wait_timeout)
    settings = Settings()
    loaded = load_files(args.files)  # every file checked before the pipeline is asked for
    with redis_url_for(settings, running_only=True), connect(settings) as client:
        if not _workers_answer(settings, client.redis_url):
            print("sessionfold replay: no worker answered; folds will wait for one",
                  file=sys.stderr, flush=True)
        result = replay(client, loaded, options,
                        progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_table(result), flush=True)
    return 0 if result.settled else 1


def _workers_answer(settings: Settings, url: str | None) -> bool:
    from sessionfold.workers.celery_app import make_celery

    if not url:
        return False
    app = make_celery(settings, redis_url=url)
    try:
        return bool(app.control.ping(timeout=1.0))
    except Exception:  # a monitoring question; the replay works without an answer
        return False
    finally:
        app.close()


# --- operating sessions ------------------------------------------------------------------------

def _fold(args: argparse.Namespace) -> int:
    from sessionfold.runtime.wiring import open_store, redis_url_for
    from sessionfold.workers.celery_app import make_celery, make_enqueue

    settings = _settings("fold")
    with redis_url_for(settings, running_only=True) as url:
        store = open_store(settings)
        try:
            store.get_session(args.session)  # SessionNotFoundError: exit 2 with the reason
        finally:
            store.close()
        app = make_celery(settings, redis_url=url)
        job_id = make_enqueue(app)(args.session, None, "manual", None)
        print(f"sessionfold fold: enqueued job {job_id} for {args.session}", flush=True)
        if args.wait is not None:
            result = app.AsyncResult(job_id).get(timeout=args.wait, propagate=False)
            print(json.dumps(result, default=str), flush=True)
        app.close()
    return 0


def _session_command(args: argparse.Namespace) -> int:
    from sessionfold.core.errors import SessionNotFoundError
    from sessionfold.runtime.wiring import open_store

    settings = _settings(args.action)
    store = open_store(settings)
    try:
        if args.action == "delete":
            if not store.delete_session(args.session):
                raise SessionNotFoundError(f"no session {args.session!r}")
            print(f"sessionfold delete: {args.session} deleted", flush=True)
        else:
            paused = args.action == "pause"
            store.set_paused(args.session, paused)
            state = "paused: no background folds until resumed" if paused else "resumed"
            print(f"sessionfold {args.action}: {args.session} {state}", flush=True)
    finally:
        store.close()
    return 0

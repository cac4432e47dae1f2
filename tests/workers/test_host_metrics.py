"""Several sessionfold processes on one host share one ``/metrics``, with real processes.

Two schedulers and a prefork worker start with the same settings (one data dir, one metrics
port): all keep running, the first serves the sum of everyone's counts, the others say in one
line who serves; when the exporter is killed another takes over and no count is lost. A port
held by some other program is said once, never stops the process, and is taken when freed.
"""

from __future__ import annotations

import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
import redis
from pipeline_harness import PipelineProcess, child_env, free_port, wait_until
from sessionfold.runtime.exporter import serving_process
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.settings import Settings
from sessionfold.runtime.usage import UsageEvent, UsagePublisher
from sessionfold.workers.celery_app import make_celery, make_enqueue

pytestmark = [pytest.mark.redis, pytest.mark.slow]

GHOST_EVENTS = 7


@pytest.fixture
def settings(make_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    return make_settings(metrics_port=free_port(), scheduler_block_ms=100,
                         scheduler_sweep_interval_s=3600, data_dir=tmp_path / "data")


def _process(settings: Settings, tmp_path: Path, name: str, argv: list[str],
             ready: str) -> PipelineProcess:
    return PipelineProcess(["--log-level", "INFO", *argv], child_env(settings),
                           tmp_path / f"{name}.log", ready)


def _scheduler(settings: Settings, tmp_path: Path, name: str) -> PipelineProcess:
    return _process(settings, tmp_path, name, ["scheduler"], "sessionfold scheduler: reading")


def _worker(settings: Settings, tmp_path: Path, name: str) -> PipelineProcess:
    return _process(settings, tmp_path, name, ["worker", "--concurrency=2", "--pool=prefork",
                                               f"--hostname={name}@%h"], "ready.")


def _scrape(port: int) -> str | None:
    try:
        response = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx2.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _sample(text: str | None, name: str, **labels: str) -> float | None:
    if text is None:
        return None
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name + (f"{{{inner}}}" if labels else "")) + r" ([0-9.e+-]+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match[1]) if match else None


def _lines(proc: PipelineProcess, text: str) -> list[str]:
    return [line for line in proc.log_text().splitlines() if text in line]


def test_schedulers_and_a_worker_on_one_host_share_one_metrics_endpoint(
        settings: Settings, tmp_path: Path, redis_conn: redis.Redis) -> None:
    port = settings.metrics_port
    directory = settings.data_dir / "metrics"
    first = _scheduler(settings, tmp_path, "scheduler-1")
    worker = _worker(settings, tmp_path, "worker-1")
    second = _scheduler(settings, tmp_path, "scheduler-2")
    procs = [first, worker, second]
    try:
        for proc in procs:
            proc.start(timeout_s=120)
        for proc in procs:
            assert proc.proc is not None and proc.proc.poll() is None, proc.log_text()[-2000:]
        exporter = serving_process(directory, port)
        assert exporter is not None and exporter["pid"] == first.pid
        assert len(_lines(first, "metrics: serving")) == 1
        for proc in (worker, second):
            said = _lines(proc, "metrics: ")
            assert len(said) == 1 and f"served by the scheduler process {first.pid}" in said[0]

        # Counts of every process, in the one endpoint: usage events for unknown sessions are
        # counted by whichever scheduler reads them; a fold job by a worker's pool process.
        publisher = UsagePublisher(redis_conn, Keys.from_settings(settings), maxlen=10_000)
        for i in range(GHOST_EVENTS):
            publisher.publish(UsageEvent(session_id=f"ghost-{i}", seq=1, revision=1,
                                         input_tokens=50_000))
        app = make_celery(settings)
        try:
            make_enqueue(app)("no-such-session", None, "manual", None)
        finally:
            app.close()
        unknown = {"result": "unknown-session"}
        wait_until(lambda: _sample(_scrape(port), "sessionfold_usage_events_total",
                                   **unknown) == GHOST_EVENTS,
                   timeout_s=90, what="both schedulers' counts in the one endpoint")
        wait_until(lambda: _sample(_scrape(port), "sessionfold_fold_duration_seconds_count",
                                   outcome="skipped") == 1,
                   timeout_s=90, what="the worker's pool process's count in the endpoint")

        # The exporter dies: another member takes the port over; nothing counted is lost.
        first.kill()

        def taken_over() -> bool:
            now = serving_process(directory, port)
            return now is not None and now["pid"] in (worker.pid, second.pid)

        wait_until(taken_over, timeout_s=90, what="another process to take the port over")
        now = serving_process(directory, port)
        successor = worker if now is not None and now["pid"] == worker.pid else second
        assert len(_lines(successor, "metrics: took over serving")) == 1
        text = wait_until(lambda: _scrape(port), timeout_s=30, what="/metrics again")
        assert _sample(text, "sessionfold_usage_events_total", **unknown) == GHOST_EVENTS
        assert _sample(text, "sessionfold_fold_duration_seconds_count", outcome="skipped") == 1
    finally:
        for proc in procs:
            proc.stop(timeout_s=30)

    # Everyone gone: the next start is a fresh run and counts from zero.
    again = _scheduler(settings, tmp_path, "scheduler-3")
    try:
        again.start(timeout_s=120)
        text = wait_until(lambda: _scrape(port), timeout_s=30, what="/metrics of a fresh run")
        assert _sample(text, "sessionfold_usage_events_total", **unknown) is None
    finally:
        again.stop(timeout_s=30)


def test_a_port_held_by_another_program_is_said_once_and_taken_when_free(
        settings: Settings, tmp_path: Path) -> None:
    port = settings.metrics_port
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    scheduler = _scheduler(settings, tmp_path, "scheduler")
    try:
        scheduler.start(timeout_s=120)
        said = _lines(scheduler, "metrics: ")
        assert len(said) == 1 and "taken by another program" in said[0], said
        assert "WARNING" in said[0]
        assert scheduler.proc is not None and scheduler.proc.poll() is None
        squatter.close()
        text = wait_until(lambda: _scrape(port), timeout_s=90,
                          what="the scheduler to serve the freed port")
        assert "sessionfold_sessions_over_budget" in text  # its sweep's gauge
        assert len(_lines(scheduler, "metrics: took over serving")) == 1
    finally:
        squatter.close()
        scheduler.stop(timeout_s=30)


def test_sigterm_ends_a_member_without_disturbing_the_exporter(
        settings: Settings, tmp_path: Path) -> None:
    port = settings.metrics_port
    first = _scheduler(settings, tmp_path, "scheduler-1")
    second = _scheduler(settings, tmp_path, "scheduler-2")
    try:
        first.start(timeout_s=120)
        second.start(timeout_s=120)
        assert second.proc is not None
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(timeout=60) == 0
        assert _scrape(port) is not None
        exporter = serving_process(settings.data_dir / "metrics", port)
        assert exporter is not None and exporter["pid"] == first.pid
    finally:
        first.stop(timeout_s=30)
        second.stop(timeout_s=30)


def test_an_address_the_host_does_not_have_is_said_once_and_the_scheduler_runs(
        settings: Settings, tmp_path: Path) -> None:
    elsewhere = settings.model_copy(update={"metrics_host": "203.0.113.7"})  # TEST-NET-3
    scheduler = _scheduler(elsewhere, tmp_path, "scheduler")
    try:
        scheduler.start(timeout_s=120)
        said = _lines(scheduler, "metrics: ")
        assert len(said) == 1 and "cannot serve on 203.0.113.7" in said[0], said
        assert scheduler.proc is not None and scheduler.proc.poll() is None
    finally:
        scheduler.stop(timeout_s=30)

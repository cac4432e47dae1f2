"""Redis restarted under a running pipeline (a private redis-server; everything in it is lost):
the scheduler and the worker recover by themselves and folds resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pipeline_harness import (
    postgres_url,
    scheduler_process,
    started,
    transcript_session,
    wait_until,
    worker_process,
)
from sessionfold.cli.standin.fakeprovider import FakeProvider
from sessionfold.client import SessionHandle, connect
from sessionfold.core.messages import Message
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.keys import Keys
from sessionfold.runtime.redis_conn import redis_client
from sessionfold.runtime.settings import Settings

NAMES = ("django__django-15554", "sympy__sympy-13091")


def _drive(agent: SessionHandle, messages: list[Message], start: int, stop: int,
           provider: FakeProvider) -> None:
    """Run an agent over ``messages[start:stop]``: a model call before each assistant turn."""
    for index in range(start, stop):
        if messages[index].role == "assistant":
            agent.call(provider)
        agent.append([messages[index]], key=f"m{index}")


def test_scheduler_and_worker_recover_from_a_redis_restart(
        make_settings: Callable[..., Settings], private_redis: Any,
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # A fold in flight when Redis goes away is terminated by Celery (its late ack cannot be
    # sent); its store claim then holds the session until the lease (the task time limit)
    # expires. Short limits keep that wait inside the test's patience.
    settings = make_settings(redis_url=private_redis.url, database_url=postgres_url(request),
                             metrics_port=0, scheduler_sweep_interval_s=2,
                             scheduler_block_ms=200, scheduler_claim_idle_ms=2000,
                             visibility_timeout_s=40, task_time_limit_s=15,
                             task_soft_time_limit_s=12, retry_backoff_base_s=0.5,
                             retry_backoff_cap_s=5, lock_ttl_s=20)
    processes = [started(request, scheduler_process(settings, tmp_path / "scheduler.log")),
                 started(request, worker_process(settings, tmp_path / "worker.log"))]
    conversations = {name: transcript_session(name).messages for name in NAMES}
    provider = FakeProvider()
    with connect(settings) as client:
        # over_budget="shrink": a request past the guard's line goes out shrunk on its own
        # instead of waiting for (or folding in place of) the fold Redis's restart left
        # claimed until its lease runs out; what is shown here is the background resuming.
        agents = {name: client.session(name, policy=FoldPolicy(budget_tokens=8000),
                                       system=transcript_session(name, 1).system,
                                       over_budget="shrink")
                  for name in NAMES}

        def folds() -> dict[str, int]:
            return {name: len(client.store.spans(name)) for name in NAMES}

        for name, agent in agents.items():
            _drive(agent, conversations[name], 0, 70, provider)
        wait_until(lambda: all(folds().values()), timeout_s=180,
                   what="folds of every session before the restart")
        before = folds()

        private_redis.restart()  # the stream, its group, the locks and the queue are gone
        # The scheduler holds its partitions again at its next lease refresh (a third of the
        # lease time). Until then no agent can tell that a scheduler runs, and a request the
        # guard cannot bring under the budget folds inline rather than wait for nobody (the
        # documented fallback, which a loaded run once hit): the agents resume after it.
        keys = Keys.from_settings(settings)
        bus = redis_client(private_redis.url)
        try:
            wait_until(lambda: all(bus.exists(keys.partition_lease(keys.partition_of(n)))
                                   for n in NAMES),
                       timeout_s=60, what="the scheduler to hold its partitions again")
        finally:
            bus.close()

        for name, agent in agents.items():
            _drive(agent, conversations[name], 70, 140, provider)
        wait_until(lambda: all(folds()[n] > before[n] for n in NAMES), timeout_s=180,
                   what="folds to resume after the restart")
        for name in NAMES:
            ledger = [e.message for e in client.store.read_ledger(name)]
            assert ledger == conversations[name][:140]
        assert client.summarizer_calls == 0  # every fold ran in the background
    for proc in processes:
        assert proc.proc is not None and proc.proc.poll() is None, f"{proc.argv} died"

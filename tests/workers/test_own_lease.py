"""A job that finds its own earlier delivery's claim still live waits the lease out, and only
then (tasks._after_own_lease): a redelivery retries past the lease, a twin publish of the same
attempt stops as before, another job's claim is theirs. Deterministic: a real store, a stand-in
for Celery's task object."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.fold_procedure import FoldJob, FoldReport
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers.tasks import _after_own_lease

SID = "lease-agent"


class Retry(Exception):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__("retry")
        self.kwargs = kwargs


class FakeTask:
    def __init__(self, task_id: str, *, retries: int = 0, redelivered: bool = False) -> None:
        self.request = SimpleNamespace(id=task_id, retries=retries,
                                       delivery_info={"redelivered": redelivered})

    def retry(self, **kwargs: Any) -> Retry:
        return Retry(**kwargs)


class NoLock:
    def extend(self, session_id: str, token: str, ttl_ms: int) -> None:
        self.extended = (session_id, token, ttl_ms)


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    store = SessionStore.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    store.create_session(SID, FoldPolicy(budget_tokens=8000), "sys")
    store.append(SID, [{"role": "user", "content": "the task"}])
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}", metrics_port=0,
                        visibility_timeout_s=120, task_time_limit_s=30, retry_backoff_cap_s=30,
                        task_soft_time_limit_s=25, max_attempts=4)
    yield SimpleNamespace(store=store, settings=settings)
    store.close()


def _skipped(job_id: str, epoch: int, incarnation: int) -> FoldReport:
    return FoldReport(session_id=SID, job_id=job_id, trigger="threshold", outcome="skipped",
                      claim="newer-claim", epoch=epoch, incarnation=incarnation)


def test_a_redelivery_finding_its_own_live_claim_retries_after_the_lease(runtime: Any) -> None:
    held = runtime.store.claim(SID, "task-1", lease_s=10)  # the delivery that died
    assert held.claimed
    job = FoldJob(session_id=SID, job_id="task-1", lease_s=30)
    with pytest.raises(Retry) as raised:
        _after_own_lease(FakeTask("task-1", redelivered=True), runtime, job,
                         _skipped("task-1", held.epoch, held.incarnation), NoLock(), "tok")
    kwargs = raised.value.kwargs
    remaining = (held.expires_at - datetime.now(UTC)).total_seconds() if held.expires_at else 0
    assert remaining - 1 < kwargs["countdown"] <= remaining + 1.5  # just past the lease
    # The retry claims with the epoch and incarnation the dead claim holds: after the lease
    # it is the session's next claim, not a job overtaken by a newer one.
    assert kwargs["kwargs"]["enqueued_epoch"] == held.epoch
    assert kwargs["kwargs"]["incarnation"] == held.incarnation
    assert kwargs["kwargs"]["lock_token"] == "tok"


def test_a_retry_finding_an_earlier_attempts_claim_waits_again(runtime: Any) -> None:
    held = runtime.store.claim(SID, "task-1", lease_s=10)
    job = FoldJob(session_id=SID, job_id="task-1~r1", lease_s=30)
    with pytest.raises(Retry):
        _after_own_lease(FakeTask("task-1", retries=1), runtime, job,
                         _skipped("task-1~r1", held.epoch, held.incarnation), NoLock(), None)


def test_a_twin_publish_and_another_jobs_claim_stop_as_before(runtime: Any) -> None:
    held = runtime.store.claim(SID, "task-1", lease_s=10)
    report = _skipped("task-1", held.epoch, held.incarnation)
    job = FoldJob(session_id=SID, job_id="task-1", lease_s=30)
    # The same attempt published twice (not a redelivery): its twin is at work.
    assert _after_own_lease(FakeTask("task-1"), runtime, job, report, NoLock(), None) is None
    # Another task's claim: a newer job's.
    other = FoldJob(session_id=SID, job_id="task-2", lease_s=30)
    assert _after_own_lease(FakeTask("task-2", redelivered=True), runtime, other,
                            _skipped("task-2", held.epoch, held.incarnation), NoLock(),
                            None) is None
    # Waited max_attempts times already: the sweep finds the session again.
    assert _after_own_lease(FakeTask("task-1", retries=4, redelivered=True), runtime,
                            FoldJob(session_id=SID, job_id="task-1~r4", lease_s=30), report,
                            NoLock(), None) is None


def test_a_visit_that_did_not_stop_at_a_claim_is_left_alone(runtime: Any) -> None:
    folded = FoldReport(session_id=SID, job_id="task-1", trigger="threshold",
                        outcome="folded", claim="claimed")
    job = FoldJob(session_id=SID, job_id="task-1", lease_s=30)
    assert _after_own_lease(FakeTask("task-1", redelivered=True), runtime, job, folded,
                            NoLock(), None) is None

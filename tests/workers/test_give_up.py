"""Giving a session up is one step: no reader ever sees a paused or dead-lettered session
without the refusal that says why.

The fold task runs in-process (a stand-in for Celery's task object, the real task body) on a
store that, after every call the task makes, lets an independent reader look at the session:
each look must find the pause, the dead letter and the refusal all together or none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from pipeline_harness import transcript_session
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.store import SessionStore
from sessionfold.workers.celery_app import WorkerRuntime, make_celery
from sessionfold.workers.tasks import fold_session

SID = "agent-given-up"
POLICY = FoldPolicy(budget_tokens=8000)


@dataclass(frozen=True)
class Look:
    """What a reader saw of the session between two of the task's store calls."""

    after: str
    paused: bool
    claimed_by: str | None
    dead_letters: int
    refusals: int

    @property
    def whole(self) -> bool:
        gave_up = self.paused or self.dead_letters > 0 or self.refusals > 0
        return not gave_up or (self.dead_letters > 0 and self.refusals > 0)


class Watched:
    """A SessionStore whose every call is followed by a reader's look at the session."""

    def __init__(self, store: SessionStore, reader: SessionStore) -> None:
        self._store = store
        self._reader = reader
        self.looks: list[Look] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                self._look(name)
        return call

    def _look(self, after: str) -> None:
        info = self._reader.get_session(SID)
        refusals = [r for r in self._reader.records(SID)
                    if r.outcome == "refused" and r.detail.startswith("dead-lettered")]
        letters = [d for d in self._reader.dead_letters() if d.session_id == SID]
        self.looks.append(Look(after, info.paused, info.claimed_by, len(letters), len(refusals)))


@dataclass
class Rig:
    settings: Settings
    redis_url: str
    store: SessionStore
    watched: Watched
    app: Any

    def run_task(self, job_id: str, *, redelivered: bool = False) -> dict[str, Any]:
        request = SimpleNamespace(id=job_id, retries=0,
                                  delivery_info={"redelivered": redelivered})
        return fold_session(SimpleNamespace(app=self.app, request=request), SID)


@pytest.fixture
def rig(make_settings: Callable[..., Settings], redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    settings = make_settings(max_attempts=2)
    store = SessionStore.from_url(settings.database_url)
    store.migrate()
    conv = transcript_session("django__django-15554", 60)
    store.create_session(SID, POLICY, conv.system)
    store.append(SID, conv.messages)
    worker_store = SessionStore.from_url(settings.database_url)
    watched = Watched(worker_store, store)
    monkeypatch.setattr(WorkerRuntime, "store", property(lambda _self: watched))
    app = make_celery(settings, redis_url=redis_url)
    try:
        yield Rig(settings, redis_url, store, watched, app)
    finally:
        app.close()
        worker_store.close()
        store.close()


def test_a_session_whose_folds_keep_dying_is_paused_with_its_reason_in_one_step(
        rig: Rig) -> None:
    # Two workers died holding the claim (leases set long ago, on a clock of the past).
    past = datetime(2020, 1, 1, tzinfo=UTC)
    with SessionStore.from_url(rig.settings.database_url, clock=lambda: past) as early:
        early.claim(SID, "job-dead-1", lease_s=10)
        past += timedelta(seconds=11)
        early.claim(SID, "job-dead-2", lease_s=10)
    result = rig.run_task("job-3")
    assert result["outcome"] == "dead-lettered" and result["claim"] == "abandoned"
    final = rig.watched.looks[-1]
    assert final.paused and final.dead_letters == 1 and final.refusals == 1
    torn = [look for look in rig.watched.looks if not look.whole]
    assert torn == [], f"a reader saw the session half given up: {torn}"


def test_a_job_past_its_delivery_cap_is_dead_lettered_with_its_reason_in_one_step(
        rig: Rig) -> None:
    job_id = "job-redelivered"
    runtime = WorkerRuntime(rig.settings, rig.redis_url)
    try:
        # As if the job had been delivered max_attempts times already, its worker lost each
        # time (the redeliveries among them counted), and the broker hands it out once more.
        runtime.redis.set(runtime.keys.fold_attempts(job_id), rig.settings.max_attempts - 1)
    finally:
        runtime.close()
    result = rig.run_task(job_id, redelivered=True)
    assert result["outcome"] == "dead-lettered"
    final = rig.watched.looks[-1]
    assert final.dead_letters == 1 and final.refusals == 1 and final.claimed_by is None
    assert not final.paused  # the job is given up, not the session: the scheduler may try again
    torn = [look for look in rig.watched.looks if not look.whole]
    assert torn == [], f"a reader saw the job half given up: {torn}"

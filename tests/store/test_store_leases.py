"""Leases are set and compared on the database's clock, never on a worker's own.

Two stores on one database stand for two hosts. The second one's process clock runs ten minutes
ahead (the clock the store stamps rows with, patched): it must still see the first one's lease
as live, whatever its own clock says.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

import pytest
from sessionfold.store import SessionStore, db
from store_helpers import POLICY, plan, turn, user

SKEW = timedelta(minutes=10)


class AheadDatetime(datetime):
    """``datetime`` whose ``now()`` runs ten minutes ahead of the host's clock."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> AheadDatetime:
        real = datetime.now(tz or UTC) + SKEW
        return cls.fromtimestamp(real.timestamp(), tz or UTC)


@pytest.fixture
def healthy(store_url: str) -> SessionStore:
    """A store with the host's own clock (no injected clock: the production default)."""
    store = SessionStore.from_url(store_url)
    store.create_session("a", POLICY, system="be brief")
    store.append("a", [user("the task"), *[m for i in range(20) for m in turn(str(i))]])
    return store


def test_a_worker_whose_clock_runs_ahead_cannot_take_over_a_live_lease(
        healthy: SessionStore, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    claim = healthy.claim("a", "job-healthy", lease_s=60)
    result = plan(healthy, "a")
    monkeypatch.setattr(db, "datetime", AheadDatetime)  # this host's clock: ten minutes ahead
    assert db.utc_now() - datetime.now(UTC) > SKEW - timedelta(minutes=1)
    with SessionStore.from_url(store_url) as skewed:
        taken = skewed.claim("a", "job-skewed", lease_s=60)
        assert (taken.status, taken.holder) == ("newer-claim", "job-healthy")
        # Resuming ends only a claim past its lease; by the database's clock this one is live.
        skewed.set_paused("a", True)
        skewed.set_paused("a", False)
    info = healthy.get_session("a")
    assert (info.claimed_by, info.fold_epoch) == ("job-healthy", claim.epoch)
    done = healthy.commit_fold("a", result, epoch=claim.epoch,
                               incarnation=claim.incarnation, job_id="job-healthy")
    assert done.spans and healthy.get_session("a").claimed_by is None
    healthy.close()


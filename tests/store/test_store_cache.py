"""The decoded-item cache never changes what a read returns: only how much it decodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from store_helpers import check_window, plan, turn, user

POLICY = FoldPolicy(budget_tokens=2000, keep_recent_turns=2)


@pytest.fixture
def uncached(store_url: str) -> Iterator[SessionStore]:
    """A second store on the same database that decodes every read from scratch."""
    s = SessionStore.from_url(store_url, item_cache=0)
    yield s
    s.close()


def _same(a: SessionStore, b: SessionStore, sid: str) -> None:
    wa, wb = a.read_window(sid), b.read_window(sid)
    assert (wa.revision, wa.system) == (wb.revision, wb.system)
    assert [i.to_json() for i in wa.items] == [i.to_json() for i in wb.items]
    assert [i.tokens for i in wa.items] == [i.tokens for i in wb.items]


def test_reads_after_appends_and_folds_match_a_store_without_cache(
        store: SessionStore, uncached: SessionStore) -> None:
    store.create_session("a", POLICY, system="sys")
    store.append("a", [user("task")])
    for i in range(20):
        store.append("a", turn(str(i)))
        _same(store, uncached, "a")
    claim = store.claim("a", "job-1")
    store.commit_fold("a", plan(store, "a"), epoch=claim.epoch,
                      incarnation=claim.incarnation, job_id="job-1")
    _same(store, uncached, "a")
    store.append("a", turn("after"))
    _same(store, uncached, "a")
    # A fold committed by another process (here: the other store) is seen too.
    claim = uncached.claim("a", "job-2", force=True)
    uncached.commit_fold("a", plan(uncached, "a", force=True, target_tokens=600),
                         epoch=claim.epoch, incarnation=claim.incarnation, job_id="job-2")
    _same(store, uncached, "a")
    check_window(store, "a")


def test_a_deleted_and_recreated_session_never_reads_its_predecessor(
        store: SessionStore, uncached: SessionStore) -> None:
    store.create_session("a", POLICY)
    store.append("a", [user("first life"), *turn("1")])
    assert store.read_window("a").messages()[0].content == "first life"
    store.delete_session("a")
    store.create_session("a", POLICY)
    store.append("a", [user("second life"), *turn("2")])  # same revisions, same seqs
    assert store.read_window("a").messages()[0].content == "second life"
    _same(store, uncached, "a")


def test_a_tiny_cache_refetches_what_it_evicted(store_url: str, uncached: SessionStore) -> None:
    tiny = SessionStore.from_url(store_url, item_cache=3)
    try:
        for sid in ("a", "b"):
            tiny.create_session(sid, POLICY)
            tiny.append(sid, [user(f"task {sid}"), *[m for i in range(6) for m in turn(str(i))]])
        for _ in range(3):  # each read evicts the other session's items
            _same(tiny, uncached, "a")
            _same(tiny, uncached, "b")
        tiny.append("a", turn("more"))
        _same(tiny, uncached, "a")
        assert len(tiny.item_cache) <= 3
    finally:
        tiny.close()


def test_a_window_read_names_each_decoded_items_json_size_and_none_for_a_cached_one(
        store: SessionStore, uncached: SessionStore) -> None:
    # Window.chars is what the fold engine measures an item's message as (compact JSON,
    # `fold_window`'s item_chars): read off the stored JSON, it must be the same number, on
    # every shipped transcript message (non-ASCII text, tool inputs, images) and on a summary.
    from pathlib import Path

    from sessionfold.cli.files import load_conversation_file
    from sessionfold.core.compact import FoldVisit, fold_window

    data = Path(__file__).resolve().parents[1] / "data" / "transcripts"
    for n, path in enumerate(sorted(data.glob("*.json"))):
        sid = f"t{n}"
        messages = load_conversation_file(path).messages
        store.create_session(sid, FoldPolicy(budget_tokens=1_000_000))
        store.append(sid, messages)
        window = uncached.read_window(sid)
        assert window.chars == [len(i.message.model_dump_json(exclude_unset=True))
                                for i in window.items]
        # The same figures as the engine's own count (no sizes given).
        policy = FoldPolicy(budget_tokens=20_000, economics="window")
        given = fold_window(window.items, FoldVisit(policy, None, item_chars=window.chars))
        measured = fold_window(window.items, FoldVisit(policy, None))
        assert (given.record.chars_before, given.record.chars_after) == (
            measured.record.chars_before, measured.record.chars_after)
    # A committed fold's summary item too.
    store.create_session("a", POLICY, system="sys")
    store.append("a", [user("task"), *(m for i in range(20) for m in turn(str(i)))])
    claim = store.claim("a", "job-1")
    store.commit_fold("a", plan(store, "a"), epoch=claim.epoch, incarnation=claim.incarnation,
                      job_id="job-1")
    folded = uncached.read_window("a")
    assert any(i.kind == "summary" for i in folded.items)
    assert folded.chars == [len(i.message.model_dump_json(exclude_unset=True))
                            for i in folded.items]
    store.read_window("t0")  # now cached in this process: only new items are decoded
    store.append("t0", [user("one more")])
    again = store.read_window("t0")
    assert again.chars[:-1] == [None] * (len(again.items) - 1)
    assert again.chars[-1] == len(again.items[-1].message.model_dump_json(exclude_unset=True))

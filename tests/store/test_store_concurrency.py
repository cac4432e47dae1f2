"""Agents append whole turns while workers claim and commit folds on the same sessions."""

from __future__ import annotations

import random
import threading
from collections import defaultdict

from sessionfold.core.errors import StaleSpanError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from store_helpers import check_window, plan, turn, user

AGENTS = 8
SESSIONS = 4          # two agents per session: their turns interleave
TURNS = 20            # per agent
FOLDERS = 3
POLICY = FoldPolicy(budget_tokens=2000, keep_recent_turns=2)


def test_appends_and_folds_interleave_without_losing_or_repeating_a_turn(
        store: SessionStore) -> None:
    sids = [f"s{i}" for i in range(SESSIONS)]
    for sid in sids:
        store.create_session(sid, POLICY, system="agents at work")
        store.append(sid, [user(f"task of {sid}")])
    stop = threading.Event()
    start = threading.Barrier(AGENTS + FOLDERS)
    errors: list[BaseException] = []
    folds: dict[str, int] = defaultdict(int)
    stale: dict[str, int] = defaultdict(int)

    def agent(n: int) -> None:
        sid = sids[n % SESSIONS]
        rng = random.Random(n)
        try:
            start.wait()
            for t in range(TURNS):
                key = f"agent{n}-turn{t}"
                messages = turn(f"a{n}t{t}", lines=rng.randint(2, 12))
                first = store.append(sid, messages, key=key)
                if rng.random() < 0.2:  # a retried request: must not duplicate the turn
                    again = store.append(sid, messages, key=key)
                    assert again.duplicate and again.first_seq == first.first_seq
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def folder(n: int) -> None:
        rng = random.Random(100 + n)
        job = 0
        try:
            start.wait()
            while not stop.is_set():
                sid = rng.choice(sids)
                job += 1
                job_id = f"folder{n}-job{job}"
                inline = rng.random() < 0.15  # the overflow fallback: always claims
                claim = store.claim(sid, job_id, force=inline, lease_s=30)
                if not claim.claimed:
                    continue
                result = plan(store, sid, force=inline,
                              target_tokens=POLICY.target_tokens if inline else None)
                try:
                    store.commit_fold(sid, result, epoch=claim.epoch,
                                      incarnation=claim.incarnation, job_id=job_id)
                    folds[sid] += not result.edit.empty
                except StaleSpanError:
                    stale[sid] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    agents = [threading.Thread(target=agent, args=(n,)) for n in range(AGENTS)]
    folders = [threading.Thread(target=folder, args=(n,)) for n in range(FOLDERS)]
    for t in agents + folders:
        t.start()
    for t in agents:
        t.join()
    stop.set()
    for t in folders:
        t.join()
    assert not errors, errors

    for n, sid in enumerate(sids):
        ledger = [e.message for e in store.read_ledger(sid)]
        assert ledger[0] is not None and ledger[0].content == f"task of {sid}"
        texts = [m.to_json() for m in ledger[1:] if m is not None]
        for agent_n in (n, n + SESSIONS):
            # Every turn of the agent exactly once, in the order it was appended, each whole.
            own = [i for i, m in enumerate(texts) if m["role"] == "assistant"
                   and f"Step a{agent_n}t" in m["content"][0]["text"]]
            expected = [f"Step a{agent_n}t{t}: look at the next file." for t in range(TURNS)]
            assert [texts[i]["content"][0]["text"] for i in own] == expected
            for i in own:
                assert texts[i + 1]["content"][0]["tool_use_id"] == \
                    texts[i]["content"][1]["id"]
        assert len(texts) == 2 * TURNS * (AGENTS // SESSIONS)
        check_window(store, sid)
        spans = store.spans(sid)
        window = store.read_window(sid)
        summaries = [(i.start_seq, i.end_seq) for i in window.items if i.kind == "summary"]
        assert set(summaries) <= {(s.start_seq, s.end_seq) for s in spans}
        records = store.records(sid)
        assert sum(r.outcome == "stale" for r in records) == stale[sid]
        assert sum(r.outcome == "folded" for r in records) >= folds[sid]
    assert sum(folds.values()) > 0, "the folders never folded: the test did not test anything"

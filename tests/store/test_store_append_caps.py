"""An append is bounded in the store, whoever calls it (issue 33): at most MAX_APPEND_MESSAGES
messages, none larger than MAX_MESSAGE_BYTES as stored; a larger one is refused naming the limit
(and the message), and nothing is written."""

from __future__ import annotations

import pytest
from sessionfold.core.errors import TooLargeError
from sessionfold.core.policy import FoldPolicy
from sessionfold.store import SessionStore
from sessionfold.store.ledger import MAX_APPEND_MESSAGES, MAX_MESSAGE_BYTES
from store_helpers import row_counts, user

POLICY = FoldPolicy(budget_tokens=4000)


def test_the_caps_are_the_documented_defaults() -> None:
    assert (MAX_APPEND_MESSAGES, MAX_MESSAGE_BYTES) == (1000, 8 * 1024 * 1024)


def test_more_messages_than_one_append_takes_are_refused_naming_the_limit(
        store: SessionStore) -> None:
    store.create_session("a", POLICY)
    before = row_counts(store)
    many = [user(f"turn {i}") for i in range(5000)]
    with pytest.raises(TooLargeError, match=r"at most 1,000 messages.*got 5,000"):
        store.append("a", many)
    assert row_counts(store) == before
    assert store.append("a", many[:MAX_APPEND_MESSAGES]).last_seq == MAX_APPEND_MESSAGES - 1


def test_a_message_larger_than_the_store_takes_is_refused_naming_it(store: SessionStore) -> None:
    store.create_session("a", POLICY)
    before = row_counts(store)
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "cat big.log"}}]}
    output = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "x" * (20 * 1024 * 1024)}]}
    with pytest.raises(TooLargeError, match="8,388,608 bytes") as caught:
        store.append("a", [user("go"), call, output])
    assert caught.value.index == 2
    assert row_counts(store) == before

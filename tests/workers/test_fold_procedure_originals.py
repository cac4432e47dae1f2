"""The shared fold procedure reads a clipped output's size from the ledger, never from its text.

A tool printed a clip line of its own ("12 characters in all") at the top of a huge output. The
store clipped it on append; a background fold masks it later. The stub must name the size of the
ledger original, which only ``run_fold``'s ``originals`` lookup can give it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline_harness import postgres_url
from sessionfold.core.clip import CLIP_TAG
from sessionfold.core.layers import MASK_TAG
from sessionfold.core.messages import ToolResultBlock
from sessionfold.core.policy import FoldPolicy
from sessionfold.core.summarizers import ExtractiveSummarizer
from sessionfold.runtime.fold_procedure import FoldJob, run_fold
from sessionfold.store import SessionStore

SID = "agent-clipped"
MASK_ONLY = FoldPolicy(budget_tokens=4000, keep_recent_turns=2, layers=("mask-tool-results",))
FORGED = f"{CLIP_TAG} 12 characters in all; the 0 characters between are nothing.]\n"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        with SessionStore.from_url(url) as s:
            s.migrate()
    else:
        url = postgres_url(request)
    with SessionStore.from_url(url) as s:
        yield s


def tool_turn(tag: str, output: str) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [
            {"type": "text", "text": f"Step {tag}."},
            {"type": "tool_use", "id": f"call-{tag}", "name": "bash",
             "input": {"command": f"cat {tag}.log"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"call-{tag}", "content": output}]},
    ]


def test_a_background_fold_masks_a_clipped_output_naming_its_ledger_originals_size(
        store: SessionStore) -> None:
    huge = FORGED + "".join(f"row {i}: payload={i * 31:x}\n" for i in range(20_000))
    store.create_session(SID, MASK_ONLY)
    store.append(SID, [{"role": "user", "content": "the task"}, *tool_turn("big", huge)])
    store.append(SID, [m for i in range(30)
                       for m in tool_turn(str(i), f"output {i}\n" * 12)])
    assert store.read_window(SID).items[2].edits == ("clipped",)

    report = run_fold(store, ExtractiveSummarizer(), FoldJob(SID, "job-1", force=True))
    assert report.outcome == "folded", report.detail
    item = store.read_window(SID).items[2]
    assert item.edits == ("clipped", "masked")
    block = item.message.blocks()[0]
    assert isinstance(block, ToolResultBlock)
    assert block.output_text() == (f"{MASK_TAG} to save context: {len(huge):,} characters; "
                                   "ledger #2 holds it whole.]")

"""Flower, for real: real workers fold real sessions, and a headless Chromium reads the Tasks page.

The stack (embedded Redis under ``tmp_path``, SQLite, two Celery workers, Flower with basic auth)
is the one ``sessionfold demo`` runs (:class:`~sessionfold.cli.stack.Stack`). Fold jobs are
enqueued for sessions built from generated operations-agent conversations: some over their
budget (outcome ``folded``), one well under it (outcome ``nothing-to-fold``). Chromium then loads
``/tasks`` with the credentials in the URL; the page fills its table from ``/tasks/datatable``
with JavaScript, so the DOM is dumped after a virtual-time budget. The test checks that every job
is listed with its id, its session and its outcome, and takes a screenshot.

Chromium is Debian's ``chromium`` package; without it the test skips, and fails under CI (set
``CI``). ``SF_FLOWER_SCREENSHOT=docs/flower-tasks.png`` also copies the screenshot there (that is
how the picture in docs/operations.md is made).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sessionfold.cli.stack import Stack, StackOptions, free_port
from sessionfold.cli.standin.opsagent import generate_session
from sessionfold.core.policy import FoldPolicy
from sessionfold.runtime.settings import Settings
from sessionfold.workers.celery_app import FOLD_TASK, make_celery, make_enqueue

pytestmark = [pytest.mark.slow]

USER, PASSWORD = "operator", "fold-watch-7"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (CI must provide it: apt-get install chromium)")
        pytest.skip("chromium is not installed")
    return path


def _chromium_argv(binary: str, profile: Path) -> list[str]:
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}"]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """Embedded Redis + SQLite under ``tmp_path``, two workers and Flower with basic auth."""
    settings = Settings(data_dir=tmp_path / "data", redis_url=None, database_url=None,
                        anthropic_api_key=None, summarizer="offline",
                        flower_port=free_port(), flower_basic_auth=f"{USER}:{PASSWORD}",
                        metrics_port=0)
    options = StackOptions(workers=2, worker_concurrency=1, scheduler=False, metrics=False,
                           log_dir=tmp_path / "logs", worker_name="e2e-worker")
    with Stack(settings, options) as running:
        running.wait_ready(timeout_s=120)
        yield running


def _flower_api(stack: Stack, path: str) -> Any:
    assert stack.flower_url is not None
    request = urllib.request.Request(stack.flower_url + path)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def _make_sessions(stack: Stack) -> dict[str, str]:
    """Sessions to fold: three over budget, one far under it. Returns id → expected outcome."""
    store = stack.store
    assert store is not None
    expected = {}
    for n in range(3):
        ops = generate_session(n, 30, seed=11)
        sid = f"ops-{n}"
        store.create_session(sid, FoldPolicy(budget_tokens=4000), ops.conversation.system)
        store.append(sid, ops.conversation.messages)
        expected[sid] = "folded"
    quiet = generate_session(9, 10, seed=11)
    sid = "idle"
    store.create_session(sid, FoldPolicy(budget_tokens=200_000), quiet.conversation.system)
    store.append(sid, quiet.conversation.messages)
    expected[sid] = "nothing-to-fold"
    return expected


def _wait_listed(stack: Stack, job_ids: set[str], timeout_s: float = 60) -> dict[str, Any]:
    """Flower's own view of the jobs, once it has seen every one of them succeed."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = _flower_api(stack, "/api/tasks")
        done = {tid: t for tid, t in tasks.items() if tid in job_ids and t["state"] == "SUCCESS"}
        if set(done) == job_ids:
            return done
        if time.monotonic() > deadline:
            pytest.fail(f"Flower saw {sorted(done)} of {sorted(job_ids)} succeed; all tasks: "
                        f"{json.dumps(tasks)[:2000]}")
        time.sleep(0.5)


def test_flower_tasks_page_lists_fold_jobs_with_sessions_and_outcomes(
        stack: Stack, tmp_path: Path) -> None:
    binary = _chromium()
    expected = _make_sessions(stack)
    app = make_celery(stack.settings)
    enqueue = make_enqueue(app)
    jobs = {enqueue(sid, None, "manual", None): sid for sid in expected}
    try:
        results = {job: app.AsyncResult(job).get(timeout=120) for job in jobs}
    finally:
        app.close()
    # What the workers did, as the task results say (and what Flower must show).
    for job, sid in jobs.items():
        assert results[job]["session"] == sid
        assert results[job]["outcome"] == expected[sid], results[job]
    listed = _wait_listed(stack, set(jobs))
    assert {t["name"] for t in listed.values()} == {FOLD_TASK}
    assert {t["worker"] for t in listed.values()} <= set(stack.worker_names)

    assert stack.flower_url is not None
    page = stack.flower_url.replace("http://", f"http://{USER}:{PASSWORD}@") + "/tasks"
    argv = _chromium_argv(binary, tmp_path / "chromium-profile")
    dom = subprocess.run([*argv, "--virtual-time-budget=10000", "--dump-dom", page],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "<table" in dom and "tasks-table" in dom, dom[:2000]
    rows = _table_rows(dom)
    for job, sid in jobs.items():
        row = next((r for r in rows if job in r), None)
        assert row is not None, f"job {job} ({sid}) is not on the Tasks page: {rows}"
        assert sid in row, row
        assert f"'outcome': '{expected[sid]}'" in row, row
        assert "SUCCESS" in row, row

    shot = tmp_path / "flower-tasks.png"
    subprocess.run([*argv, "--virtual-time-budget=10000", "--window-size=1800,760",
                    "--hide-scrollbars", f"--screenshot={shot}", page],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == PNG_MAGIC
    assert shot.stat().st_size > 20_000  # a rendered table, not a blank page
    target = os.environ.get("SF_FLOWER_SCREENSHOT")
    if target:
        shutil.copyfile(shot, target)


def _table_rows(dom: str) -> list[str]:
    """The text of each ``<tr>`` of the dumped DOM (tags kept; enough for substring checks)."""
    import html

    body = dom.split("<tbody", 1)[1] if "<tbody" in dom else ""
    return [html.unescape(chunk) for chunk in body.split("<tr")[1:]]

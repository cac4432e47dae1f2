"""Metrics: recorded from the project's own records, exposed over HTTP, summed across forks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sessionfold.core.window import CompactionRecord, Refusal, SummarizerUsage
from sessionfold.runtime.metrics import Metrics, start_metrics_server


def record(outcome: str = "folded", **kw: object) -> CompactionRecord:
    values: dict[str, object] = {
        "trigger": "threshold", "outcome": outcome, "budget_tokens": 10_000,
        "target_tokens": 6_000, "measured_tokens": 9_000, "tokens_after": 5_500}
    values.update(kw)
    return CompactionRecord(**values)  # type: ignore[arg-type]


@pytest.fixture
def m() -> Metrics:
    return Metrics(CollectorRegistry())


def value(m: Metrics, name: str, **labels: str) -> float:
    got = m.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_a_folded_visit_counts_outcome_tokens_saved_and_summarizer_usage(m: Metrics) -> None:
    usage = SummarizerUsage(model="claude-haiku-5-5", calls=2, input_tokens=4000,
                            output_tokens=300, cache_read_input_tokens=100)
    m.record_visit(record(summarizer_usage=usage), duration_s=1.5, cost_usd=0.004)
    assert value(m, "sessionfold_folds_total", outcome="folded", trigger="threshold") == 1
    assert value(m, "sessionfold_tokens_saved_total") == 3_500
    model = "claude-haiku-5-5"
    assert value(m, "sessionfold_summarizer_tokens_total", model=model, kind="input") == 4000
    assert value(m, "sessionfold_summarizer_tokens_total", model=model, kind="output") == 300
    assert value(m, "sessionfold_summarizer_tokens_total", model=model, kind="cache_read") == 100
    assert value(m, "sessionfold_summarizer_cost_usd_total", model=model) == pytest.approx(0.004)
    assert value(m, "sessionfold_fold_duration_seconds_count", outcome="folded") == 1
    assert value(m, "sessionfold_fold_duration_seconds_sum", outcome="folded") == 1.5


def test_refusals_count_by_reason_and_save_nothing(m: Metrics) -> None:
    refused = record("refused", tokens_after=9_000, refusals=(
        Refusal(reason="inside-keep-window", start_seq=3, end_seq=9),
        Refusal(reason="pinned", start_seq=1, end_seq=1),
        Refusal(reason="pinned", start_seq=2, end_seq=2)))
    m.record_visit(refused)
    assert value(m, "sessionfold_folds_total", outcome="refused", trigger="threshold") == 1
    assert value(m, "sessionfold_refusals_total", reason="pinned") == 2
    assert value(m, "sessionfold_refusals_total", reason="inside-keep-window") == 1
    assert value(m, "sessionfold_tokens_saved_total") == 0
    assert value(m, "sessionfold_fold_duration_seconds_count", outcome="refused") == 0


def test_track_fold_times_the_job_and_counts_errors(m: Metrics) -> None:
    with m.track_fold("overflow") as timer:
        timer.done(record(trigger="overflow"))
        timer.done(record(trigger="overflow"))  # reported twice, counted once
    assert value(m, "sessionfold_folds_total", outcome="folded", trigger="overflow") == 1
    assert value(m, "sessionfold_fold_duration_seconds_count", outcome="folded") == 1
    with pytest.raises(RuntimeError), m.track_fold():
        raise RuntimeError("summarizer exploded")
    assert value(m, "sessionfold_folds_total", outcome="error", trigger="threshold") == 1
    assert value(m, "sessionfold_fold_duration_seconds_count", outcome="error") == 1
    with m.track_fold():
        pass  # stopped at the claim: a duration, no visit
    assert value(m, "sessionfold_fold_duration_seconds_count", outcome="skipped") == 1
    assert value(m, "sessionfold_folds_total", outcome="skipped", trigger="threshold") == 0


def test_scheduler_and_job_helpers(m: Metrics) -> None:
    m.count_usage_events("accepted", 40)
    m.count_usage_events("superseded", 0)
    m.count_enqueued("stream")
    m.count_enqueued("sweep", 2)
    m.observe_scheduler_lag(0.03)
    m.observe_scheduler_lag(-1.0)  # clock skew between hosts: clamped, not an error
    m.record_retry("529")
    m.record_dead_letter("max-attempts")
    assert value(m, "sessionfold_usage_events_total", result="accepted") == 40
    assert m.registry.get_sample_value("sessionfold_usage_events_total",
                                       {"result": "superseded"}) is None
    assert value(m, "sessionfold_fold_jobs_enqueued_total", source="sweep") == 2
    assert value(m, "sessionfold_scheduler_lag_seconds_count") == 2
    assert value(m, "sessionfold_scheduler_lag_seconds_bucket", le="0.005") == 1
    assert value(m, "sessionfold_fold_retries_total", reason="529") == 1
    assert value(m, "sessionfold_dead_letters_total", reason="max-attempts") == 1


def test_the_http_endpoint_serves_the_default_metrics() -> None:
    from sessionfold.runtime.metrics import metrics

    metrics().count_enqueued("stream")
    server = start_metrics_server(0)
    try:
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
    finally:
        server.close()
    assert server.port > 0
    assert 'sessionfold_fold_jobs_enqueued_total{source="stream"}' in body
    assert "sessionfold_scheduler_lag_seconds_bucket" in body


_FORKING_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from sessionfold.core.window import CompactionRecord
    from sessionfold.runtime.metrics import enable_multiprocess, exposition, metrics

    enable_multiprocess(Path(sys.argv[1]))
    rec = CompactionRecord(trigger="threshold", outcome="folded", budget_tokens=10000,
                           target_tokens=6000, measured_tokens=9000, tokens_after=5000)
    children = []
    for _ in range(3):                       # as Celery's prefork pool would
        pid = os.fork()
        if pid == 0:
            metrics().record_visit(rec, duration_s=0.5)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    metrics().count_enqueued("stream")       # the parent records too
    text = exposition().decode()
    wanted = {}
    for line in text.splitlines():
        if line.startswith(("sessionfold_folds_total", "sessionfold_tokens_saved_total",
                            "sessionfold_fold_jobs_enqueued_total",
                            "sessionfold_fold_duration_seconds_count")):
            name, _, number = line.rpartition(" ")
            wanted[name] = float(number)
    print(json.dumps(wanted))
""")


def test_multiprocess_mode_adds_up_forked_childrens_metrics(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    done = subprocess.run([sys.executable, "-c", _FORKING_SCRIPT, str(tmp_path / "prom")],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got['sessionfold_folds_total{outcome="folded",trigger="threshold"}'] == 3
    assert got["sessionfold_tokens_saved_total"] == 12_000
    assert got['sessionfold_fold_duration_seconds_count{outcome="folded"}'] == 3
    assert got['sessionfold_fold_jobs_enqueued_total{source="stream"}'] == 1
    assert list((tmp_path / "prom").glob("*.db"))


def test_multiprocess_mode_cannot_be_switched_on_after_recording(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from sessionfold.runtime.metrics import enable_multiprocess, metrics
        metrics().count_enqueued("stream")
        try:
            enable_multiprocess(Path(sys.argv[1]))
        except RuntimeError as exc:
            print("refused:", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert "refused: enable_multiprocess() must run before" in done.stdout, done.stderr

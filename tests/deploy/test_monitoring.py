"""Prometheus alert rules, scrape configs and the Grafana dashboard, held to the package.

Every metric an alert or a panel queries must be one that sessionfold
(:mod:`sessionfold.runtime.metrics`) or Flower exports, with the labels it selects on; every job
it names must be scraped. With ``promtool`` present, the rules and configs pass Prometheus' own
checks, the alerts pass their unit tests (``deploy/prometheus/alerts.test.yml``: each fires on
what it names and stays quiet otherwise), and the dashboard's queries parse as PromQL.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / \
    "sessionfold.json"
#: The situations the alerts must cover (issue 5), and the alert that covers each.
REQUIRED_ALERTS = {
    "fold failures": "SessionfoldFoldsFailing",
    "dead letters": "SessionfoldDeadLetters",
    "scheduler lag": "SessionfoldSchedulerLagging",
    "sessions stuck over budget": "SessionfoldSessionsStuckOverBudget",
    "paused sessions past their budget (issue 9)": "SessionfoldPausedSessionsOverBudget",
}
#: Labels every scraped series carries besides its own.
TARGET_LABELS = {"job", "instance"}
#: Regexes that select the fold task by name (Flower labels task events with it).
_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                    "and", "or", "unless", "offset", "inf", "nan"}


# --- a small PromQL reader ----------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def selectors(expr: str) -> list[Selector]:
    """The vector selectors in ``expr``: metric names and their label matchers.

    Not a PromQL parser (promtool is, when installed): it blanks strings, drops grouping label
    lists and range/subquery brackets, and takes the identifiers that are not functions,
    aggregations or keywords. Enough to find the metric names a query depends on.
    """
    _balanced(expr)
    found: list[Selector] = []
    # Selectors with matchers, read before strings are blanked.
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", expr):
        matchers = tuple((m.group(1), m.group(2), m.group(3))
                         for m in _MATCHER.finditer(match.group(2)))
        found.append(Selector(match.group(1), matchers))
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    with_matchers = {s.metric for s in found}
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name in _PROMQL_KEYWORDS or name in with_matchers:
            continue
        found.append(Selector(name, ()))
    return found


def _balanced(expr: str) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in _STRING.sub('""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs:
            assert stack and stack.pop() == pairs[char], f"unbalanced {char!r} in: {expr}"
    assert not stack, f"unclosed {stack[-1]!r} in: {expr}"


def test_the_promql_reader_finds_metrics_and_matchers() -> None:
    expr = ('histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="x", le!~"1|2"}[5m]))) '
            '/ on(instance) group_left(job) b_total offset 5m > 1e-9 and absent(c)')
    assert {(s.metric, s.matchers) for s in selectors(expr)} == {
        ("a_bucket", (("job", "=", "x"), ("le", "!~", "1|2"))), ("b_total", ()), ("c", ())}
    with pytest.raises(AssertionError, match="unclosed"):
        selectors("sum(rate(x[5m])")


# --- what is exported ------------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    """The series names a metric family exposes, and its label names."""

    names: frozenset[str]
    labels: frozenset[str]
    kind: str


_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
             "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("", "_sum", "_count", "_created"), "info": ("_info",),
             "stateset": ("",), "enum": ("",), "unknown": ("",)}


def _exported(holder: object) -> dict[str, Exported]:
    """Every prometheus_client metric that is an attribute of ``holder``, by series name."""
    from prometheus_client.metrics import MetricWrapperBase

    out: dict[str, Exported] = {}
    for value in vars(holder).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        labels = frozenset(getattr(value, "_labelnames", ()))
        for family in value.describe():
            names = frozenset(family.name + s for s in _SUFFIXES[family.type])
            for name in names:
                extra = {"le"} if name.endswith("_bucket") else set()
                out[name] = Exported(names, labels | extra, family.type)
    return out


@pytest.fixture(scope="module")
def sessionfold_metrics() -> dict[str, Exported]:
    try:
        from sessionfold.runtime import metrics
    except ModuleNotFoundError as exc:
        if exc.name == "sessionfold.runtime.metrics":
            pytest.skip("sessionfold.runtime.metrics is not written yet")
        raise
    from prometheus_client import CollectorRegistry
    from sessionfold.service.metrics import ApiMetrics

    found = _exported(metrics.Metrics(CollectorRegistry()))
    found.update(_exported(ApiMetrics(CollectorRegistry())))  # the HTTP API's (issue 13)
    assert found, "sessionfold.runtime.metrics.Metrics holds no metric: teach this test more"
    return found


@pytest.fixture(scope="module")
def flower_metrics() -> dict[str, Exported]:
    from flower.events import get_prometheus_metrics

    return _exported(get_prometheus_metrics())


# --- the files -----------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def _panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def _dashboard_queries() -> list[tuple[str, str]]:
    """``(where, expr)`` of every query in the dashboard."""
    return [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
            for p in _panels(_dashboard()) for t in p.get("targets", [])]


def _queries() -> list[tuple[str, str]]:
    alerts = [(f"alert {r['alert']}", r["expr"]) for r in _rules()]
    return alerts + _dashboard_queries()


def _scrape_jobs(name: str) -> set[str]:
    doc = yaml.safe_load((PROM / name).read_text())
    return {job["job_name"] for job in doc["scrape_configs"]}


# --- alert rules ---------------------------------------------------------------------------


def test_the_alert_rules_cover_what_operators_must_hear_about() -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "alert names must be unique"
    for situation, alert in REQUIRED_ALERTS.items():
        assert alert in names, f"no alert for {situation}"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations",
                             "keep_firing_for"}, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"]) > 40, (
            f"{rule['alert']}: say what it means and what to look at")
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]


@pytest.mark.parametrize(("where", "expr"), _queries())
def test_queries_are_well_formed(where: str, expr: str) -> None:
    found = selectors(expr)
    assert found, f"{where}: selects no metric"
    for sel in found:
        assert sel.metric == "up" or sel.metric.startswith(("sessionfold_", "flower_")), (
            f"{where}: {sel.metric} is neither sessionfold's, Flower's nor Prometheus' up")


def test_every_sessionfold_metric_queried_is_exported(
        sessionfold_metrics: dict[str, Exported]) -> None:
    problems = []
    for where, expr in _queries():
        for sel in selectors(expr):
            if not sel.metric.startswith("sessionfold_"):
                continue
            exported = sessionfold_metrics.get(sel.metric)
            if exported is None:
                problems.append(f"{where}: {sel.metric} is not exported by runtime/metrics.py")
                continue
            unknown = {label for label, _, _ in sel.matchers} - exported.labels - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: {sel.metric} has no label {sorted(unknown)}")
    assert not problems, "\n".join(problems)


def test_every_flower_metric_queried_is_exported(flower_metrics: dict[str, Exported]) -> None:
    problems = []
    for where, expr in _queries():
        for sel in selectors(expr):
            if not sel.metric.startswith("flower_"):
                continue
            exported = flower_metrics.get(sel.metric)
            if exported is None:
                problems.append(f"{where}: Flower exports no {sel.metric}")
                continue
            unknown = {label for label, _, _ in sel.matchers} - exported.labels - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: {sel.metric} has no label {sorted(unknown)}")
    assert not problems, "\n".join(problems)


def test_label_values_match_what_the_package_records() -> None:
    """Outcomes, refusal reasons and the fold task's name, as queried, are the package's own."""
    from typing import get_args

    from sessionfold.core import window
    from sessionfold.workers.celery_app import FOLD_TASK

    outcomes = set(get_args(window.Outcome)) | {"error"}
    reasons = set(get_args(window.RefusalReason))
    for where, expr in _queries():
        for sel in selectors(expr):
            for label, op, value in sel.matchers:
                if label == "outcome" and op == "=":
                    assert value in outcomes, f"{where}: no outcome {value!r} ({outcomes})"
                if label == "reason" and sel.metric == "sessionfold_refusals_total":
                    assert value in reasons, f"{where}: no refusal reason {value!r}"
                if label == "task":
                    assert op == "=~" and re.fullmatch(value, FOLD_TASK), (
                        f"{where}: task{op}{value!r} does not select {FOLD_TASK}")


def test_queried_jobs_are_scraped_in_compose_and_kubernetes() -> None:
    compose, k8s = _scrape_jobs("prometheus.yml"), _scrape_jobs("prometheus-k8s.yml")
    assert compose == k8s, "one set of job names, so the alerts work in both"
    for where, expr in _queries():
        for sel in selectors(expr):
            for label, op, value in sel.matchers:
                if label == "job":
                    assert op == "=" and value in compose, f"{where}: job {value!r} is not scraped"


# --- promtool ------------------------------------------------------------------------------


def _promtool(promtool: str, *args: str, cwd: Path = PROM) -> str:
    proc = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{out}"
    return out


def test_promtool_accepts_the_alert_rules(promtool: str) -> None:
    out = _promtool(promtool, "check", "rules", "alerts.yml")
    assert f"SUCCESS: {len(_rules())} rules found" in out


def test_each_alert_fires_on_what_it_names_and_only_then(promtool: str) -> None:
    tests = yaml.safe_load((PROM / "alerts.test.yml").read_text())
    tested = {case["alertname"] for group in tests["tests"] for case in group["alert_rule_test"]
              if case["exp_alerts"]}
    assert tested == {r["alert"] for r in _rules()}, "every alert needs a firing unit test"
    _promtool(promtool, "test", "rules", "alerts.test.yml")


def test_promtool_accepts_the_compose_scrape_config(promtool: str) -> None:
    out = _promtool(promtool, "check", "config", "prometheus.yml")
    assert "1 rule files found" in out


def test_promtool_accepts_the_kubernetes_scrape_config(promtool: str, tmp_path: Path) -> None:
    """Debian's Prometheus is built without Kubernetes discovery, so the discovery blocks are
    swapped for static targets; everything else (relabelling, rule files) is checked as is."""
    doc = yaml.safe_load((PROM / "prometheus-k8s.yml").read_text())
    for job in doc["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs")
        assert [c["role"] for c in sd] == ["endpoints"], job["job_name"]
        job["static_configs"] = [{"targets": ["placeholder:9464"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(doc))
    shutil.copy(PROM / "alerts.yml", tmp_path / "alerts.yml")
    _promtool(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)


def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    """Each panel query, as a recording rule, goes through Prometheus' own PromQL parser
    (Grafana's ``$__rate_interval`` replaced by a duration)."""
    rules = [{"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
             for i, (_, expr) in enumerate(_dashboard_queries())]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "dashboard", "rules": rules}]}))
    out = _promtool(promtool, "check", "rules", "queries.yml", cwd=tmp_path)
    assert f"SUCCESS: {len(rules)} rules found" in out


# --- Grafana dashboard -------------------------------------------------------------------


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dash = _dashboard()
    assert dash["uid"] == "sessionfold" and dash["title"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert "id" not in dash or dash["id"] is None, "an id ties the JSON to one Grafana database"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dash):
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}, panel
        for ref in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert ref == {"type": "prometheus", "uid": "${datasource}"}, (
                f"panel {panel['title']!r}: select the datasource through the variable")
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def test_the_dashboard_panels_tile_the_grid() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in _panels(_dashboard()):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_the_dashboard_shows_folds_refusals_lag_and_cost(
        sessionfold_metrics: dict[str, Exported]) -> None:
    """Every metric the pipeline exports appears on the dashboard."""
    queried = {s.metric for _, expr in _dashboard_queries() for s in selectors(expr)}
    families = {min(e.names, key=len) for e in sessionfold_metrics.values()}
    missing = sorted(f for f in families
                     if not any(n in queried for n in sessionfold_metrics[f].names))
    assert not missing, f"exported but on no panel: {missing}"

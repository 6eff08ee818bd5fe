"""The Grafana dashboard and the Prometheus alert rules in deploy/ query only what is exported.

The exported names come from a real scrape: :class:`SemaphoreCollector` over a
real Redis holding a semaphore with holders, waiters, parked and handed-over
tasks, through prometheus_client's exposition format (``_total``, ``_bucket``,
``_sum``, ``_count`` included). A metric added to the collector later is picked
up with no change here; a query naming one that is not exported fails.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_semaphore import Semaphore
from celery_semaphore.core.constants import KEPT_PREFIX
from celery_semaphore.metrics import SemaphoreCollector
from devkit.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/celery-semaphore-dashboard.json"
RULES = ROOT / "deploy/prometheus/celery-semaphore-alerts.yml"
DOCS = ROOT / "docs/dashboard.md"
PROMETHEUS_OWN = {"up"}  # the series Prometheus adds to every scrape target
NAMESPACE = "celery_semaphore"

# PromQL, enough of it to find every vector selector: strings and range brackets
# are skipped whole, label lists after by/without/on/ignoring/group_* are not names
_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<range>\[[^\]]*\])
    |(?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:ms|[smhdwy])*)
    |(?P<variable>\$\{\w+\}|\$\w+)
    |(?P<ident>[a-zA-Z_:][\w:]*)
    |(?P<open_brace>\{)
    |(?P<space>\s+)
    |(?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
_AGGREGATIONS |= {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_KEYWORDS |= _LABEL_LISTS | _AGGREGATIONS


def selectors(expr: str) -> list[tuple[str | None, str]]:
    """Every vector selector of a PromQL expression: (metric name or None, its ``{...}``)."""
    tokens = [m for m in _TOKEN.finditer(expr) if m.lastgroup != "space"]
    found: list[tuple[str | None, str]] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i].lastgroup, tokens[i].group()
        after = tokens[i + 1].group() if i + 1 < len(tokens) else ""
        if kind == "ident" and text in _LABEL_LISTS and after == "(":
            while tokens[i].group() != ")":
                i += 1
        elif kind == "ident" and after != "(" and text not in _KEYWORDS:
            matchers = ""
            if after == "{":
                i, matchers = _matchers(expr, tokens, i + 1)
            found.append((text, matchers))
        elif kind == "open_brace":
            i, matchers = _matchers(expr, tokens, i)
            found.append((None, matchers))
        i += 1
    return found


def _matchers(expr: str, tokens: list[re.Match[str]], i: int) -> tuple[int, str]:
    """The index of the ``}`` closing the brace at token ``i`` (strings are single
    tokens, so a brace inside one does not count), and the text between them."""
    start = tokens[i].start()
    while tokens[i].group() != "}":
        i += 1
    return i, expr[start : tokens[i].end()]


def variable_query(query: Any) -> str:
    """The PromQL inside a Grafana query variable (``label_values(selector, label)``)."""
    text = query["query"] if isinstance(query, dict) else query
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", text, re.DOTALL)
    assert match, f"variable query {text!r}: expected label_values(metric{{...}}, label)"
    return match.group(1)


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def dashboard_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every PromQL text of the dashboard, keyed by where it is."""
    queries = {}
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            queries[f"panel {panel['title']!r} target {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries[f"variable {variable['name']}"] = variable_query(variable["query"])
    return queries


def rule_queries(rules: dict[str, Any]) -> dict[str, str]:
    return {
        f"alert {rule['alert']}": rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
    }


def unknown_metrics(queries: dict[str, str], exported: set[str]) -> list[str]:
    """One line per selector whose metric is not exported (or that names no metric)."""
    problems = []
    for where, expr in queries.items():
        found = selectors(expr)
        if not found:
            problems.append(f"{where}: no metric in {expr!r}")
        for name, _ in found:
            if name not in exported | PROMETHEUS_OWN:
                problems.append(f"{where}: {name or 'a selector without a metric name'}")
    return problems


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def load_rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """The sample names a scrape of a busy semaphore shows."""
    with RedisServer() as server:
        client = server.client()
        handed_over: list[Any] = []
        sem = Semaphore(client, "api", 2, namespace=NAMESPACE, on_handover=handed_over.extend)
        first = sem.try_acquire("a")
        assert first is not None
        assert sem.try_acquire("b") is not None
        assert sem.try_acquire("c") is None  # waits in place
        for holder in "def":
            sem.park(holder, f"payload-{holder}")
        first.release()  # hands the next parked ones over
        paced = Semaphore(client, "paced", 4, rate="1/m", namespace=NAMESPACE)
        assert paced.try_acquire("started") is not None
        assert paced.try_acquire("throttled") is None  # a permit is free: the rate says no
        paced.pause_rate(60)
        fair = Semaphore(client, "fair", 1, namespace=NAMESPACE)
        assert fair.try_acquire("holder") is not None
        for holder, key in (("x1", "x"), ("x2", "x"), ("y1", "y")):
            assert fair.try_acquire(holder, fair_key=key) is None
        fair.release("holder")
        assert fair.try_acquire("x1", fair_key="x") is not None  # a fair grant
        tried = Semaphore(
            client, "tried", 1, rate="1/m", shadow=["limit", "rate"], namespace=NAMESPACE
        )
        assert all(tried.try_acquire(f"t{i}") for i in range(3))  # over both: counted only
        kept = Semaphore(client, "kept", 3, namespace=NAMESPACE)
        permit = kept.try_acquire("ran", weight=2)
        assert permit is not None
        assert not isinstance(permit.keep(f"{KEPT_PREFIX}w|1|2|kept"), bool)
        assert kept.try_acquire("runs") is not None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SemaphoreCollector(client, NAMESPACE))
        text = generate_latest(registry).decode()
        client.close()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    busy = {s.name: s.value for s in samples if s.labels.get("semaphore") == "api"}
    for gauge in ("holders", "waiters", "parked", "handed_over"):
        assert busy[f"celery_semaphore_{gauge}"] > 0, gauge
    assert handed_over
    rated = {s.name: s.value for s in samples if s.labels.get("semaphore") == "paced"}
    for name in ("rate_per_second", "rate_paused_seconds", "throttled_total"):
        assert rated[f"celery_semaphore_{name}"] > 0, name
    fair_line = {
        (s.name, s.labels.get("weight_class")): s.value
        for s in samples
        if s.labels.get("semaphore") == "fair"
    }
    assert fair_line["celery_semaphore_fair_keys_waiting", None] == 2
    assert fair_line["celery_semaphore_fair_grants_total", "1"] == 1
    shadow = {s.name: s.value for s in samples if s.labels.get("semaphore") == "tried"}
    for name in ("limit_refusals_total", "rate_refusals_total", "rate_delay_seconds_total"):
        assert shadow[f"celery_semaphore_shadow_{name}"] == pytest.approx(
            {"rate_delay_seconds_total": 180}.get(name, 2), abs=1
        ), name
    assert shadow["celery_semaphore_shadow_limit_peak"] == 3
    idle = {s.name: s.value for s in samples if s.labels.get("semaphore") == "kept"}
    assert idle["celery_semaphore_holders"] == 3
    assert idle["celery_semaphore_kept_permits"] == 2  # of weight 2, kept between tasks
    assert busy["celery_semaphore_kept_permits"] == 0
    return {sample.name for sample in samples}


def test_the_fixture_sees_every_kind_of_sample(exported):
    assert {
        "celery_semaphore_holders",
        "celery_semaphore_acquire_attempts_total",
        "celery_semaphore_wait_seconds_bucket",
        "celery_semaphore_wait_seconds_sum",
        "celery_semaphore_wait_seconds_count",
    } <= exported


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            "histogram_quantile(0.95, max by (semaphore, le) (rate(celery_semaphore_wait_secnds"
            '_bucket{job=~"$job", semaphore=~"a{1}|b"}[$__rate_interval])))',
            [("celery_semaphore_wait_secnds_bucket", '{job=~"$job", semaphore=~"a{1}|b"}')],
        ),
        (
            "max by (semaphore) (holders) >= on (semaphore) group_left (x) limit > 1e3 "
            "and bool waiters offset 5m",
            [("holders", ""), ("limit", ""), ("waiters", "")],
        ),
        (
            'up{job="celery-semaphore"} == 0 or absent(up)',
            [("up", '{job="celery-semaphore"}'), ("up", "")],
        ),
        (
            '{__name__="celery_semaphore_holders"}',
            [(None, '{__name__="celery_semaphore_holders"}')],
        ),
        ("sum(rate(x[5m])) by (le) / 0.5", [("x", "")]),
    ],
)
def test_selectors_finds_every_metric_and_nothing_else(expr, expected):
    assert selectors(expr) == expected


def test_every_dashboard_query_names_an_exported_metric(exported):
    queries = dashboard_queries(load_dashboard())
    assert len(queries) >= 15
    assert unknown_metrics(queries, exported) == []


def test_every_alert_names_an_exported_metric(exported):
    queries = rule_queries(load_rules())
    assert len(queries) >= 7
    assert unknown_metrics(queries, exported) == []


def test_a_misspelt_or_unexported_metric_is_caught(exported):
    dashboard = load_dashboard()
    target = next(p for p in panels(dashboard) if p.get("targets"))["targets"][0]
    target["expr"] = target["expr"].replace("celery_semaphore_holders", "celery_semaphore_holder")
    dashboard["templating"]["list"][-1]["query"] = (
        "label_values(celery_semaphore_queue_depth, semaphore)"
    )
    problems = unknown_metrics(dashboard_queries(dashboard), exported)
    assert any(p.endswith(": celery_semaphore_holder") for p in problems), problems
    assert any(p.endswith(": celery_semaphore_queue_depth") for p in problems), problems
    rules = load_rules()
    rules["groups"][0]["rules"][-1]["expr"] = "celery_semaphore_drain == 1"
    assert unknown_metrics(rule_queries(rules), exported) == [
        f"alert {rules['groups'][0]['rules'][-1]['alert']}: celery_semaphore_drain"
    ]


def test_dashboard_is_an_importable_grafana_dashboard():
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    semaphore = variables["semaphore"]
    assert semaphore["type"] == "query" and semaphore["multi"] and semaphore["includeAll"]
    assert "$job" in variable_query(semaphore["query"])  # narrows with the job picked

    ids, cells = set(), set()
    shown = [p for p in panels(dashboard) if p["type"] != "row"]
    assert len(shown) >= 12
    for panel in panels(dashboard):
        assert panel["id"] not in ids, panel["title"]
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    for panel in shown:
        assert panel["type"] in {
            "timeseries",
            "state-timeline",
            "stat",
            "gauge",
            "bargauge",
            "table",
        }
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert target["expr"].strip() and "legendFormat" in target


def test_dashboard_queries_filter_by_the_variables_and_never_sum_across_workers():
    """Every worker serving metrics shows the same cluster-wide numbers: a sum across
    scrape targets would count them once per worker."""
    for where, expr in dashboard_queries(load_dashboard()).items():
        if where.startswith("panel"):
            assert not re.search(r"\bsum\b", expr), f"{where}: {expr}"
            for name, matchers in selectors(expr):
                assert 'semaphore=~"$semaphore"' in matchers, f"{where}: {name}{matchers}"
                assert 'job=~"$job"' in matchers, f"{where}: {name}{matchers}"


def test_alert_rules_have_what_prometheus_and_an_on_call_person_need():
    rules = load_rules()
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert all(group["name"] for group in rules["groups"])
    names = [rule["alert"] for rule in alerts]
    assert len(set(names)) == len(names)
    for rule in alerts:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert "celery -A proj semaphore" in rule["annotations"]["description"], rule["alert"]
        assert not re.search(r"\bsum\b", rule["expr"]), rule["alert"]


def test_the_docs_page_explains_every_alert_and_panel():
    page = DOCS.read_text(encoding="utf-8")
    for rule in rule_queries(load_rules()):
        assert rule.removeprefix("alert ") in page, rule
    for panel in panels(load_dashboard()):
        if panel["type"] != "row":
            assert panel["title"] in page, panel["title"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not on PATH")
def test_promtool_accepts_the_rules_and_every_dashboard_query(tmp_path):
    """``promtool check rules`` parses the alert rules, and the dashboard's queries
    (Grafana's variables filled in) written as recording rules."""
    checked = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    recorded = []
    for index, expr in enumerate(dashboard_queries(load_dashboard()).values()):
        filled = re.sub(r"\$(job|semaphore)\b", ".+", expr.replace("$__rate_interval", "1m"))
        recorded.append({"record": f"dashboard:query_{index}", "expr": filled})
    grafana = tmp_path / "dashboard-queries.yml"
    grafana.write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}), encoding="utf-8"
    )
    checked = subprocess.run(
        ["promtool", "check", "rules", str(grafana)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not on PATH")
def test_promtool_fires_the_rate_paused_alert_only_after_5_minutes_of_pauses(tmp_path):
    """``promtool test rules``: pauses of 25 s every other minute, served by two
    workers, fire CelerySemaphoreRatePausedLong once after 5 minutes; one pause of
    30 s does not."""
    rule = next(
        rule
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if rule["alert"] == "CelerySemaphoreRatePausedLong"
    )
    annotations = {
        key: value.replace("{{ $labels.semaphore }}", "partner-api")
        for key, value in rule["annotations"].items()
    }
    paused = "celery_semaphore_rate_paused_seconds"
    series = [
        {"series": f'{paused}{{semaphore="partner-api", instance="{worker}"}}',
         "values": "25 0 " * 5 + "25"}
        for worker in ("w1:9808", "w2:9808")
    ]  # fmt: skip
    series.append({"series": f'{paused}{{semaphore="emails", instance="w1:9808"}}',
                   "values": "30 " + "0 " * 10})  # fmt: skip
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": rule["alert"], "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": rule["alert"],
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "semaphore": "partner-api"},
                                "exp_annotations": annotations,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    tests = tmp_path / "rate-paused-test.yml"
    tests.write_text(yaml.safe_dump(test), encoding="utf-8")
    checked = subprocess.run(
        ["promtool", "test", "rules", str(tests)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

"""Prometheus config and rules (promtool), a real Prometheus scraping a worker, the dashboard."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.require import require_binary
from tests.services import REPO_ROOT
from worker import metrics

PROMETHEUS_DIR = REPO_ROOT / "infra" / "prometheus"
DASHBOARD = REPO_ROOT / "infra" / "grafana" / "framefleet.json"
INSTALL = "the prometheus package (apt-get install prometheus)"
METRIC = re.compile(r"\bframefleet_[a-z0-9_]+")
RECORDED = re.compile(r"\bframefleet:[a-z0-9_:]+")


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool", INSTALL)
    return subprocess.run(
        [binary, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def as_grafana_sends(expr: str, **variables: str) -> str:
    """``expr`` with the dashboard's variables replaced, as Grafana does before it queries
    (a variable at "All" becomes its allValue, ``.*``)."""
    values = {"__rate_interval": "1m", "tenant": ".*", "instance": ".*", **variables}
    for name, text in values.items():
        expr = expr.replace(f"${name}", text)
    return expr


def rule_exprs() -> tuple[list[str], set[str]]:
    """Every rule expression of alerts.yml, and the names it records."""
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    return [rule["expr"] for rule in rules], {rule["record"] for rule in rules if "record" in rule}


# --- promtool ---------------------------------------------------------------------------------


def test_prometheus_config_is_valid() -> None:
    checked = promtool("check", "config", PROMETHEUS_DIR / "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_alert_rules_are_valid() -> None:
    checked = promtool("check", "rules", PROMETHEUS_DIR / "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _alert(name: str, at: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels or {}}]}


def test_alerts_fire_on_the_situations_they_describe(tmp_path: Path) -> None:
    # Given synthetic series, one minute apart, for each situation an alert describes.
    worker = {"job": "framefleet-worker", "instance": "worker-gpu0:9400"}
    series = [
        # backlog growing by 10 jobs a minute
        {"series": 'framefleet_queue_depth{queue="video"}', "values": "0+10x60"},
        # GPU 0 idle all along, GPU 1 busy
        {"series": 'framefleet_gpu_utilization_ratio{instance="w0",gpu="0"}', "values": "0x60"},
        {"series": 'framefleet_gpu_utilization_ratio{instance="w1",gpu="1"}', "values": "0.9x60"},
        # 2 failures for every 10 successes: 1/6 of outcomes fail; cancelled jobs and retries
        # are neither (they must not dilute the ratio)
        {"series": 'framefleet_jobs_total{status="failure",reason="StorageError",tenant="t"}',
         "values": "0+1x60"},
        {"series": 'framefleet_jobs_total{status="failure",reason="InvalidJobError",'
                   'tenant="unknown"}', "values": "0+1x60"},
        {"series": 'framefleet_jobs_total{status="success",reason="",tenant="t"}',
         "values": "0+10x60"},
        {"series": 'framefleet_jobs_total{status="cancelled",reason="",tenant="t"}',
         "values": "0+50x60"},
        {"series": 'framefleet_job_retries_total{kind="retry",reason="StorageError",tenant="t"}',
         "values": "0+50x60"},
        # the oldest job waits longer and longer: 60 s older every minute, 900 s at 15m
        {"series": 'framefleet_queue_oldest_age_seconds{queue="video"}', "values": "0+60x60"},
        {"series": 'framefleet_queue_oldest_age_seconds{queue="other"}', "values": "0x60"},
        {"series": 'up{job="framefleet-worker",instance="worker-gpu0:9400"}', "values": "0x60"},
        {"series": 'up{job="framefleet-exporter",instance="exporter:9410"}', "values": "1x60"},
        # a worker saw a Redis without persistence
        {"series": 'framefleet_broker_persistent{instance="w0"}', "values": "0x60"},
        # 16 GPUs (two g7e.48xlarge) at $4.143/h each: $66.29/h, above the $50/h budget
        *[
            {"series": f'framefleet_gpu_cost_usd_per_hour{{instance="w{i}"}}', "values": "4.143x60"}
            for i in range(16)
        ],
    ]
    # promtool compares annotations too; the wording is not under test here, the logic is.
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    for rule in (r for g in groups["groups"] for r in g["rules"]):
        rule.pop("annotations", None)
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(groups))
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    _alert("FramefleetQueueBacklogGrowing", "40m"),
                    _alert("FramefleetGpuIdleWhileBacklog", "40m", {"instance": "w0", "gpu": "0"}),
                    _alert("FramefleetJobFailureRatioHigh", "40m"),
                    # over 900 s from 15m on, for 5 minutes: fires after 20m, only for "video"
                    _alert("FramefleetOldestJobWaitingTooLong", "22m", {"queue": "video"}),
                    {"eval_time": "19m", "alertname": "FramefleetOldestJobWaitingTooLong",
                     "exp_alerts": []},
                    _alert("FramefleetWorkerDown", "10m", worker),
                    _alert("FramefleetCostBurnAboveBudget", "45m"),
                    _alert("FramefleetBrokerNotPersistent", "20m", {"instance": "w0"}),
                    {"eval_time": "45m", "alertname": "FramefleetExporterDown", "exp_alerts": []},
                    {"eval_time": "4m", "alertname": "FramefleetWorkerDown", "exp_alerts": []},
                ],
            }
        ],
    }
    for case in tests["tests"][0]["alert_rule_test"]:  # type: ignore[index]
        for alert in case["exp_alerts"]:
            alert["exp_labels"].setdefault("severity", _severity(case["alertname"]))
    # And the failure ratio is exactly 2 / 12: cancelled jobs and retries are left out.
    tests["tests"][0]["promql_expr_test"] = [  # type: ignore[index]
        {"expr": "abs(framefleet:job_failure_ratio:rate15m - 2 / 12) < bool 1e-9",
         "eval_time": "30m", "exp_samples": [{"labels": "{}", "value": 1}]},
    ]
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests))
    tested = promtool("test", "rules", path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _severity(alertname: str) -> str:
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        if rule.get("alert") == alertname:
            return str(rule["labels"]["severity"])
    raise KeyError(alertname)


# --- dashboard --------------------------------------------------------------------------------


def test_grafana_dashboard_structure() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = " ".join(panel["title"].lower() for panel in panels)
    for topic in ("throughput", "stage latency", "gpu busy", "queue depth", "$ per video-minute",
                  "failure ratio", "queue wait p50 / p99", "oldest waiting job"):
        assert topic in titles
    # Worker and tenant variables, filled from the series, "All" by default.
    for name, source in (("instance", "up{"), ("tenant", "framefleet_jobs_total")):
        variable = variables[name]
        assert variable["type"] == "query" and source in variable["query"]["query"]
        assert variable["includeAll"] and variable["allValue"] == ".*"
    # Every query of a tenant-labelled series follows the tenant variable.
    labelled = ("framefleet_jobs_total", "framefleet_job_retries_total", "framefleet_queue_wait",
                "framefleet_gpu_held_seconds_total", "framefleet_cost_usd_total{")
    for expr in dashboard_exprs():
        if any(name in expr for name in labelled) and "framefleet:" not in expr:
            assert 'tenant=~"$tenant"' in expr, expr
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h"))
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["expr"].strip()
            assert target["datasource"]["uid"] == "${datasource}"


def test_dashboard_and_rules_use_only_metrics_the_worker_defines() -> None:
    defined = metrics.metric_names()
    exprs, recorded = rule_exprs()
    for expr in [*dashboard_exprs(), *exprs]:
        for name in METRIC.findall(expr):
            assert name in defined, (
                f"{name} (in {expr!r}) is defined neither in worker/metrics.py nor in producer/ops/"
            )
        for name in RECORDED.findall(expr):
            assert name in recorded, f"{name} (in {expr!r}) is not recorded in alerts.yml"

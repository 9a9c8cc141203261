"""Prometheus config and rules (promtool), a real Prometheus scraping a worker, the dashboard."""

from __future__ import annotations

import json
import math
import re
import secrets
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client import start_http_server

from producer import keys
from producer.app import ENQUEUED_AT_HEADER, TASK_NAME, make_app
from producer.cost import job_cost
from producer.cost.pricing import default_catalog, prices_for
from producer.ops import exporter
from producer.spec import JobResult, Manifest, SegmentInfo, StageTimings, WorkerInfo
from tests.require import require_binary
from tests.services import REPO_ROOT, _Process, free_ports
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


# --- a real Prometheus ------------------------------------------------------------------------


class PrometheusServer(_Process):
    """A throwaway ``prometheus`` on a loopback port, its TSDB in a temp folder."""

    def __init__(self, binary: str, workdir: Path, port: int, config: dict[str, Any]) -> None:
        super().__init__("prometheus", workdir / "prometheus.log")
        self.binary, self.workdir, self.port = binary, workdir, port
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}{path}{query}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read()) if path.startswith("/api/") else response.read()

    def _ready(self) -> bool:
        try:
            self.get("/-/ready")
            return True
        except OSError:
            return False

    def start(self, timeout: float = 60.0) -> float:
        argv = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self._spawn(argv, {"PATH": "/usr/bin:/bin"}, self.workdir)
        return self._wait_until(self._ready, timeout, "/-/ready")

    def wait_for(self, what: str, check: Any, timeout: float = 30.0) -> Any:
        """Poll ``check()`` until it returns something truthy; bounded by ``timeout``."""
        found = None

        def ready() -> bool:
            nonlocal found
            found = check()
            return bool(found)

        self._wait_until(ready, timeout, what, interval=0.25)
        return found


def _result(job_id: str, tenant: str) -> JobResult:
    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())
    cost = job_cost(
        tenant=tenant, prices=prices, gpu_seconds=8, s3_puts=2, stored_bytes=10**6, video_seconds=5
    )
    segment = SegmentInfo(
        index=0, uri="s3://b/k.mp4", first_frame=0, frames=80, bytes=10**6, sha256="0" * 64,
        seconds=5.0,
    )  # fmt: skip
    return JobResult(
        manifest=Manifest(
            job_id=job_id,
            tenant=tenant,
            spec_digest="0" * 64,
            segments=(segment,),
            frames=80,
            video_seconds=5.0,
            width=832,
            height=480,
            fps=16.0,
        ),
        manifest_uri="s3://b/manifest.json",
        timings=StageTimings(load_s=0.1, decode_s=6.0, encode_s=1.0, wall_s=8.0),
        worker=WorkerInfo(hostname="h", node="gpu0@h", pid=1, device="cuda:0"),
        cost=cost,
        finished_at=time.time(),
    )


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[PrometheusServer, int]]:
    """A real Prometheus scraping, every second, a worker metrics server and a fleet exporter
    server of this test process (the two registries, as the two jobs of prometheus.yml)."""
    binary = require_binary("prometheus", INSTALL)
    prom_port, metrics_port, exporter_port = free_ports(3)
    port = metrics.start_metrics_server(metrics_port, addr="127.0.0.1")
    exporter_server, _thread = start_http_server(
        exporter_port, addr="127.0.0.1", registry=exporter.EXPORTER_REGISTRY)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS_DIR / "alerts.yml")],
        "scrape_configs": [
            {
                "job_name": "framefleet-worker",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            },
            {
                "job_name": "framefleet-exporter",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
            },
        ],
    }
    server = PrometheusServer(binary, tmp_path, prom_port, config)
    try:
        server.start()
        yield server, port
    finally:
        server.stop()
        metrics.stop_metrics_server()
        exporter_server.shutdown()
        exporter_server.server_close()


def test_real_prometheus_scrapes_worker_metrics(
    prometheus: tuple[PrometheusServer, int], redis_url: str,
) -> None:
    server, _ = prometheus
    tenant = f"t{secrets.token_hex(4)}"
    queue = f"video-{secrets.token_hex(4)}"
    # When a worker reports two successful jobs, a failure and a retry, and three queue waits.
    metrics.observe_job("success", tenant, _result("j1", tenant))
    metrics.observe_job("success", tenant, _result("j2", tenant))
    metrics.observe_job("failure", tenant, None, reason="StorageError")
    metrics.observe_retry("retry", tenant, "StorageError")
    for seconds in (0.3, 0.4, 1500.0):
        metrics.observe_queue_wait(tenant, seconds)
    # And the exporter finds a job waiting for 20 minutes.
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        app.send_task(TASK_NAME, args=[{}], queue=queue,
                      headers={ENQUEUED_AT_HEADER: time.time() - 1200})
        exporter.export_once(client, [queue])
    finally:
        client.delete(*keys.queue_lists(queue))
        client.close()
        app.close()

    def query(expr: str) -> list[dict[str, Any]]:
        answer = server.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", expr
        return list(answer["data"]["result"])

    def jobs() -> dict[tuple[str, str], float]:
        data = query(f'framefleet_jobs_total{{tenant="{tenant}"}}')
        return {(r["metric"]["status"], r["metric"].get("reason", "")): float(r["value"][1])
                for r in data}

    # Then Prometheus scraped them: the counters hold the values the worker counted, and
    # the retry is not an outcome.
    counted = server.wait_for("the observed jobs in a scrape", lambda: len(jobs()) == 2 and jobs())
    assert counted == {("success", ""): 2.0, ("failure", "StorageError"): 1.0}
    retries = query(f'framefleet_job_retries_total{{tenant="{tenant}"}}')
    assert [(r["metric"]["kind"], float(r["value"][1])) for r in retries] == [("retry", 1.0)]
    up = query('up{job="framefleet-worker"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    # The queue wait histogram: 2 of 3 waits under 0.5 s, the third in (1200, 1800].
    buckets = {r["metric"]["le"]: float(r["value"][1]) for r in query(
        f'framefleet_queue_wait_seconds_bucket{{tenant="{tenant}"}}')}
    assert (buckets["0.5"], buckets["1200.0"], buckets["1800.0"]) == (2.0, 2.0, 3.0)
    age = server.wait_for("the oldest job's age in a scrape", lambda: query(
        f'framefleet_queue_oldest_age_seconds{{queue="{queue}"}}'))
    assert float(age[0]["value"][1]) == pytest.approx(1200, abs=5)

    # And the shipped rules load and evaluate without errors against real series.
    def rules_ok() -> list[dict[str, Any]] | None:
        groups = server.get("/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None

    rules = server.wait_for("every rule evaluated with health ok", rules_ok)
    assert {"FramefleetWorkerDown", "FramefleetCostBurnAboveBudget",
            "FramefleetOldestJobWaitingTooLong"} <= {r["name"] for r in rules}
    # The oldest-job alert sees the 20-minute wait (pending: it needs 5 minutes to fire).
    pending = server.wait_for("the oldest-job alert pending", lambda: [
        a for a in server.get("/api/v1/alerts")["data"]["alerts"]
        if a["labels"]["alertname"] == "FramefleetOldestJobWaitingTooLong"
        and a["labels"].get("queue") == queue])
    assert pending[0]["state"] == "pending"

    # And every dashboard query is valid PromQL for this server, at "All" and for one tenant.
    for expr in dashboard_exprs():
        query(as_grafana_sends(expr))
        query(as_grafana_sends(expr, tenant=tenant))
    # The dashboard's failure ratio, for this tenant, once more jobs end after the first
    # scrape (a rate needs an increase of a series already scraped): 1 failure of 3 ended
    # jobs; a cancel is neither.
    metrics.observe_job("success", tenant, None)
    metrics.observe_job("success", tenant, None)
    metrics.observe_job("cancelled", tenant, None)
    metrics.observe_job("failure", tenant, None, reason="StorageError")
    ratio_expr = as_grafana_sends(next(
        t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
        if p["title"] == "Failure ratio" for t in p["targets"]), tenant=tenant)

    def ratio() -> float | None:
        result = query(ratio_expr)
        value = float(result[0]["value"][1]) if result else math.nan
        return None if math.isnan(value) else value

    assert server.wait_for("a failure ratio from two scrapes", ratio) == pytest.approx(1 / 3)

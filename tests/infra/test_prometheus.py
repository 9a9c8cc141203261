"""A real Prometheus (Debian package) scrapes a worker's /metrics on loopback."""

from __future__ import annotations

import json
import math
import secrets
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

from producer.app import ENQUEUED_AT_HEADER, TASK_NAME, make_app
from producer.cost import job_cost
from producer.cost.pricing import default_catalog, prices_for
from producer.ops import exporter
from producer.state import keys
from producer.wire.spec import JobResult, Manifest, SegmentInfo, StageTimings, WorkerInfo
from tests.infra.test_observability import (
    DASHBOARD,
    INSTALL,
    PROMETHEUS_DIR,
    as_grafana_sends,
    dashboard_exprs,
)
from tests.require import require_binary
from tests.services import _Process, free_ports
from worker import metrics


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

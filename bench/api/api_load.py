"""Load check of ``framefleet api`` on loopback: two gateway replicas on one Redis and one
SeaweedFS, 50 concurrent submits, then 200 concurrent ``GET /v1/videos/{id}``, spread over
both replicas. Records p50/p99 latency and the error count, with the command, date and machine.

No worker runs: the jobs stay queued, so this measures the gateway (auth, rate limit, Redis
records, the client's state read), not the fleet. Bounded: 250 requests, one pass.

    .venv/bin/python bench/api/api_load.py            # writes bench/results/api-load-cpu.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import machine, write_json
from tests.gateway import GatewayProcess, write_keys, write_models
from tests.services import RedisServer, S3Server

SUBMITS, GETS = 50, 200


def timed(method: str, url: str, headers: dict[str, str], body: bytes | None = None,
          ) -> tuple[float, int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data, status = r.read(), int(r.status)
    except urllib.error.HTTPError as e:
        data, status = e.read(), e.code
    except OSError as e:
        data, status = str(e).encode(), 0
    return time.perf_counter() - start, status, data


def burst(calls: list[tuple[str, str, dict[str, str], bytes | None]]) -> list[tuple[float, int,
                                                                                     bytes]]:
    """All ``calls`` at once: one thread each, released together."""
    gate = threading.Barrier(len(calls))

    def one(call: tuple[str, str, dict[str, str], bytes | None]) -> tuple[float, int, bytes]:
        gate.wait()
        return timed(*call)

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def summary(results: list[tuple[float, int, bytes]], ok: int) -> dict[str, Any]:
    ms = sorted(r[0] * 1000 for r in results)
    return {"requests": len(ms), "errors": sum(1 for r in results if r[1] != ok),
            "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
            "max_ms": round(ms[-1], 1)}


def run(out: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ff-api-load-"))
    redis_bin = shutil.which("redis-server")
    weed = shutil.which("weed", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert redis_bin and weed, "needs redis-server and weed (make install-test)"
    redis, s3 = RedisServer(redis_bin, tmp / "redis"), S3Server(weed, tmp / "s3")
    gateways: list[GatewayProcess] = []
    try:
        redis.start()
        s3.start()
        bucket = f"ff-load-{secrets.token_hex(4)}"
        s3.client().create_bucket(Bucket=bucket)
        keys = write_keys(tmp / "keys.toml", {"load": {"rate_per_minute": 100_000,
                                                       "max_in_flight": 1000}})
        models = write_models(tmp / "models.json", {"tiny": {
            "folder": "/models/tiny", "size": "48x32", "seconds": "0.5", "steps": 2}})
        env = {"FRAMEFLEET_BROKER_URL": redis.url, "FRAMEFLEET_RESULT_BACKEND": redis.url,
               "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "AWS_ACCESS_KEY_ID": s3.access_key,
               "AWS_SECRET_ACCESS_KEY": s3.secret_key,
               "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{bucket}/out",
               "FRAMEFLEET_API_KEYS_FILE": str(tmp / "keys.toml"),
               "FRAMEFLEET_API_MODELS_FILE": str(models)}
        gateways = [GatewayProcess(tmp, env, f"gateway-{i}") for i in range(2)]
        for g in gateways:
            g.start()
        h = {**keys["load"].headers, "Content-Type": "application/json"}
        body = json.dumps({"model": "tiny", "prompt": "load"}).encode()
        submits = burst([("POST", f"{gateways[i % 2].url}/v1/videos", h, body)
                         for i in range(SUBMITS)])
        ids = [json.loads(r[2])["id"] for r in submits if r[1] == 200]
        gets = burst([("GET", f"{gateways[i % 2].url}/v1/videos/{ids[i % len(ids)]}",
                       keys["load"].headers, None) for i in range(GETS)])
        # Both replicas answer for every job: a job made through one is read through the other.
        same = all(json.loads(r[2])["id"] == ids[i % len(ids)] for i, r in enumerate(gets)
                   if r[1] == 200)
    finally:
        for g in gateways:
            g.stop()
        s3.stop()
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "command": "python bench/api/api_load.py", "date": datetime.now(UTC).isoformat(
            timespec="seconds"),
        "machine": machine(),
        "setup": "2 gateway replicas (uvicorn, one process each), 1 Redis, 1 SeaweedFS, "
                 "loopback; no worker (jobs stay queued); requests alternate replicas",
        "submits": {"concurrent": SUBMITS, **summary(submits, 200)},
        "gets": {"concurrent": GETS, **summary(gets, 200)},
        "cross_replica_reads_consistent": same,
    }
    write_json(out / "api-load-cpu.json", result)
    rows = [f"| {name} | {r['concurrent']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | "
            f"{r['errors']} |" for name, r in (("POST /v1/videos", result["submits"]),
                                                ("GET /v1/videos/{id}", result["gets"]))]
    (out / "api-load-cpu.md").write_text("\n".join([
        "# framefleet api: loopback load check", "",
        f"`{result['command']}`, {result['date']}, {result['machine']['platform']}, "
        f"{result['machine']['cpus']} CPUs.", "", result["setup"] + ".", "",
        "| request | concurrent | p50 ms | p99 ms | max ms | errors |",
        "|---|---|---|---|---|---|", *rows, "",
        f"Reads through either replica gave the job made through the other: {same}.", ""]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    result = run(parser.parse_args().out)
    print(json.dumps({k: result[k] for k in ("submits", "gets")}, indent=2))


if __name__ == "__main__":
    main()

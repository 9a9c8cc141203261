"""The three runs of ``queue_bench.py``: submit→start latency through a probed worker, submit
throughput (the client, raw sends, the variants) and a profile of the submit loop."""

from __future__ import annotations

import contextlib
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import redis

from bench.fleet.queue_probe import EVENTS_KEY, URL_ENV, now
from bench.fleet.queue_variants import PATHS, Patch, client_submit_many, send_raw, submit_many
from producer.client import Client
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec
from tests.services import WorkerProcess


class ProbedWorker(WorkerProcess):
    """The tests' worker command line plus the timestamp probe."""

    def argv(self) -> list[str]:
        return [*super().argv(), "-I", "bench.fleet.queue_probe"]


def summary(values_s: list[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean/min of seconds, in ms (percentiles interpolated, inclusive)."""
    ms = sorted(v * 1000 for v in values_s)
    q = statistics.quantiles(ms * 2 if len(ms) == 1 else ms, n=100, method="inclusive")
    return {"p50_ms": round(statistics.median(ms), 3), "p90_ms": round(q[89], 3),
            "p99_ms": round(q[98], 3), "max_ms": round(ms[-1], 3),
            "mean_ms": round(statistics.fmean(ms), 3), "min_ms": round(ms[0], 3), "n": len(ms)}


def base_spec(input_uri: str, output_uri: str) -> JobSpec:
    return JobSpec(job_id="bench-0", tenant="bench", input=InputSpec(uri=input_uri),
                   decoder=DecoderSpec(name="pattern"), video=VideoSpec(segment_frames=48),
                   output=OutputSpec(uri=output_uri))


def specs(base: JobSpec, prefix: str, n: int) -> list[JobSpec]:
    return [base.model_copy(update={"job_id": f"{prefix}-{i:06d}"}) for i in range(n)]


# --- 1. latency ---------------------------------------------------------------------------


def wait_end(r: redis.Redis, job_id: str, seen: dict[str, dict[str, Any]],
             timeout: float = 60.0) -> None:
    """Read probe records into ``seen`` until ``job_id`` ended; fail on a failed job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = r.blpop([EVENTS_KEY], timeout=1)
        if item is None:
            continue
        event, task_id, at, state = json.loads(item[1])
        seen.setdefault(task_id, {})[event] = at
        if event == "end":
            if state != "SUCCESS":
                raise RuntimeError(f"job {task_id} ended in {state}")
            if task_id == job_id:
                return
    raise TimeoutError(f"job {job_id} did not end within {timeout:.0f} s")


def run_latency(url: str, tmp: Path, n: int, warmup: int, idle_s: float, long_n: int
                ) -> dict[str, Any]:
    latents = tmp / "latents.npy"
    np.save(latents, np.zeros((16, 1, 8, 8), dtype=np.float32))
    base = base_spec(latents.as_uri(), (tmp / "out").as_uri())
    env = {"FRAMEFLEET_BROKER_URL": url, "FRAMEFLEET_RESULT_BACKEND": url,
           "FRAMEFLEET_DEVICE": "cpu", "FRAMEFLEET_METRICS_PORT": "0",
           "FRAMEFLEET_WORK_DIR": str(tmp / "work"), "CUDA_VISIBLE_DEVICES": "", URL_ENV: url,
           "FRAMEFLEET_FILE_ROOTS": str(tmp)}
    (tmp / "work").mkdir()
    # (label, idle before submit): the long idles pass kombu's 1 s BRPOP timeout at ten
    # phases, so a job may land while the worker re-issues its BRPOP.
    plan = ([("warmup", idle_s)] * warmup + [("idle", idle_s)] * n
            + [("long_idle", 1.0 + (k % 10) / 10) for k in range(long_n)])
    worker = ProbedWorker("bench", tmp / "logs", env)
    r = redis.Redis.from_url(url)
    client = Client(url, url)
    rows: dict[str, list[tuple[float, ...]]] = {"idle": [], "long_idle": []}
    worker.start()
    try:
        ready_s = worker.wait_ready(120)
        seen: dict[str, dict[str, Any]] = {}
        for spec, (label, idle) in zip(specs(base, "lat", len(plan)), plan, strict=True):
            time.sleep(idle)
            t0 = now()
            client.submit(spec)
            t1 = now()
            try:
                wait_end(r, spec.key, seen)
            except (RuntimeError, TimeoutError) as e:
                raise RuntimeError(f"{e}; worker log tail:\n{worker.log_text()[-3000:]}") from e
            ev = seen[spec.key]
            if label in rows:
                rows[label].append((t0, t1, ev["received"], ev["start"], ev["end"]))
    finally:
        worker.stop(30)
        r.close()
    out: dict[str, Any] = {
        "jobs": n, "warmup_jobs": warmup, "idle_gap_ms": idle_s * 1000,
        "worker_ready_s": round(ready_s, 2),
        "job": "pattern decoder, 1 frame 64x64, file:// in and out",
    }
    for label, sets in rows.items():
        if not sets:
            continue
        prefix = "" if label == "idle" else "long_idle_"
        out[prefix + "submit_to_start"] = summary([s - t0 for t0, _, _, s, _ in sets])
        out[prefix + "submit_call"] = summary([t1 - t0 for t0, t1, _, _, _ in sets])
        out[prefix + "submit_to_received"] = summary([rc - t0 for t0, _, rc, _, _ in sets])
        out[prefix + "received_to_start"] = summary([s - rc for _, _, rc, s, _ in sets])
        out[prefix + "run"] = summary([e - s for _, _, _, s, e in sets])
    return out


# --- 2. throughput ------------------------------------------------------------------------

@contextlib.contextmanager
def fresh_db(url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(url)
    try:
        r.flushdb()
        yield r
    finally:
        r.flushdb()
        r.close()


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def timed(url: str, key: str, conf: dict[str, Any], patches: list[Patch],
          jobs: list[JobSpec]) -> tuple[float, float, float]:
    """Submit ``jobs`` one after another from a fresh, warmed-up Client.

    Returns wall, this process's CPU and redis-server's CPU seconds: on a shared host the
    wall moves with other load, the CPU seconds much less.
    """
    with fresh_db(url) as r:
        client = Client(url, url)
        client.app.conf.update(conf)
        for patch in patches:
            patch(client)
        send = send_raw(client) if key == "raw_send_task" else client.submit
        send(jobs[0].model_copy(update={"job_id": f"{jobs[0].job_id}-warm"}))
        server0 = redis_cpu(r)
        cpu0, start = time.process_time(), time.perf_counter()
        if key == "submit_many":
            submit_many(client, jobs)
        elif key == "client_submit_many":
            client_submit_many(client, jobs)
        else:
            for spec in jobs:
                send(spec)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        server = redis_cpu(r) - server0
        queued = sum(int(r.llen(k)) for k in r.keys("video*"))
        client.app.close()
    if queued != len(jobs) + 1:
        raise RuntimeError(f"{key}: {queued} messages queued, expected {len(jobs) + 1}")
    return wall, cpu, server


def run_throughput(url: str, n: int, n_variant: int, rounds: int, base: JobSpec,
                   n_bulk: int = 0) -> dict[str, Any]:
    """The first two paths submit ``n`` jobs, the shipped bulk path ``n_bulk`` (0: skipped),
    the variants ``n_variant`` (0: skipped), in ``rounds`` interleaved rounds (order rotated
    each round), so a load change on the host hits all paths alike."""
    paths = [p for i, p in enumerate(PATHS)
             if i < 2 or (p[0] == "client_submit_many" and n_bulk > 0)
             or (i > 2 and n_variant > 0)]
    counts = {"client_submit": n, "raw_send_task": n, "client_submit_many": n_bulk}
    per_path = {key: max(1, counts.get(key, n_variant) // rounds) for key, *_ in paths}
    walls: dict[str, list[tuple[float, float, float]]] = {key: [] for key, *_ in paths}
    for rnd in range(rounds):
        order = paths[rnd % len(paths):] + paths[: rnd % len(paths)]
        for key, _, conf, patches in order:
            jobs = specs(base, f"{key}-{rnd}", per_path[key])
            walls[key].append(timed(url, key, conf, patches, jobs))
    out: dict[str, Any] = {"rounds": rounds}
    for key, what, conf, patches in paths:
        wall, cpu, server = (sum(col) for col in zip(*walls[key], strict=True))
        per = per_path[key]
        rates = [per / w for w, _, _ in walls[key]]
        total = per * rounds
        out[key] = {"what": what, "jobs": total, "wall_s": round(wall, 3),
                    "jobs_per_s": round(total / wall, 1),
                    "us_per_job": round(wall / total * 1e6, 1),
                    "client_cpu_us_per_job": round(cpu / total * 1e6, 1),
                    "redis_cpu_us_per_job": round(server / total * 1e6, 1),
                    "round_jobs_per_s_min": round(min(rates), 1),
                    "round_jobs_per_s_max": round(max(rates), 1),
                    "conf": conf, "patches": [p.__name__ for p in patches]}
    for field, name in (("us_per_job", "registry_cost_us_per_job"),
                        ("client_cpu_us_per_job", "registry_client_cpu_us_per_job")):
        out[name] = round(out["client_submit"][field] - out["raw_send_task"][field], 1)
    return out


# --- 3. profile ---------------------------------------------------------------------------

#: Where the time of one submit goes: (label, file fragment, function), cumulative per call.
BREAKDOWN = [
    ("Client.submit", "producer/client/client.py", "submit"),
    ("JobSpec.digest", "producer/wire/spec.py", "digest"),
    ("JobSpec.model_dump", "pydantic/main.py", "model_dump"),
    ("registry SET NX (claim)", "producer/state/control.py", "claim"),
    ("cancel flag DEL (clear_cancel)", "producer/state/control.py", "clear_cancel"),
    ("app.send_task", "celery/app/base.py", "send_task"),
    ("backend.on_task_call (SUBSCRIBE)", "celery/backends/redis.py", "on_task_call"),
    ("amqp.create_task_message", "celery/app/amqp.py", "as_task_v2"),
    ("amqp.send_task_message", "celery/app/amqp.py", "send_task_message"),
    ("kombu Producer.publish", "kombu/messaging.py", "_publish"),
    ("exchange table SMEMBERS (get_table; kombu caches it)", "kombu/transport/redis.py",
     "get_table"),
    ("LPUSH (_put)", "kombu/transport/redis.py", "_put"),
    ("task-sent event (EventDispatcher.publish)", "celery/events/dispatcher.py", "publish"),
    ("redis-py execute_command (all round trips)", "redis/client.py", "execute_command"),
    ("socket recv (waiting on Redis)", "~", "<method 'recv' of '_socket.socket' objects>"),
    ("socket sendall", "~", "<method 'sendall' of '_socket.socket' objects>"),
]


def run_profile(url: str, n: int, base: JobSpec) -> dict[str, Any]:
    with fresh_db(url):
        client = Client(url, url)
        jobs = specs(base, "prof", n)
        client.submit(jobs[0].model_copy(update={"job_id": "warm-connection"}))
        prof = cProfile.Profile()
        prof.enable()
        for spec in jobs:
            client.submit(spec)
        prof.disable()
        client.app.close()
    stats = pstats.Stats(prof)
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in table.values())
    rows = []
    for label, fragment, func in BREAKDOWN:
        keys = [k for k in table if k[2] == func and fragment in k[0]]
        cum = sum(table[k][3] for k in keys)
        calls = sum(table[k][1] for k in keys)
        rows.append({"what": label, "us_per_submit": round(cum / n * 1e6, 1),
                     "calls_per_submit": round(calls / n, 2)})
    top = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:15]
    return {
        "jobs": n, "profiled_us_per_submit": round(total / n * 1e6, 1),
        "note": "cProfile inflates Python-heavy code; compare shares, not absolute times",
        "breakdown": rows,
        "top_tottime": [{"function": f"{Path(k[0]).name}:{k[1]}({k[2]})",
                         "us_per_submit": round(v[2] / n * 1e6, 1),
                         "calls_per_submit": round(v[1] / n, 2)} for k, v in top],
    }

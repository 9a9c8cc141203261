"""The storm's parts: its jobs and fault schedule drawn from one seed, the fault-free reference
of each job shape, and a scraper that adds up every worker process's job counts.

A seed fixes the jobs (ids, shapes, route: gateway or client), the fault schedule (times,
kinds, targets) and the cancelled jobs; ``FRAMEFLEET_STORM_SEED`` reruns one exactly. What the
operating system makes of the same schedule (which job a kill lands on) differs run to run.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec

#: The tiny job shapes (latent frames, height, width, frames per segment): a job is one of them.
SHAPES = ((2, 8, 12, 4), (3, 8, 12, 8), (4, 8, 12, 8))
#: Faults of a full storm, per kind (the smoke storm of ``make test`` runs fewer).
FULL_FAULTS = {"kill-pool": 5, "kill-host": 2, "restart-redis": 2, "stop-s3": 1,
               "pause-s3": 2, "restart-gateway": 1, "cancel": 3}
SMOKE_FAULTS = {"kill-pool": 1, "restart-redis": 1, "pause-s3": 1, "cancel": 1}
#: Jobs each cancel fault cancels.
CANCELS_PER_FAULT = 4


def seed_from_env() -> int:
    raw = os.environ.get("FRAMEFLEET_STORM_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


@dataclass(frozen=True)
class StormJob:
    job_id: str
    shape: int  # index in SHAPES
    via: str  # "gateway" or "client"


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the storm's start
    kind: str
    target: int  # which host / pool / gateway replica, or which jobs (cancel)


@dataclass
class Plan:
    seed: int
    jobs: list[StormJob]
    faults: list[Fault]
    cancels: dict[int, list[str]]  # fault index → the job ids it cancels

    @classmethod
    def draw(cls, seed: int, n_jobs: int, faults: dict[str, int], window_s: float) -> Plan:
        rng = random.Random(seed)
        jobs = [StormJob(f"s{seed % 100000}-{i}", rng.randrange(len(SHAPES)),
                         "gateway" if i % 2 == 0 else "client") for i in range(n_jobs)]
        drawn = sorted((Fault(round(rng.uniform(3.0, window_s), 1), kind, rng.randrange(1000))
                        for kind, k in faults.items() for _ in range(k)),
                       key=lambda f: (f.at_s, f.kind))
        # Cancel the jobs submitted in the 1.5 s after the fault, as soon as each is accepted
        # (submissions are paced over the window): a tiny job is done a second later.
        cancels = {}
        for i, f in enumerate(drawn):
            if f.kind == "cancel":
                recent = [j for n, j in enumerate(jobs)
                          if f.at_s <= submit_at(n, n_jobs, window_s) <= f.at_s + 1.5]
                cancels[i] = [j.job_id for j in rng.sample(recent,
                                                           min(CANCELS_PER_FAULT, len(recent)))]
        return cls(seed, jobs, drawn, cancels)

    def describe(self) -> str:
        lines = [f"seed {self.seed}: {len(self.jobs)} jobs "
                 f"({sum(j.via == 'gateway' for j in self.jobs)} through the gateway), "
                 f"{len(self.faults)} faults"]
        lines += [f"  t+{f.at_s:6.1f} s  {f.kind:<16} target {f.target}"
                  + (f"  jobs {', '.join(self.cancels[i])}" if i in self.cancels else "")
                  for i, f in enumerate(self.faults)]
        return "\n".join(lines)


#: A final state and the ledger's name for it.
END = {"SUCCESS": "success", "FAILURE": "failure", "REVOKED": "cancelled"}


def ledger_problems(records: list[Any], statuses: dict[str, str]) -> list[str]:
    """Each final job has exactly one ledger record, with its end."""
    per_job: dict[str, list[str]] = {}
    for r in records:
        per_job.setdefault(r.key, []).append(r.status)
    return [f"{key}: {status}, ledger {per_job.get(key)}" for key, status in statuses.items()
            if status in END and per_job.get(key) != [END[status]]]


def submit_at(index: int, n_jobs: int, window_s: float) -> float:
    """When job ``index`` is submitted, in seconds after the start: evenly over 90 % of the
    fault window, so that faults land on jobs queued and running."""
    return 0.9 * window_s * index / max(1, n_jobs)


def latents(shape: int) -> np.ndarray:
    lf, h, w, _ = SHAPES[shape]
    z = torch.randn(16, lf, h, w, generator=torch.Generator().manual_seed(shape))
    return z.numpy()


def reference_hashes(tmp: Path) -> dict[int, list[str]]:
    """sha256 of each segment of a fault-free in-process run of each shape (the pattern
    decoder and the encoder are deterministic: every job of a shape must match)."""
    from worker.run import DecoderCache, run_job

    out: dict[int, list[str]] = {}
    for shape, (_, _, _, segment_frames) in enumerate(SHAPES):
        np.save(tmp / f"ref-{shape}.npy", latents(shape))
        spec = JobSpec(job_id=f"ref-{shape}", input=InputSpec(uri=(tmp / f"ref-{shape}.npy")
                                                                  .as_uri()),
                       decoder=DecoderSpec(name="pattern"),
                       video=VideoSpec(segment_frames=segment_frames),
                       output=OutputSpec(uri=(tmp / "ref-out").as_uri()))
        result = run_job(spec, DecoderCache(torch.device("cpu")))
        folder = tmp / "ref-out" / spec.tenant / spec.job_id
        hashes = [hashlib.sha256((folder / Path(s.uri).name).read_bytes()).hexdigest()
                  for s in result.manifest.segments]
        assert hashes == [s.sha256 for s in result.manifest.segments]
        out[shape] = hashes
    return out


_SAMPLE = re.compile(r'^framefleet_jobs_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
_START = re.compile(r"^process_start_time_seconds ([0-9.e+]+)$", re.M)


class Scraper(threading.Thread):
    """Scrapes every worker's ``/metrics`` every ``period_s`` and keeps, per process
    incarnation (port and start time), the last ``framefleet_jobs_total`` per status: a
    SIGKILLed pool process's counts die with it, so the sum over incarnations is what the
    fleet counted (a count in the last ``period_s`` before a kill is missed)."""

    def __init__(self, ports: list[int], period_s: float = 0.5) -> None:
        super().__init__(name="storm-scraper", daemon=True)
        self.ports, self.period_s = ports, period_s
        self.counts: dict[tuple[int, float], dict[str, float]] = {}
        self.stop_event = threading.Event()

    def scrape_once(self) -> None:
        for port in self.ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            start = _START.search(text)
            if start is None:
                continue
            per: dict[str, float] = {}
            for labels, value in _SAMPLE.findall(text):
                status = re.search(r'status="([^"]+)"', labels)
                if status:
                    per[status[1]] = per.get(status[1], 0.0) + float(value)
            self.counts[(port, float(start[1]))] = per

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.scrape_once()
            self.stop_event.wait(self.period_s)

    def totals(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for per in self.counts.values():
            for status, value in per.items():
                total[status] = total.get(status, 0.0) + value
        return total

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
        self.scrape_once()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def now() -> float:
    return time.monotonic()


def summary(plan: Plan, f: dict[str, Any]) -> str:
    delays = f["delays"]
    return (f"storm seed {plan.seed}: {len(plan.jobs)} jobs, {len(plan.faults)} faults, "
            f"ends {f['ends']}, counted {f['counted']}, ledger records {f['records']}, "
            f"lost {len(f['open'])}, open playlists {f['open_playlists']}, "
            f"redelivery p50 {percentile(delays, 0.5):.1f} s p99 {percentile(delays, 0.99):.1f} s "
            f"(n={len(delays)}), sent again by the reconciler {f['resent']}, requeued by the "
            f"sweep {f['requeued']}, storm {f['storm_s']:.0f} s, problems {len(f['problems'])}")


def results_md(plan: Plan, log: list[str], f: dict[str, Any]) -> str:
    """``bench/results/storm-cpu.md``: the command, the figures and the fault schedule."""
    delays = f["delays"]
    gateway = sum(j.via == "gateway" for j in plan.jobs)
    rows = "\n".join(f"| {fault.at_s:.1f} | {fault.kind} | {done} |"
                     for fault, done in zip(plan.faults, log, strict=True))
    p50, p99 = percentile(delays, 0.5), percentile(delays, 0.99)
    problems = "\n".join("- " + p for p in f["problems"]) or "none"
    return f"""# Storm on CPU ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)

Command (from the repo root; `make chaos` runs it with the rest):

    FRAMEFLEET_CHAOS_FULL=1 FRAMEFLEET_STORM_SEED={plan.seed} \\
        python -m pytest -m chaos tests/e2e/test_storm.py

Machine: 2 cores, shared with other test runs. Real Redis (append-only, fsync always),
SeaweedFS (`weed mini`), two gateway replicas, three CPU workers on two hosts (2 + 1),
`FRAMEFLEET_RECONCILE_AFTER_S=10`, the host-loss sweep at its defaults (2 s, 10 s grace).

## Figures

| | |
|---|---|
| seed | {plan.seed} |
| jobs | {len(plan.jobs)} ({gateway} through the gateway, the rest through the client) |
| faults | {len(plan.faults)} |
| ends | {f["ends"]} |
| lost | {len(f["open"])} |
| ledger records | {f["records"]} |
| `framefleet_jobs_total` scraped (sum over process lives) | {f["counted"]} |
| playlists left open | {f["open_playlists"]} |
| redelivery after a kill, p50 / p99 (n) | {p50:.1f} s / {p99:.1f} s ({len(delays)}) |
| sent again by the lost-message reconciler | {f["resent"]} |
| requeued by the host-loss sweep | {f["requeued"]} |
| storm, first submit to every job final | {f["storm_s"]:.0f} s |
| problems | {len(f["problems"])} |

Counts of a pool process killed within the scrape period (0.5 s) of an end die with it
(Prometheus counters live in the process), so the scraped sum may fall short of the ends; it
never exceeds them.

## Fault schedule (drawn from the seed)

A fault starts at its planned time or, if the one before still runs, when it ends.

| planned t (s) | fault | what happened |
|---|---|---|
{rows}

## Problems

{problems}
"""

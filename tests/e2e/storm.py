"""The storm's plan and references: its jobs and fault schedule drawn from one seed, and the
fault-free reference of each job shape.

A seed fixes the jobs (ids, shapes, route: gateway or client), the fault schedule (times,
kinds, targets, how long a partition or a slow link holds, a slow link's rate) and the
cancelled jobs; ``FRAMEFLEET_STORM_SEED`` reruns one exactly. What the operating system makes
of the same schedule (which job a kill or a cut lands on) differs run to run.

Faults run in lanes: the fleet's lane (kills, outages, cancels) and one lane per worker host
(its partitions and slow links: one at a time, so that a heal ends only its own cut). In a
lane a fault starts at its planned time or, if the one before still runs, when it ends.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec

#: The tiny job shapes (latent frames, height, width, frames per segment): a job is one of them.
SHAPES = ((2, 8, 12, 4), (3, 8, 12, 8), (4, 8, 12, 8))
#: Each fault kind and its category (the storm's goal counts faults per category).
CATEGORY = {
    "kill-pool": "kills", "kill-host": "kills",
    "restart-redis": "outages", "stop-s3": "outages", "pause-s3": "outages",
    "restart-gateway": "outages",
    "cut-redis": "partitions", "cut-s3": "partitions",
    "slow-s3": "slow links",
    "cancel": "cancels",
}  # fmt: skip
#: The kinds that hit one host's network path (in the host's lane).
NET_KINDS = frozenset({"cut-redis", "cut-s3", "slow-s3"})
#: Faults of a full storm, per kind: 40 or more of each category but the cancels.
FULL_FAULTS = {"kill-pool": 28, "kill-host": 12, "restart-redis": 12, "stop-s3": 8,
               "pause-s3": 12, "restart-gateway": 8, "cut-redis": 24, "cut-s3": 16,
               "slow-s3": 40, "cancel": 8}
#: The smoke storm of ``make test``: one partition among them.
SMOKE_FAULTS = {"kill-pool": 1, "restart-redis": 1, "cut-redis": 1, "cancel": 1}
#: How long each network fault holds, in seconds (drawn in the range): a cut from Redis
#: outlasts the lease (10 s) and the sweep's grace, so the host is taken for lost and its run
#: becomes a zombie; a cut from S3 alone or a slow link is over in seconds.
HOLD_S = {"cut-redis": (12.0, 15.0), "cut-s3": (2.0, 6.0), "slow-s3": (3.0, 8.0)}
#: A slow link's rates: from under the fencing bound's 256 kbit/s (an upload times out and is
#: retried) to a few times over it.
RATES = ("64kbit", "256kbit", "1mbit")
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
    at_s: float  # planned start, seconds after the storm's start
    kind: str
    target: int  # which host / pool / gateway replica
    hold_s: float = 0.0  # how long a partition or a slow link holds
    rate: str = ""  # a slow link's rate

    def lane(self, n_hosts: int) -> str:
        """``fleet``, or ``host<i>`` for a fault of host ``i``'s network path."""
        return f"host{self.target % n_hosts}" if self.kind in NET_KINDS else "fleet"

    def host_index(self, n_hosts: int) -> int:
        return self.target % n_hosts


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
        drawn = []
        for kind, k in faults.items():
            for _ in range(k):
                at, target = round(rng.uniform(3.0, window_s), 1), rng.randrange(1000)
                low, high = HOLD_S.get(kind, (0.0, 0.0))
                rate = rng.choice(RATES) if kind == "slow-s3" else ""
                drawn.append(Fault(at, kind, target, round(rng.uniform(low, high), 1), rate))
        drawn.sort(key=lambda f: (f.at_s, f.kind))
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

    def lanes(self, n_hosts: int) -> dict[str, list[int]]:
        """Lane name → the indices of its faults, in order."""
        out: dict[str, list[int]] = {}
        for i, f in enumerate(self.faults):
            out.setdefault(f.lane(n_hosts), []).append(i)
        return out

    def per_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[CATEGORY[f.kind]] = out.get(CATEGORY[f.kind], 0) + 1
        return out

    def describe(self, n_hosts: int) -> str:
        lines = [f"seed {self.seed}: {len(self.jobs)} jobs "
                 f"({sum(j.via == 'gateway' for j in self.jobs)} through the gateway), "
                 f"{len(self.faults)} faults {self.per_category()}"]
        lines += [f"  t+{f.at_s:6.1f} s  {f.kind:<16} {f.lane(n_hosts):<6} target {f.target}"
                  + (f"  {f.hold_s:.1f} s" if f.hold_s else "") + (f" {f.rate}" if f.rate else "")
                  + (f"  jobs {', '.join(self.cancels[i])}" if i in self.cancels else "")
                  for i, f in enumerate(self.faults)]
        return "\n".join(lines)


#: A final state and the ledger's name for it.
END = {"SUCCESS": "success", "FAILURE": "failure", "REVOKED": "cancelled"}


def ledger_problems(records: list[Any], statuses: dict[str, str]) -> list[str]:
    """Each final job has exactly one ledger record, with its end."""
    per_job: dict[str, list[str]] = {}
    nodes: dict[str, list[str]] = {}
    for r in records:
        per_job.setdefault(r.key, []).append(r.status)
        nodes.setdefault(r.key, []).append(r.node)
    return [f"{key}: {status}, ledger {per_job.get(key)} (written by {nodes.get(key)})"
            for key, status in statuses.items()
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

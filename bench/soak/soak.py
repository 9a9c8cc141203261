"""GPU soak: the real worker process on one GPU, a real Redis, the real client, mixed traffic.

Starts a throwaway ``redis-server`` and one worker process (``celery -A bench.soak.soak_worker
worker``, the real worker with random-weight models resident from its start: see that module),
then submits the mix of ``bench/soak/soak_plan.py`` through ``producer.client.Client`` until it has
run at least ``--minutes`` and ``--jobs`` jobs, and checks every end:

- each job ends as planned (SUCCESS, REVOKED for the cancel, FAILURE of the planned class);
- every output: the manifest's frame count, every segment decodable with PyAV with that many
  frames in all, the saved latents finite; jobs of one group (same seed, tier, inputs) have
  identical segments (sha256) and latents;
- no non-finite output reported as SUCCESS (a SUCCESS whose latents are not finite counts);
- per job: queue wait, GPU-seconds, denoise and decode seconds, cost; GPU memory (torch's
  allocated and reserved, scraped from the worker's /metrics after each job);
- the worker's main process never dies, and its pool process at most where a job was meant to
  push it (the job over the memory limit: its latents are refused before they are read, so
  the pool process normally stays).

Writes ``soak-<device>.json`` and ``.md`` under ``--out`` and prints a short table. ``--tiny``
runs the same on the CPU with the tiny presets and the GPU's tiers (the fp8 jobs are planned to
end in the worker's refusal: no float8 units), for CI and for checking the script before device
time is spent. ``--warm-sizes none`` starts the worker in seconds on a cold compile cache (its
denoise then runs eager); ``--budget-s`` ends the run, drain included, within a device call.
``--artifacts DIR`` (with ``--warm-sizes all``, the production default: compiled denoise and
decode graphs) starts the worker with an empty compile cache from the compile artifacts that
``soak_prime.py --artifacts DIR`` wrote (``STAGE=prime``): each size and graph is a hit or a
miss in the report (``compiled``), and the worker should be ready within 30 s
(``ready_within_30s``). On the CPU (``--tiny``) the big model's first size compiles, with
inductor's C++ backend, the rest runs eager: a CPU compile takes a minute.

  python bench/soak/soak.py --minutes 8 --jobs 40 --out bench/results          # on a CUDA host
  python bench/soak/soak.py --tiny --minutes 1 --jobs 12 --out /tmp/soak        # CPU
  python bench/soak/soak.py --warm-sizes none --budget-s 550 --out DIR   # one 10-minute call
  python bench/soak/soak.py --artifacts /tmp/ff-artifacts --out DIR  # after soak_prime.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import write_json
from bench.soak import soak_check, soak_inputs
from bench.soak.soak_plan import Item, round_items
from producer.client import Client
from producer.errors import JobCancelled, JobFailed

#: Seconds kept at the end of ``--budget-s`` for the jobs still queued (at most 3) to end and
#: the worker and Redis to stop.
DRAIN_S = 50.0


def start_redis(binary: str, lib: str | None, folder: Path, port: int) -> subprocess.Popen[bytes]:
    """A throwaway redis-server on loopback (``lib``: a folder of its shared libraries, for a
    binary carried to a host without the package)."""
    env = {**os.environ, **({"LD_LIBRARY_PATH": lib} if lib else {})}
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder)], env=env,
                            stdout=(folder / "redis.log").open("wb"), stderr=subprocess.STDOUT)
    import redis

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=port).ping():
                return proc
        except redis.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server did not start: {(folder / 'redis.log').read_text()}")


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "celery", "-A", "bench.soak.soak_worker", "worker", "-Q", "video",
            "-c", "1", "--prefetch-multiplier", "1", "-n", "soak@%h", "-E", "-l", "INFO",
            "--without-gossip", "--without-mingle"]
    return subprocess.Popen(argv, env={**os.environ, **env}, cwd=Path(__file__).parents[2],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


class Soak:
    """Submits the plan's rounds, watches every job to its end, records each end."""

    def __init__(self, client: Client, setup: Any, args: argparse.Namespace,
                 metrics_url: str, worker: subprocess.Popen[bytes]) -> None:
        self.client, self.setup, self.args = client, setup, args
        self.metrics_url, self.worker = metrics_url, worker
        self.records: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def done(self) -> bool:
        """Enough minutes and jobs, or no time left to submit more."""
        return ((self.elapsed() >= self.args.minutes * 60 and len(self.records) >= self.args.jobs)
                or self.elapsed() >= self.args.max_minutes * 60)

    def run(self) -> None:
        r = 0
        while not self.done():
            r += 1
            items = round_items(self.setup, r)
            pending: list[tuple[Item, Any, float]] = []
            for n, item in enumerate(items):
                if self.elapsed() >= self.args.max_minutes * 60:
                    break
                if item.behind_denoise and pending:
                    soak_check.wait_denoising(pending[-1][1], timeout=600)
                # at most 3 queued: decode jobs arrive behind a denoise, not all at once
                while len(pending) >= 3:
                    self._collect(pending, block=True)
                handle = self.client.submit(item.spec)
                pending.append((item, handle, time.time()))
                if item.kind == "cancel":
                    soak_check.cancel_in_denoise(self.client, handle, timeout=600)
                print(f"[{self.elapsed():6.1f} s] round {r} job {n + 1}/{len(items)}: "
                      f"{item.spec.key} ({item.kind})", flush=True)
            while pending:
                self._collect(pending, block=True)
            if self.worker.poll() is not None:
                print(f"worker process exited with {self.worker.returncode}", flush=True)
                return

    def _collect(self, pending: list[tuple[Item, Any, float]], block: bool) -> None:
        """Note the start of every pending job and record the ones that ended; with
        ``block``, wait a little when none did."""
        ended = 0
        for entry in list(pending):
            item, handle, submitted = entry
            state = handle.state()
            if not state.finished:
                soak_check.note_start(item, state, submitted)
                continue
            pending.remove(entry)
            self.records.append(self._end(item, handle, submitted))
            ended += 1
        if block and not ended:
            time.sleep(0.1)

    def _end(self, item: Item, handle: Any, submitted: float) -> dict[str, Any]:
        record: dict[str, Any] = {"job": item.spec.key, "kind": item.kind, "group": item.group,
                                  "expect": item.expect, **item.meta,
                                  "queue_wait_s": item.meta.get("queue_wait_s")}
        try:
            result = handle.result()
            record.update(soak_check.describe(result, item))
            record["end"] = "success"
        except JobCancelled:
            record["end"] = "cancelled"
        except JobFailed as e:
            record["end"] = f"failure:{e.kind}"
            record["error"] = e.message[:300]
        record["as_planned"] = soak_check.as_planned(item.expect, record["end"])
        record["gpu_memory"] = soak_check.scrape_memory(self.metrics_url)
        record["t_s"] = round(self.elapsed(), 1)
        partial = Path(self.args.out) / "soak-partial.json"  # what a killed run leaves
        write_json(partial, [*self.records, record])
        print(f"[{self.elapsed():6.1f} s] {item.spec.key}: {record['end']}"
              f"{'' if record['as_planned'] else ' (NOT AS PLANNED)'}", flush=True)
        return record


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--max-minutes", type=float, default=9.0)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--tiny", action="store_true", help="CPU, the tiny presets")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    ap.add_argument("--redis-lib", default=None, help="LD_LIBRARY_PATH for --redis-server")
    ap.add_argument("--prime", action="store_true",
                    help="start the worker (compiling every size into the compile cache), "
                    "then stop: a later run on the same host starts in seconds")
    ap.add_argument("--warm-sizes", choices=["all", "none"], default="all",
                    help="all: the worker compiles every size before it is ready (minutes a "
                    "size with a cold compile cache); none: it compiles nothing, its "
                    "transformers run eager (FRAMEFLEET_COMPILED_SIZES=0): ready in seconds")
    ap.add_argument("--artifacts", default=None, metavar="DIR",
                    help="compile artifacts of soak_prime.py --artifacts: the worker starts "
                    "from them with an empty compile cache (with --warm-sizes all)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds this script may run in all: after the worker's start, no "
                    f"job is submitted later than the budget less {DRAIN_S:.0f} s (the drain)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", default=None, help="file name (default soak-<device>.json)")
    args = ap.parse_args()
    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ff-soak-"))
    ports = soak_inputs.free_ports(2)
    redis_proc = start_redis(args.redis_server, args.redis_lib, work, ports[0])
    url = f"redis://127.0.0.1:{ports[0]}/0"
    setup, env = soak_inputs.prepare(work, args.tiny)
    if args.warm_sizes == "none":
        env.update({"FRAMEFLEET_SOAK_SIZES": "", "FRAMEFLEET_COMPILED_SIZES": "0"})
    elif args.artifacts:
        if not Path(args.artifacts).is_dir():
            raise SystemExit(f"--artifacts {args.artifacts}: no such folder (soak_prime.py "
                             "--artifacts writes it: STAGE=prime)")
        env.update(soak_inputs.from_artifacts(Path(args.artifacts), work, setup, args.tiny))
    env.update({"FRAMEFLEET_BROKER_URL": url, "FRAMEFLEET_RESULT_BACKEND": url,
                "FRAMEFLEET_METRICS_PORT": str(ports[1]), "PYTHONUNBUFFERED": "1"})
    log = out / "soak-worker.log"
    worker = start_worker(env, log)
    try:
        ready_s = soak_inputs.wait_ready(worker, log, f"http://127.0.0.1:{ports[1]}/metrics")
        print(f"worker ready in {ready_s:.1f} s (sizes warmed: {args.warm_sizes})", flush=True)
        if args.budget_s is not None:  # the budget's end, less the last jobs' drain
            cut = (args.budget_s - (time.monotonic() - started) - DRAIN_S) / 60
            args.max_minutes = min(args.max_minutes, cut)
            print(f"submitting for at most {args.max_minutes:.2f} minutes", flush=True)
        if args.prime:
            return 0
        soak_inputs.size_hog(setup, worker.pid, args.tiny)
        client = Client(broker_url=url, backend_url=url)
        soak = Soak(client, setup, args, f"http://127.0.0.1:{ports[1]}/metrics", worker)
        soak.run()
        doc = soak_check.report(soak.records, args, ready_s, worker, soak.elapsed(), log)
        doc.update(soak_check.compiled(log, args, ready_s))
        # written before the teardown: a call's time limit may end that, not the results
        soak_check.write(doc, out / (args.json or f"soak-{doc['device_short']}.json"))
    finally:
        with contextlib.suppress(ProcessLookupError):  # a worker that never started is gone
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""One job's run, Celery-free: ``run_job(spec, decoders, run)``.

- ``run``: ``Run``, what the run's parts and the task's concerns share (hooks, the playlist);
- ``source``: the latents, loaded or generated;
- ``publish``: each finished segment stored, listed in the live playlist, announced;
- ``finish``: the manifest (last), the ``JobResult``, timings and cost; an earlier complete
  output reused;
- ``decoders``: the decoders and models a worker process keeps;
- ``runner``: the three parts in order.
"""

from worker.run.decoders import DecoderCache, default_decoders
from worker.run.finish import MANIFEST
from worker.run.run import CostFn, Run
from worker.run.runner import run_job

__all__ = ["MANIFEST", "CostFn", "DecoderCache", "Run", "default_decoders", "run_job"]

"""framefleet's GPU side: everything that runs on a worker host.

- ``main``: the Celery worker entry point (``celery -A worker.lifecycle.main worker``);
  ``launcher``: one worker process per GPU, pinned and supervised.
- ``tasks``: the task body (parse, claim, lease, run, result); ``concerns``: what surrounds a
  run (progress, cancel and preemption, the OOM fallback, retries, metrics); ``lease``: one
  run per job at a time; ``consumer``: Celery's consumer, hardened against non-messages.
- ``runner``: one job end to end, without Celery; ``inputs``: latents loading;
  ``devices``: which device decodes.
- ``pipeline``: the asynchronous frame pipeline; ``decoders``: what turns latents into frames.
- ``encode``: PyAV H.264 segments; ``storage``: ``file://`` and ``s3://`` stores.
- ``metrics``: the worker's Prometheus series; ``spot``: EC2 spot interruption notices;
  ``ops``: what runs once per fleet (the queue-depth exporter), in the producer image.

Importing a module here never initialises CUDA: only the pool process that runs tasks does.
See ARCHITECTURE.md for how the parts fit together.
"""

from worker import quiet

# Before any module here imports torchao, diffusers or transformers: their known start-up
# noise (worker/quiet.py says why each is noise) is dropped, nothing else they log.
quiet.install()

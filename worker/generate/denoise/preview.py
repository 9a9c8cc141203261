"""Previews while a job denoises, the device's part: the model's estimate of the clean video
after a step (x0), projected to a small RGB clip without the VAE, on its way to the host.

- **x0.** Wan's schedulers are flow matching (diffusers' UniPC and DPM++ with
  ``prediction_type="flow_prediction"``, FlowMatchEuler): x_t = (1 − σ_t)·x0 + σ_t·ε and the
  transformer predicts the velocity v = ε − x0, so x0 = x_t − σ_t·v. diffusers' pipelines hand
  the scheduler exactly these at ``scheduler.step(v, t, x_t)`` (v guided, with CFG on) and
  keep σ_t in ``scheduler.sigmas[step_index]``; :func:`watch_x0` reads them there, on the
  job's own scheduler, before the step runs, and never changes the step: the latents are bit
  for bit those of a run without previews. (UniPC computes the same x0 inside its step, as
  its ``model_outputs[-1]``; the tests hold the two together.)
- **RGB.** One 3×C matrix and bias per latent format (``worker.generate.denoise.latent_rgb``), one
  small matmul on x0 in the transformer's (normalised) space, to uint8 (T, h, w, 3): one pixel
  per latent cell. The writer upsamples it while it encodes (``worker.pipeline.clip``).
- **To the host.** The clip is copied non-blocking into one of a few pinned buffers and an
  event is recorded after it; the writer thread waits on that event alone. The job thread never
  waits on the device for a preview (a device-wide synchronisation would stall the denoise); when
  every buffer is still in use, that preview is skipped and the next one comes.

A preview that cannot be made (no factors for the format, an error) never stops the denoise:
the error goes to the sink's ``failed`` and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from producer.wire.spec import GenerateSpec
from worker.generate.denoise.latent_rgb import rgb_factors
from worker.generate.request.folder import ModelInfo

log = logging.getLogger(__name__)
#: Pinned buffers per job: previews on their way to (or in) the writer at once.
SLOTS = 3


@dataclass
class Shot:
    """One preview on its way to the host: the clip after denoise step ``step``."""

    step: int
    steps: int
    host: torch.Tensor  # (T, h, w, 3) uint8, pinned on CUDA
    release: Callable[[], None] = field(default=lambda: None)
    #: CUDA: the events before the projection and after the copy; None on the CPU.
    events: tuple[Any, Any] | None = None
    cpu_s: float = 0.0  # the projection's seconds where it ran synchronously (the CPU)

    def take(self) -> tuple[np.ndarray, float]:
        """Wait for the copy (its event only), then the clip (a copy) and the seconds the
        projection took on the device; the buffer is free again."""
        try:
            if self.events is None:
                return self.host.numpy().copy(), self.cpu_s
            start, done = self.events
            done.synchronize()
            return self.host.numpy().copy(), start.elapsed_time(done) / 1000.0
        finally:
            self.release()


class PreviewSink(Protocol):
    """Where the previews go (``worker.run.previews``): never blocks the caller."""

    def offer(self, shot: Shot) -> bool:
        """Take ``shot`` for the writer; False when it cannot (the shot is then dropped)."""
        ...

    def failed(self, error: BaseException) -> None:
        """A preview could not be made: count it; the next one tries again."""
        ...


class Previews:
    """Makes a preview after the first denoise step and after every ``every``-th one, and
    offers it to ``sink``: the first one shows the video's layout at once (a 20-step job,
    every 2: after steps 1, 2, 4, … 20)."""

    def __init__(self, every: int, sink: PreviewSink) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.sink = every, sink
        self.skipped = 0
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()  # the writer gives buffers back from its thread

    def start(self, channels: int, shape: tuple[int, int, int], device: torch.device) -> bool:
        """Before the loop (the device is idle): the factors on ``device`` and the host
        buffers of a (T, h, w) latent grid. False, logged, when the format has no factors."""
        factors = rgb_factors(channels)
        if factors is None:
            log.warning("no latent→RGB factors for %d latent channels: no previews", channels)
            return False
        weight, bias = factors
        self._weight = torch.tensor(weight, dtype=torch.float32).to(device)
        self._bias = torch.tensor(bias, dtype=torch.float32).to(device)
        pin = device.type == "cuda"
        self._free = [torch.empty((*shape, 3), dtype=torch.uint8, pin_memory=pin)
                      for _ in range(SLOTS)]
        return True

    def wants(self, step: int) -> bool:
        """Whether denoise step ``step`` (1-based: steps done) makes a preview."""
        return self._weight is not None and (step == 1 or step % self.every == 0)

    def __call__(self, step: int, steps: int, x0: torch.Tensor) -> None:
        """x0 (1, C, T, h, w) after ``step`` of ``steps``: project, copy, offer. Never raises."""
        try:
            self._shoot(step, steps, x0)
        except Exception as e:  # noqa: BLE001 - a preview never stops the denoise
            log.warning("preview of step %d not made: %s", step, e)
            self.sink.failed(e)

    def _shoot(self, step: int, steps: int, x0: torch.Tensor) -> None:
        with self._lock:
            host = self._free.pop() if self._free else None
        if host is None:
            self.skipped += 1
            return
        try:
            taken = self.sink.offer(self._project(step, steps, x0, host))
        except BaseException:
            self._give_back(host)
            raise
        if not taken:
            self.skipped += 1
            self._give_back(host)

    def _project(self, step: int, steps: int, x0: torch.Tensor, host: torch.Tensor) -> Shot:
        """x0 → uint8 RGB in ``host``, queued on the device (CUDA: non-blocking, marked by
        an event)."""
        assert self._weight is not None and self._bias is not None
        if tuple(host.shape[:3]) != tuple(x0.shape[2:]):
            raise ValueError(f"latents {tuple(x0.shape)} are not the grid {tuple(host.shape)}")
        cuda = x0.device.type == "cuda"
        t0 = time.perf_counter()
        events = None
        if cuda:
            # the writer sleeps in the driver on the second (blocking) event, never spins
            events = (torch.cuda.Event(enable_timing=True),
                      torch.cuda.Event(enable_timing=True, blocking=True))
            events[0].record()
        rgb = torch.einsum("oc,cthw->thwo", self._weight, x0[0].float()) + self._bias
        clip = ((rgb + 1.0) * 127.5).round_().clamp_(0, 255).to(torch.uint8)
        host.copy_(clip, non_blocking=cuda)
        if events is not None:
            events[1].record()
        return Shot(step, steps, host, release=lambda: self._give_back(host), events=events,
                    cpu_s=0.0 if cuda else time.perf_counter() - t0)

    def _give_back(self, host: torch.Tensor) -> None:
        with self._lock:
            self._free.append(host)


def attach(previews: Previews, run: Any, gen: GenerateSpec, info: ModelInfo,
           device: torch.device) -> bool:
    """Make ``previews`` during ``run`` (a job's pipeline, before its call): start them for
    the job's latent grid and watch its scheduler. False (logged) when they cannot be made."""
    if not flow_scheduler(run.scheduler):
        log.warning("%s is not a flow-matching scheduler: no previews",
                    type(run.scheduler).__name__)
        return False
    grid = ((gen.num_frames - 1) // info.temporal_factor + 1,
            gen.height // info.spatial_factor, gen.width // info.spatial_factor)
    if not previews.start(run.vae.config.z_dim, grid, device):
        return False
    watch_x0(run.scheduler, previews, gen.num_inference_steps)
    return True


def flow_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` is a flow-matching one (its x0 is x_t − σ_t·v)."""
    kind = getattr(scheduler.config, "prediction_type", None)
    return kind == "flow_prediction" or (
        kind is None and type(scheduler).__name__.startswith("FlowMatch"))


def watch_x0(scheduler: Any, previews: Previews, steps: int) -> None:
    """Hand ``previews`` x0 = x_t − σ_t·v at every step it wants, read at the job's own
    ``scheduler``'s ``step`` (an instance attribute: the class and other jobs' schedulers are
    untouched) before the step runs. ``steps``: the loop's length, for the announcement."""
    inner = scheduler.step

    def step(model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args: Any,
             **kwargs: Any) -> Any:
        index = scheduler.step_index
        if index is None:  # the first call: the pipeline set the begin index (0)
            index = scheduler.begin_index or 0
        if previews.wants(index + 1):
            sigma = scheduler.sigmas[index]
            # a CPU scalar (UniPC keeps its sigmas there) as a float: no copy to the device
            sigma = float(sigma) if sigma.device.type == "cpu" else sigma.to(sample.device)
            previews(index + 1, steps, sample.float() - sigma * model_output.float())
        return inner(model_output, timestep, sample, *args, **kwargs)

    scheduler.step = step

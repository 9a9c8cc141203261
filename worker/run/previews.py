"""A generate run's previews: encoded, stored and announced on a writer thread of their own.

The device's part (``worker.generate.denoise.preview``) offers each preview as it is made, after a
denoise step. ``offer`` never blocks: a preview that finds the writer's queue full is dropped
(the next one comes). The writer waits for the preview's copy to reach the host (on its event
alone), encodes the clip (``worker.pipeline.clip``: the latent grid, ``SCALE`` times larger, one
frame per latent frame) and stores it under the job's output as ``previews/step-NNNN.mp4``,
then as ``previews/latest.mp4`` with one PUT: S3 replaces an object whole and ``file://``
writes a temporary file and renames it, so a reader gets the previous preview or the new one,
never half of one. Then it announces it (``Run.preview_landed``: progress, webhooks).

Never in the way: a preview that fails (an encode error, the store down) is logged and counted
(``Run.preview_failed``: the metrics), and the next one tries again; the job goes on.
``close`` ends the writer before the job's end is decided: on a success before the manifest
(which is written last), on a failure or a cancel with the queued previews dropped, so no
preview is stored or announced after a job's final state.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from types import TracebackType

from producer.wire.spec import PREVIEW_LATEST, PreviewInfo, preview_name
from worker.generate.denoise.preview import Previews, Shot
from worker.pipeline.clip import encode_clip
from worker.run.run import Run
from worker.stores.storage import JobOutput

log = logging.getLogger(__name__)
#: A preview's size: the latent grid times this (Wan2.1 at 832x480: 416x240).
SCALE = 4
#: Previews waiting for the writer; one more is dropped.
QUEUE = 2
#: How long ``close`` waits for a preview being stored (the store's own timeouts bound it).
CLOSE_TIMEOUT_S = 30.0


class PreviewPublisher:
    """The writer of one run's previews (``every`` 0: none, and no thread)."""

    def __init__(self, run: Run, out: JobOutput, every: int) -> None:
        self.run, self.out, self.every = run, out, every
        self.published = self.failures = 0
        self._step_bytes = self._latest_bytes = 0
        self.gpu_s = self.encode_s = 0.0
        self._queue: queue.Queue[Shot | None] = queue.Queue()
        self._stopped = False
        self._thread: threading.Thread | None = None
        if every:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"framefleet-previews-{run.spec.job_id}")
            self._thread.start()

    @classmethod
    def for_run(cls, run: Run, out: JobOutput) -> PreviewPublisher:
        """The run's writer: every ``generate.preview.every`` steps, or the worker's
        ``FRAMEFLEET_PREVIEW_EVERY`` when the job does not say; none for a decode job."""
        gen = run.spec.generate
        every = 0 if gen is None else (
            gen.preview.every if gen.preview is not None else run.settings.preview_every)
        return cls(run, out, every)

    def previews(self) -> Previews | None:
        """The device's part, for the denoise; None when the run makes no previews."""
        return Previews(self.every, self) if self.every else None

    @property
    def seconds(self) -> float:
        """The ``preview`` stage: the projections' device time and the encodes'."""
        return self.gpu_s + self.encode_s

    @property
    def stored_bytes(self) -> int:
        """Bytes the previews leave in the store: every step's file and the latest."""
        return self._step_bytes + self._latest_bytes

    def offer(self, shot: Shot) -> bool:
        """Queue ``shot`` for the writer; False (not taken) when stopped or full."""
        if self._stopped or self._thread is None or self._queue.qsize() >= QUEUE:
            return False
        self._queue.put(shot)  # unbounded: close's end marker never waits
        return True

    def failed(self, error: BaseException) -> None:
        """A preview failed (here or on the device): logged and counted; the job goes on."""
        self.failures += 1
        log.warning("job %s: a preview failed (the job goes on): %s", self.run.spec.key, error)
        try:
            self.run.preview_failed(error)
        except Exception:
            log.exception("job %s: preview failure hook", self.run.spec.key)

    def close(self, drop: bool = False, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """End the writer: store what is queued (``drop``: discard it), then stop. After
        ``close`` nothing more is stored or announced."""
        if drop:
            self._stopped = True
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("job %s: a preview is still being stored after %.0f s: it will not be "
                        "announced", self.run.spec.key, timeout)
        self._stopped = True
        self._thread = None

    def __enter__(self) -> PreviewPublisher:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(drop=error is not None)

    def _loop(self) -> None:
        while (shot := self._queue.get()) is not None:
            if self._stopped:
                shot.release()
                continue
            try:
                self._publish(shot)
            except Exception as e:  # noqa: BLE001 - never in the job's way
                self.failed(e)

    def _publish(self, shot: Shot) -> None:
        rgb, gpu_s = shot.take()
        self.gpu_s += gpu_s
        t0 = time.perf_counter()
        clip = encode_clip(rgb, SCALE, self._fps(rgb.shape[0]))
        self.encode_s += time.perf_counter() - t0
        if self._stopped:
            return
        uri = self.out.put_bytes(preview_name(shot.step), clip.data, "video/mp4")
        latest = self.out.put_bytes(PREVIEW_LATEST, clip.data, "video/mp4", "no-cache")
        self._step_bytes += len(clip.data)
        self._latest_bytes = len(clip.data)
        if self._stopped:
            return
        self.published += 1
        self.run.preview_landed(PreviewInfo(
            step=shot.step, steps_total=shot.steps, uri=uri, latest_uri=latest,
            width=clip.width, height=clip.height, frames=clip.frames, fps=clip.fps))

    def _fps(self, latent_frames: int) -> float:
        """The video's rate over the frames one latent frame stands for: the same length."""
        frames = self.run.spec.generate.num_frames if self.run.spec.generate else 1
        stride = (frames - 1) // (latent_frames - 1) if latent_frames > 1 else 1
        return self.run.spec.video.fps / max(1, stride)

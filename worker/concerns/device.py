"""A CUDA error in a run: the pool process is retired and the job runs again on a fresh one.

After a CUDA error (an illegal address, a kernel that failed, a capture that went wrong) the
process's CUDA context is unusable: every later kernel of this process fails too, so running
the next job here would fail it as well, and a retry in the same process is pointless.

So the run ends as a **worker loss**: ``Retire.settle`` raises ``RetireProcess``; the task
releases the job's lease and ends this pool process (``retire``). Celery sees the process
lost under the job (``WorkerLostError``) and, with ``acks_late`` + ``reject_on_worker_lost``,
puts the message back on the queue; Celery starts a fresh pool process with a fresh CUDA
context, which warms up (``worker.lifecycle.poolwatch`` gives it the time) and takes jobs
again. The run's record stays in the registry, so the poison cap (``worker.concerns.losses``,
``FRAMEFLEET_MAX_WORKER_LOSSES``) counts it: a job that breaks every context it meets fails
for good instead of going round the fleet.

An out-of-memory error is not a device error here: it leaves the context usable and has its
own fallback (``worker.concerns.oom``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import ClassVar, NoReturn

import torch
from celery import Task

from producer.errors import FramefleetError
from worker.concerns.base import Concern, Outcome, Status
from worker.run.run import Run

log = logging.getLogger(__name__)

#: The exit status of a pool process retired after a CUDA error.
RETIRED_EXIT = 70  # sysexits' EX_SOFTWARE
#: Texts of the errors PyTorch raises as plain RuntimeError for a failed CUDA library call.
_DEVICE_TEXTS = ("CUDA error", "CUBLAS_STATUS_", "cuDNN error", "CUDNN_STATUS_",
                 "CUDA driver error", "cuFFT error", "CUSOLVER_STATUS_")


def is_device_error(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is a CUDA error that leaves the
    process's CUDA context unusable. Out-of-memory is not one."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, torch.OutOfMemoryError | FramefleetError):
            return False
        accelerator = getattr(torch, "AcceleratorError", None)
        if accelerator is not None and isinstance(error, accelerator):
            return True
        if isinstance(error, RuntimeError) and any(t in str(error) for t in _DEVICE_TEXTS):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


class RetireProcess(BaseException):
    """Raised by ``Retire.settle``: the task releases the job's lease and calls ``retire``.
    A ``BaseException``, so that no ``except Exception`` on the way turns it into a FAILURE."""


@dataclass(frozen=True)
class Retire(Outcome):
    """The run ends as a loss of its pool process (see the module's docstring)."""

    status: ClassVar[Status] = "retry"
    #: Read by ``WorkerLosses``: the run's record stays, and the next run counts it.
    lost: ClassVar[bool] = True

    def settle(self, run: Run, task: Task) -> NoReturn:
        raise RetireProcess(str(self.error))


class DeviceErrors(Concern):
    """A CUDA error → ``Retire``: the job goes back to the queue, this process ends."""

    def on_error(self, error: BaseException) -> Outcome | None:
        if not is_device_error(error):
            return None
        log.critical("job %s: CUDA error in pool process %d (%s): its CUDA context is "
                     "unusable; retiring this process, the job goes back to the queue",
                     self.run.spec.key, os.getpid(), error)
        return Retire(error=error)


def retire(why: RetireProcess) -> NoReturn:
    """End this pool process now (Celery starts a fresh one and redelivers its job)."""
    logging.shutdown()
    os._exit(RETIRED_EXIT)

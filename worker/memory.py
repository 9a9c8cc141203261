"""The memory guard: a worker process that outgrows ``FRAMEFLEET_MAX_RSS_MIB`` fails its job
itself, and frees what it can so that it takes the next one.

Why: when a host runs out of memory, the kernel's OOM killer picks a victim by its own score:
often the biggest worker, sometimes a neighbour's job or Redis. A worker killed under a job
counts a worker loss and the job comes back, to grow again on the next worker (the poison
cap stops it only after ``FRAMEFLEET_MAX_WORKER_LOSSES`` kills). The guard instead reads the
process's resident set size (``/proc/self/statm``: a few microseconds) where a job's memory
grows, before a generation model loads, between denoise steps and between decoded chunks,
and over the limit it fails the job with a fatal error that names the limit and what it
measured. Allocations between two checks are not seen: the guard is a stop before the cliff,
not a hard cap.

Unset, the limit is 90% of the host's memory (or of the cgroup's limit, if lower): a single
process that large is about to be killed anyway. Several workers share a host: set the limit
to the host's memory over the number of workers, less what else runs there. 0 turns it off.

After a job it stopped (``recover``), the worker drops the job's frames (the error's traceback
holds them), collects garbage, hands freed heap back to the kernel (``malloc_trim``), empties
the CUDA cache and, only if it is still over the limit, evicts its resident generation models.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import traceback
import weakref
from pathlib import Path
from typing import Any

import torch

from producer.errors import FatalJobError
from producer.settings import Settings

log = logging.getLogger(__name__)

MIB = 2**20
#: The default limit's share of the host's (or cgroup's) memory.
HOST_SHARE = 0.9
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")

_tripped = False  # the guard stopped this process's job (one job at a time per process)
_caches: weakref.WeakSet[Any] = weakref.WeakSet()  # model caches to evict under pressure


def rss_bytes() -> int:
    """This process's resident set size, in bytes."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):  # not Linux
        import psutil

        return int(psutil.Process().memory_info().rss)


def host_memory_bytes() -> int | None:
    """The host's memory, or its cgroup's limit when lower; None when unknown."""
    sizes: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                sizes.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max", or v1's "no limit" near 2**63
            sizes.append(int(text))
    return min(sizes) if sizes else None


def limit_mib(settings: Settings) -> int | None:
    """The guard's limit in MiB, or None when it is off."""
    if settings.max_rss_mib is not None:
        return settings.max_rss_mib or None
    host = host_memory_bytes()
    return int(host * HOST_SHARE / MIB) if host else None


def check_memory(settings: Settings, where: str) -> None:
    """Raise a ``FatalJobError`` naming the limit when this process's RSS is over it."""
    limit = limit_mib(settings)
    if limit is None:
        return
    rss = rss_bytes()
    if rss <= limit * MIB:
        return
    global _tripped
    _tripped = True
    default = "" if settings.max_rss_mib is not None else f" ({HOST_SHARE:.0%} of this host)"
    raise FatalJobError(
        f"worker memory over its limit: RSS measured {rss / MIB:.0f} MiB {where}, "
        f"FRAMEFLEET_MAX_RSS_MIB={limit}{default}; the job is stopped before the host's OOM "
        "killer picks a process"
    )


def room_bytes(settings: Settings) -> int | None:
    """What this process may still grow by before the guard's limit, or None when it is off."""
    limit = limit_mib(settings)
    return None if limit is None else max(0, limit * MIB - rss_bytes())


def over_room(settings: Settings, what: str, room: int) -> FatalJobError:
    """The refusal of an input that would take this process past the limit once read."""
    return FatalJobError(
        f"{what} is over what this worker may hold: reading it would take its memory past "
        f"FRAMEFLEET_MAX_RSS_MIB={limit_mib(settings)} (RSS {rss_bytes() / MIB:.0f} MiB, room "
        f"for a {room} byte input); refused before it was read")


def track(models: Any) -> None:
    """Let ``recover`` evict the resident models of ``models`` (a ``ModelCache``)."""
    _caches.add(models)


def recover(error: BaseException | None, settings: Settings) -> None:
    """After a job ended: if the guard stopped it, free what this process can; else nothing."""
    global _tripped
    if not _tripped:
        return
    _tripped = False
    before = rss_bytes()
    _drop_frames(error)
    _free()
    limit = limit_mib(settings)
    if limit is not None and rss_bytes() > limit * MIB:
        for models in list(_caches):
            # keep=None: no resident is kept (the cache's smaller-working-set eviction)
            models.evict_others(None)
        _free()
    log.warning("memory guard: RSS %.0f MiB after the stopped job, %.0f MiB once freed",
                before / MIB, rss_bytes() / MIB)


def _drop_frames(error: BaseException | None) -> None:
    """Clear the locals of the finished frames the error's tracebacks hold (the job's
    tensors); the traceback's file and line stay for the log."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap pages otherwise
    except (OSError, AttributeError):
        pass

"""Compile artifacts: a worker's compiled transformer, carried to the next host.

``framefleet compile`` (``worker.commands``) and a worker with ``FRAMEFLEET_PUBLISH_COMPILED``
write, per (model config, tier, torch + Triton version, device), the bytes of
``torch.compiler.save_cache_artifacts()`` and an ``index.json`` that says what each covers
(``worker.generate.model.artifact_index``). A worker starting with a warm-up model loads the
artifacts that match it (``torch.compiler.load_cache_artifacts``) before its first compile:
its warm-up then finds every covered size in the on-disk compile caches and compiles nothing.

Where artifacts live (``Place``): the model folder's ``compiled/`` (it travels with the
model: an image layer, a volume made from a snapshot), and ``FRAMEFLEET_COMPILE_ARTIFACTS``
(a folder, or ``s3://bucket/prefix``). Both are the operator's, not a job's: they are not
confined to ``FRAMEFLEET_FILE_ROOTS``, but every read is a regular file (no link followed),
counted against ``FRAMEFLEET_COMPILE_ARTIFACT_MAX_MIB`` while reading; an artifact is loaded
only if its sha256 is the index's, and only if its stamp is this worker's (a mismatch is a
miss with its reason, never a load). Writes are atomic (a temporary file renamed; one S3 PUT),
the artifact before the index, and a worse artifact never replaces a better one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from producer.errors import FramefleetError, InvalidJobError
from worker.generate.model.artifact_index import (
    INDEX,
    Entry,
    Stamp,
    dump_index,
    match,
    merged,
    parse_index,
)
from worker.generate.tier import attnchoice
from worker.stores.paths import read_bounded

log = logging.getLogger(__name__)
FIELD = "FRAMEFLEET_COMPILE_ARTIFACTS"
#: The configs whose content decides the compiled code (the transformers' architecture).
CONFIGS = ("model_index.json", "transformer/config.json", "transformer_2/config.json")


def versions() -> tuple[str, str]:
    """(torch, Triton) versions; Triton ``none`` where it is not installed (the CPU)."""
    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    return str(torch.__version__), triton_version


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def config_digest(folder: Path, max_bytes: int = 4 * 1024**2) -> str:
    """sha256 over the model's pipeline and transformer configs (canonical JSON): the same
    architecture in two folders gives the same digest; other weights do not change it."""
    h = hashlib.sha256()
    for rel in CONFIGS:
        path = folder / rel
        if not path.is_file():
            continue
        doc = json.loads(_read_local(path, max_bytes))
        if isinstance(doc, dict):  # paths and versions of who saved it change no kernel
            doc = {k: v for k, v in doc.items() if k not in ("_name_or_path", "_diffusers_version")}
        h.update(rel.encode() + b"\0" + json.dumps(doc, sort_keys=True).encode() + b"\0")
    return h.hexdigest()


def stamp_for(folder: Path, tier: str, device: torch.device) -> Stamp:
    torch_version, triton_version = versions()
    return Stamp(config_digest(folder), tier, torch_version, triton_version, device_name(device))


def _read_local(path: Path, max_bytes: int) -> bytes:
    """A regular file's bytes, no link followed, at most ``max_bytes`` (counted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InvalidJobError(f"{FIELD}: {path}: {os.strerror(e.errno or 0)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidJobError(f"{FIELD}: {path} is not a regular file")
        return read_bounded(fd, max_bytes, FIELD, str(path))
    finally:
        os.close(fd)


class Place:
    """A folder or an S3 prefix holding artifacts and their index."""

    def __init__(self, where: str, settings: Any = None) -> None:
        self.where = where
        self._store: Any = None
        if where.startswith("s3://"):
            from worker.stores.storage import S3Store, locate

            loc = locate(where.rstrip("/") + "/" + INDEX, FIELD)
            self._store = S3Store(loc.bucket, settings, FIELD)
            self._prefix = loc.key[: -len(INDEX)]
        else:
            path = where.removeprefix("file://")
            if not os.path.isabs(path):
                raise InvalidJobError(f"{FIELD}: {where!r} is neither s3:// nor an absolute path")
            self._folder = Path(path)

    def uri(self, name: str) -> str:
        return self._store.uri(self._prefix + name) if self._store else str(self._folder / name)

    def read(self, name: str, max_bytes: int) -> bytes | None:
        """The object's bytes (bounded), or None when it is not there."""
        if self._store is not None:
            if not self._store.exists(self._prefix + name):
                return None
            data: bytes = self._store.get_bytes(self._prefix + name, max_bytes)
            return data
        path = self._folder / name
        if not os.path.lexists(path):
            return None
        return _read_local(path, max_bytes)

    def write(self, name: str, data: bytes) -> None:
        """Atomically: a reader sees the old object or the new one, never a part."""
        if self._store is not None:
            self._store.put_bytes(self._prefix + name, data, "application/octet-stream")
            return
        self._folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._folder, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a worker of another uid
            os.replace(tmp, self._folder / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def entries(self, max_bytes: int) -> list[Entry]:
        data = self.read(INDEX, max_bytes)
        if data is None:
            return []
        try:
            return parse_index(data, self.uri(INDEX))
        except ValueError as e:
            raise InvalidJobError(f"{FIELD}: {e}") from None


@dataclass
class Loaded:
    """What looking for one stamp's artifact found: the entry loaded (None: a miss) and why
    not, and the seconds the read and load took."""

    stamp: Stamp
    entry: Entry | None
    reason: str
    where: str = ""
    seconds: float = 0.0

    def covers(self, size: str) -> bool:
        return self.entry is not None and size in self.entry.sizes


def load(places: list[Place], stamp: Stamp, max_bytes: int) -> Loaded:
    """Load the artifact of ``stamp`` from the first place that has one. Any refusal (a bad
    index, a checksum that differs, an unreadable file) is logged and is a miss with that
    reason: the worker then compiles, as it would with no artifact."""
    t0 = time.perf_counter()
    reasons = []
    for place in places:
        try:
            entry, why = match(place.entries(max_bytes), stamp)
            if entry is None:
                reasons.append(why)
                continue
            data = place.read(entry.file, min(max_bytes, entry.bytes))
            if data is None:
                reasons.append(f"{place.uri(entry.file)} is listed but missing")
                continue
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry.sha256:
                reasons.append(f"{place.uri(entry.file)}: sha256 {digest[:12]} is not the "
                               f"index's {entry.sha256[:12]}")
                continue
            torch.compiler.load_cache_artifacts(data)
            attnchoice.take(place, stamp, max_bytes)  # the kernels it was traced with
            return Loaded(stamp, entry, "", place.uri(entry.file), time.perf_counter() - t0)
        except (FramefleetError, OSError) as e:
            reasons.append(str(e))
    for why in reasons:
        log.info("compile artifact for %s %s: %s", stamp.tier, stamp.device, why)
    # The most telling reason: an artifact of this model that does not fit says more than
    # a place that has none.
    told = [r for r in reasons if not r.startswith("no artifact")] or reasons or ["no artifact"]
    return Loaded(stamp, None, told[0], seconds=time.perf_counter() - t0)


def start_recording() -> None:
    """Forget the compile artifacts recorded so far: the next ``save`` holds only what is
    compiled (or found in the caches) from now on, one tier's worth."""
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()


def save(place: Place, stamp: Stamp, sizes: list[str], max_bytes: int,
         graphs: list[str] | None = None) -> Entry | None:
    """Write what was recorded since ``start_recording`` as the artifact of ``stamp``
    covering ``sizes`` of the transformer and ``graphs`` of the decoder
    (``worker.generate.model.graphs``), then the index; None (nothing written) when there was
    nothing to save or the place already has an artifact covering as much."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        return None
    data = saved[0]
    if len(data) > max_bytes:
        raise InvalidJobError(f"{FIELD}: the artifact of {stamp.tier} is {len(data)} bytes, "
                              "over FRAMEFLEET_COMPILE_ARTIFACT_MAX_MIB")
    entry = Entry(stamp, stamp.file_name(), sorted(set(sizes)),
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), len(data),
                  hashlib.sha256(data).hexdigest(), sorted(set(graphs or ())))
    entries = merged(place.entries(max_bytes), entry)
    if entries is None:
        log.info("compile artifact %s kept: it covers these sizes already", place.uri(entry.file))
        return None
    place.write(entry.file, data)  # the artifact first: the index never names a missing one
    place.write(INDEX, dump_index(entries))
    attnchoice.keep(place, stamp)  # this GPU's attention kernels, beside it
    log.info("compile artifact %s written: %s at %s, decoder graphs %s (%d bytes)",
             place.uri(entry.file), stamp.tier, ",".join(entry.sizes),
             ", ".join(entry.graphs) or "none", len(data))
    return entry


def graph_counters() -> dict[str, int]:
    """Inductor's FX graph cache counters of this process (hits, misses): the proof of
    whether a compile was served from the caches."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {"hit": int(inductor.get("fxgraph_cache_hit", 0)),
            "miss": int(inductor.get("fxgraph_cache_miss", 0))}

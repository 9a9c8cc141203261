"""The fleet's rules for a job spec: one check, made by the client at submit and by the task
on receipt (the wire is not trusted), with the same rules on both sides.

``parse_spec`` already checked each field's form; this adds what depends on the fleet's
settings: decoder weights named, the time limit under ``FRAMEFLEET_MAX_TIME_LIMIT_S``, the
output under ``FRAMEFLEET_OUTPUT_PREFIX``, webhooks on the allow-list (before DNS: the
delivering worker checks the addresses again), and the message under
``FRAMEFLEET_MAX_MESSAGE_BYTES``. What only a worker can know (its devices, what its model folders
hold, where a symlink leads) is checked by the worker when it resolves those paths.

Local paths (``file://``) are the workers' paths. ``check_local_paths`` runs at submit only:
where ``FRAMEFLEET_FILE_ROOTS`` is set on the producer (or the producer is the embedded mode,
whose folder it knows), a path outside the roots is refused before anything is queued; where
it is not set, the producer cannot know, so the client warns that the workers decide. The
worker checks again with symlinks resolved (``worker/stores/paths.py``), which a producer
cannot do for a path on another machine.

``check_local_files`` also runs at submit only: where the producer can see a path (it lies
under a root that is a folder on this host, or under the embedded mode's folder), a missing
input, image or LoRA file, or a missing model or weights folder, is refused before anything
is queued, naming the field, instead of a job that a worker fails a moment later. Where it
sees a generate job's model folder, it is one of the fleet's hosts: the request is checked
against the model's configs and the fleet's limits as the worker will check it
(``producer.wire.fits``: steps, frames, the sizes' multiples and reach, pixels), naming every
field at fault.

A job's time limits follow from its spec alone (``time_limits``): the soft limit is its
``time_limit_s``, the hard one ``FRAMEFLEET_HARD_LIMIT_AFTER_S`` later. The client sends them
with the message; the worker sets them again from the spec it receives and its own settings,
whatever the message says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from producer.errors import InputNotFoundError, InvalidJobError, PathRefusedError
from producer.settings import Settings
from producer.webhooks.rules import UrlPolicy, check_notify
from producer.wire import layouts
from producer.wire.base import decode_uri
from producer.wire.fits import Limits, check_fits, read_reach
from producer.wire.spec import RANDOM_WEIGHTS, JobSpec
from producer.wire.weights import check_job_weights


def time_limits(payload: Any, settings: Settings) -> tuple[int, int]:
    """(hard, soft) time limits of a job message's payload (the spec's JSON): from its
    ``time_limit_s`` when that is a number the fleet allows, else the fleet's longest
    (``FRAMEFLEET_MAX_TIME_LIMIT_S``: the message is refused on receipt anyway)."""
    limit = payload.get("time_limit_s") if isinstance(payload, dict) else None
    if isinstance(limit, bool) or not isinstance(limit, int) or not (
            1 <= limit <= settings.max_time_limit_s):
        limit = settings.max_time_limit_s
    return limit + settings.hard_limit_after_s, limit


def check_message_size(payload: Any, settings: Settings) -> None:
    """Refuse a job message over ``FRAMEFLEET_MAX_MESSAGE_BYTES`` (as JSON)."""
    limit = settings.max_message_bytes
    size = len(json.dumps(payload))
    if size > limit:
        raise InvalidJobError(f"job message is {size} bytes, over the {limit} byte limit "
                              "(FRAMEFLEET_MAX_MESSAGE_BYTES)")


def spec_uris(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """(field, URI) of every store URI ``spec`` names, fields named as in errors."""
    if spec.input is not None:
        yield "input.uri", spec.input.uri
    if spec.decoder.weights not in (None, RANDOM_WEIGHTS):
        yield "decoder.weights", str(spec.decoder.weights)
    gen = spec.generate
    if gen is not None:
        yield "generate.model", gen.model
        yield from ((f"generate.{name}", uri) for name, uri in
                    (("image", gen.image), ("last_image", gen.last_image)) if uri is not None)
        yield from ((f"generate.loras[{i}].uri", lora.uri) for i, lora in enumerate(gen.loras))
    yield "output.uri", spec.output.uri


def check_uris(spec: JobSpec) -> None:
    """Decode every URI of ``spec`` once (``producer.wire.base.decode_uri``), as the stores will:
    ``InvalidJobError`` naming the first field that does not decode to a safe path or key.
    The validators did this already, unless the spec was built past them
    (``model_construct``); the rules do not rely on it."""
    for field, uri in spec_uris(spec):
        try:
            decode_uri(uri, field=field)
        except ValueError as e:
            raise InvalidJobError(str(e)) from None


def check_spec(spec: JobSpec, settings: Settings) -> None:
    """Raise ``InvalidJobError`` (or ``FatalJobError`` for a refused output) unless ``spec``
    keeps the fleet's rules; each message names the field."""
    check_uris(spec)
    check_job_weights(spec)
    if spec.time_limit_s > settings.max_time_limit_s:
        raise InvalidJobError(
            f"time_limit_s: {spec.time_limit_s} exceeds the fleet's max_time_limit_s "
            f"{settings.max_time_limit_s} (FRAMEFLEET_MAX_TIME_LIMIT_S)"
        )
    settings.check_output_uri(spec.output.uri)
    if spec.notify is not None:
        check_notify(spec.notify.urls, UrlPolicy.from_settings(settings))
    check_message_size(spec.model_dump(mode="json"), settings)


class LocalPathWarning(UserWarning):
    """A job names local paths, and this producer cannot tell whether the workers allow
    them (``FRAMEFLEET_FILE_ROOTS`` is not set here)."""


def local_paths(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """(field, URI) of every ``file://`` URI in ``spec``, fields named as in errors
    (``output.uri``, ``decoder.weights``, ``generate.model``)."""
    return ((field, uri) for field, uri in spec_uris(spec) if uri[:7].lower() == "file://")


def submit_roots(settings: Settings) -> tuple[PurePosixPath, ...] | None:
    """The folders the workers allow, as far as this producer knows them: its own
    ``FRAMEFLEET_FILE_ROOTS`` (empty: none), or the embedded mode's folder; None: unknown."""
    if settings.file_roots is not None:
        return tuple(PurePosixPath(os.path.normpath(r)) for r in settings.file_root_list)
    if settings.broker_url.startswith("filesystem://"):
        return (PurePosixPath(os.path.abspath(settings.data_dir)).parent,)
    return None


def check_local_paths(spec: JobSpec, settings: Settings) -> list[str]:
    """At submit: raise ``PathRefusedError`` naming the first ``file://`` path outside the
    known roots; return the warnings to give when the roots are not known here."""
    paths = list(local_paths(spec))
    roots = submit_roots(settings)
    if not paths:
        return []
    if roots is None:
        fields = ", ".join(field for field, _ in paths)
        return [f"{fields}: local paths on the workers, and FRAMEFLEET_FILE_ROOTS is not set "
                "here, so the workers decide: each refuses a path outside its own "
                "FRAMEFLEET_FILE_ROOTS (none at all when it is unset there)"]
    for field, uri in paths:
        # decoded once, as the worker's store will read it (no '..' left to normalise)
        path = PurePosixPath(decode_uri(uri, field=field).path)
        if not any(path == root or path.is_relative_to(root) for root in roots):
            allowed = ":".join(str(r) for r in roots) or "none"
            raise PathRefusedError(
                f"{field}: {uri} is outside FRAMEFLEET_FILE_ROOTS ({allowed}), so the workers "
                "would refuse it; use a folder under the roots, or add one to "
                "FRAMEFLEET_FILE_ROOTS here and on the workers")
    return []


#: Fields whose local path names a folder (every other input names a file).
FOLDER_FIELDS = ("decoder.weights", "generate.model")


def _visible(uri: str, field: str, roots: tuple[PurePosixPath, ...]) -> PurePosixPath | None:
    """The path of ``uri`` where it lies under a root that is a folder on this host."""
    path = PurePosixPath(decode_uri(uri, field=field).path)
    root = next((r for r in roots if path == r or path.is_relative_to(r)), None)
    return path if root is not None and os.path.isdir(root) else None


def fleet_limits(settings: Settings) -> Limits:
    """The fleet's limits on a generate job, as ``settings`` give them."""
    return Limits(steps=settings.max_denoise_steps, frames=settings.max_frames,
                  pixels=settings.max_pixels)


def check_local_files(spec: JobSpec, settings: Settings) -> None:
    """At submit: raise ``InputNotFoundError`` naming the first local input (file or folder)
    that does not exist where this producer can see it: under a root of
    ``FRAMEFLEET_FILE_ROOTS`` that is a folder on this host (or the embedded mode's folder).
    A path under a root this host does not have is the workers' to judge. Then
    ``InvalidJobError`` for a LoRA made for another layout than the model's, where this host
    sees both (``producer.wire.layouts``), and for a generate request that does not fit the
    model it sees or the fleet's limits (``producer.wire.fits``), naming every field."""
    roots = submit_roots(settings)
    if not roots:
        return
    for field, uri in local_paths(spec):
        if field == "output.uri":  # made by the job
            continue
        path = _visible(uri, field, roots)
        if path is None:
            continue
        folder = field in FOLDER_FIELDS
        if not (Path(path).is_dir() if folder else Path(path).is_file()):
            what = "folder" if folder else "file"
            state = f"is not a {what}" if os.path.lexists(path) else f"no such {what}"
            raise InputNotFoundError(f"{field}: {state}: {path} (looked for where the job "
                                     "was submitted, under FRAMEFLEET_FILE_ROOTS; nothing "
                                     "was queued)")
    _check_lora_layouts(spec, roots)
    _check_fits(spec, roots, settings)


def _check_fits(spec: JobSpec, roots: tuple[PurePosixPath, ...], settings: Settings) -> None:
    gen = spec.generate
    if gen is None or gen.model[:7].lower() != "file://":
        return
    folder = _visible(gen.model, "generate.model", roots)
    model = read_reach(Path(folder)) if folder is not None else None
    if model is not None:  # else the worker reads the folder and names what is wrong
        check_fits(gen, model, fleet_limits(settings))


def _check_lora_layouts(spec: JobSpec, roots: tuple[PurePosixPath, ...]) -> None:
    gen = spec.generate
    if gen is None or not gen.loras or gen.model[:7].lower() != "file://":
        return
    folder = _visible(gen.model, "generate.model", roots)
    try:
        model = layouts.layout(layouts.read_json(Path(folder, "transformer", "config.json"))) \
            if folder is not None else None
    except (OSError, ValueError, RecursionError):
        return  # the worker reads the folder and names what is wrong with it
    if model is None:
        return
    for i, lora in enumerate(gen.loras):
        field = f"generate.loras[{i}].uri"
        path = _visible(lora.uri, field, roots) if lora.uri[:7].lower() == "file://" else None
        try:
            made = layouts.read_made_for(Path(path)) if path is not None else None
        except OSError:
            continue
        layouts.check_made_for(made, model, field, lora.uri)

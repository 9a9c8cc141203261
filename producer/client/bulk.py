"""Many jobs at once: ``Client.submit_many``.

Each job gets everything ``Client.submit`` gives it, in the same order; what changes is the
number of round trips. The specs go in chunks of ``CHUNK``:

1. each spec is checked as ``submit`` checks it (the fleet's rules, the local files this host
   can see); a refusal is that spec's ``Submitted.error``, the others go on;
2. one pipeline claims every job_id of the chunk with the registry's own claim (``SET NX`` of
   the spec's digest; the stale cancel flag cleared; the spec kept, for a later conflict);
3. one kombu batch publishes every job claimed now (the LPUSH and the task-sent event of each,
   in one pipeline);
4. one pipeline marks them sent (the status hints, the lost-message reconciler);
5. a job_id claimed before takes ``submit``'s own path, job by job: the same spec is the
   existing job (sent again after FAILURE, a cancel, or its result's expiry), another spec is
   a ``JobConflictError``. The same job_id twice in one call is one job.

A publish that fails frees the chunk's new claims (nothing of the chunk is known to be queued)
and refuses it, and every spec after it, with the broker's error: a bulk submit stops where the
broker did, and its answer says which jobs are queued. The embedded mode (a registry of files,
no Redis) submits one by one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from producer.client.handle import JobHandle, _io
from producer.client.send import send_job
from producer.errors import BrokerError, FramefleetError
from producer.state.control import RedisFlags, flags_for
from producer.wire.spec import JobSpec

if TYPE_CHECKING:
    from producer.client.client import Client

#: Specs per chunk: a few round trips each. Larger chunks gain little once the round trips
#: are a small share of the Python work per job, and hold more in one pipeline.
CHUNK = 500


@dataclass(frozen=True)
class Submitted:
    """One spec of a bulk submit: its handle once queued (or found: the same spec submitted
    before), else the error that refused it."""

    spec: JobSpec
    handle: JobHandle | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def submit_many(client: Client, specs: list[JobSpec],
                done: Callable[[int], None] | None = None) -> list[Submitted]:
    """The specs submitted in chunks (see the module's docstring); one answer per spec."""
    out: list[Submitted] = []
    flags = flags_for(client.app, client.settings)
    step = CHUNK if isinstance(flags, RedisFlags) else 1
    for start in range(0, len(specs), step):
        chunk = specs[start:start + step]
        try:
            with _io(client.app):
                out += (_chunk(client, flags, chunk) if isinstance(flags, RedisFlags)
                        else [_one(client, chunk[0])])
        except BrokerError as e:
            out += [Submitted(spec, error=e) for spec in specs[start:]]
            break
        finally:
            if done is not None:
                done(len(out))
    return out


def _one(client: Client, spec: JobSpec) -> Submitted:
    try:
        return Submitted(spec, client.submit(spec))
    except BrokerError:
        raise
    except (FramefleetError, ValueError) as e:
        return Submitted(spec, error=e)


def _checked(client: Client, chunk: list[JobSpec]) -> tuple[
        dict[int, Submitted], list[tuple[int, JobSpec, dict[str, Any], str]]]:
    """The chunk's refusals by position, and the specs that passed, with their JSON and
    digest."""
    refused: dict[int, Submitted] = {}
    passed = []
    for i, spec in enumerate(chunk):
        try:
            client.check(spec)
        except (FramefleetError, ValueError) as e:
            refused[i] = Submitted(spec, error=e)
            continue
        passed.append((i, spec, spec.model_dump(mode="json"), spec.digest()))
    return refused, passed


def _chunk(client: Client, flags: RedisFlags, chunk: list[JobSpec]) -> list[Submitted]:
    answers, passed = _checked(client, chunk)
    claimed = flags.claim_many([(spec.key, digest, json.dumps(payload, separators=(",", ":")))
                                for _, spec, payload, digest in passed])
    new = [(i, spec, payload) for (i, spec, payload, _), old in zip(passed, claimed, strict=True)
           if old is None]
    app = client.app
    try:
        with app.producer_or_acquire() as producer, producer.batch(max_size=2 * CHUNK + 2):
            for n, (_, spec, payload) in enumerate(new):
                send_job(app, spec, payload, client.settings, batch=producer, declare=n == 0)
    except BaseException:
        flags.release_many([spec.key for _, spec, _ in new])  # nothing of it is known queued
        raise
    flags.mark_sent_many([spec.key for _, spec, _ in new])
    for i, spec, _ in new:
        handle = JobHandle(app, spec.key, flags, client.settings)
        handle.reached = True
        answers[i] = Submitted(spec, handle)
    # Claimed before (by an earlier submit, or earlier in this chunk, now queued): submit's
    # own path, job by job.
    for (i, spec, payload, digest), old in zip(passed, claimed, strict=True):
        if old is not None:
            answers[i] = _again(client, flags, spec, payload, digest, old)
    return [answers[i] for i in range(len(chunk))]


def _again(client: Client, flags: RedisFlags, spec: JobSpec, payload: dict[str, Any],
           digest: str, old: str) -> Submitted:
    handle = JobHandle(client.app, spec.key, flags, client.settings)
    try:
        if client.again(spec, digest, old, flags, handle):
            client.send(spec, payload, flags, new=False)
            flags.mark_sent(spec.key)
            handle.reached = True
    except BrokerError:
        raise
    except (FramefleetError, ValueError) as e:
        return Submitted(spec, error=e)
    return Submitted(spec, handle)

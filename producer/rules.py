"""The fleet's rules for a job spec: one check, made by the client at submit and by the task
on receipt (the wire is not trusted), with the same rules on both sides.

``parse_spec`` already checked each field's form; this adds what depends on the fleet's
settings: decoder weights named, the time limit under ``FRAMEFLEET_MAX_TIME_LIMIT_S``, the
output under ``FRAMEFLEET_OUTPUT_PREFIX``, webhooks on the allow-list (before DNS: the
delivering worker checks the addresses again), and the message under
``FRAMEFLEET_MAX_MESSAGE_BYTES``. What only a worker can know (its file roots, its devices, what
its model folders hold) is checked by the worker when it resolves those paths.
"""

from __future__ import annotations

import json
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.spec import JobSpec
from producer.webhooks import UrlPolicy, check_notify
from producer.weights import check_job_weights


def check_message_size(payload: Any, settings: Settings) -> None:
    """Refuse a job message over ``FRAMEFLEET_MAX_MESSAGE_BYTES`` (as JSON)."""
    limit = settings.max_message_bytes
    size = len(json.dumps(payload))
    if size > limit:
        raise InvalidJobError(f"job message is {size} bytes, over the {limit} byte limit "
                              "(FRAMEFLEET_MAX_MESSAGE_BYTES)")


def check_spec(spec: JobSpec, settings: Settings) -> None:
    """Raise ``InvalidJobError`` (or ``FatalJobError`` for a refused output) unless ``spec``
    keeps the fleet's rules; each message names the field."""
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

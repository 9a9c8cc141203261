"""A job_id reused with another spec: which fields differ.

The client keeps each new job's spec beside its claim (``producer.state.keys.spec_doc``), so the
refusal of a second, different spec can name what changed instead of only "different".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from producer.errors import JobConflictError
from producer.wire.spec import JobSpec

#: At most this many differing fields are named (the count says how many more).
MAX_FIELDS = 5
#: A value is shown up to this many characters.
MAX_VALUE = 60


def _flat(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for name, item in value.items():
            yield from _flat(item, f"{path}.{name}" if path else str(name))
    else:
        yield path, value


def _shown(value: Any) -> str:
    text = "unset" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 3] + "..."


def differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """``field: old -> new`` for each leaf that differs, in field order."""
    a, b = dict(_flat(first)), dict(_flat(second))
    return [f"{name}: {_shown(a.get(name))} -> {_shown(b.get(name))}"
            for name in sorted(a.keys() | b.keys()) if a.get(name) != b.get(name)]


def conflict(spec: JobSpec, first_json: str | None) -> JobConflictError:
    """The error for ``spec`` reusing a job_id first claimed by the spec ``first_json``."""
    head = (f"job_id {spec.job_id!r} of tenant {spec.tenant!r} was already submitted with a "
            "different spec")
    if first_json is None:
        return JobConflictError(f"{head} (which was not kept: submitted by an older client, or "
                                "straight to the queue); use another job_id")
    try:
        diffs = differences(json.loads(first_json), spec.model_dump(mode="json"))
    except ValueError:
        diffs = []
    if not diffs:
        return JobConflictError(f"{head}; use another job_id")
    more = len(diffs) - MAX_FIELDS
    named = "; ".join(diffs[:MAX_FIELDS]) + (f"; and {more} more" if more > 0 else "")
    return JobConflictError(f"{head}: {named}; use another job_id, or the first spec")

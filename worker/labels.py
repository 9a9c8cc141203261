"""The values of the labels that could grow without bound: ``tenant`` and ``reason``.

Every series of a distinct label value costs Prometheus memory for as long as it is kept, so
these two only take values from bounded sets: a tenant keeps its name only if the operator
allowed it (``FRAMEFLEET_METRICS_TENANTS``), and a failure's reason is the class of its error
in ``producer.errors``, never its message (free text, and new with every URI it names).
"""

from __future__ import annotations

from producer import errors

#: The ``tenant`` label of a tenant that is not in ``FRAMEFLEET_METRICS_TENANTS``.
OTHER_TENANT = "other"
#: The ``tenant`` label of a job whose spec did not parse (its tenant is not known).
UNKNOWN_TENANT = "unknown"
#: ``reason`` of an error from outside framefleet's error tree (a bug, not a bad job).
UNEXPECTED = "UnexpectedError"
#: ``reason`` of Celery's soft or hard time limit.
TIME_LIMIT = "TimeLimitExceeded"
#: Every value ``reason`` can take: the class names of ``producer.errors`` and the two above.
REASONS = frozenset(
    {
        cls.__name__
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.FramefleetError)
    }
    | {UNEXPECTED, TIME_LIMIT}
)


def tenant_label(tenant: str, allowed: frozenset[str] | None) -> str:
    """The ``tenant`` label of ``tenant``: its name if ``allowed`` has it (None: every tenant
    is allowed), else ``"other"``, so that the label's values stay a bounded set."""
    return tenant if allowed is None or tenant in allowed else OTHER_TENANT


def failure_reason(error: BaseException | None) -> str:
    """The ``reason`` label of ``error``: the nearest class of ``producer.errors`` in its
    hierarchy, ``TimeLimitExceeded`` for Celery's time limits, else ``UnexpectedError``.
    Never the message: that is free text, and every distinct value would be a new series."""
    if error is None:
        return UNEXPECTED
    for cls in type(error).__mro__:
        if cls.__module__ == errors.__name__ and cls.__name__ in REASONS:
            return cls.__name__
        if cls.__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded"):  # billiard's, via Celery
            return TIME_LIMIT
    return UNEXPECTED

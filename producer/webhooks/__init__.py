"""Webhooks, the rules both ends apply: which URLs a job may notify (``hosts``: the allow-list's
entries) and how deliveries are signed and verified (``rules``).

``producer.settings`` reads the allow-list through ``hosts``, so this package imports nothing
at import time; ``producer.webhooks.verify``, what a receiver imports, loads ``rules`` on first use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "verify":
        from producer.webhooks.rules import verify

        return verify
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Flower's app: ``celery -A producer.ops.dashboard flower`` (what ``framefleet flower`` runs).

Built from the environment's settings when Flower loads this module. Task events name the
tasks, so the dashboard needs no worker code (no torch): this module imports the app factory
only. ``framefleet flower`` binds it to 127.0.0.1 unless given ``--address``, and hands
``FRAMEFLEET_FLOWER_BASIC_AUTH`` to Flower as its login (``producer/cli/fleet.py``).
Its revoke and terminate buttons send Celery's ``revoke``, which framefleet's workers take as a
framefleet cancel (``worker/concerns/cancel.py``): the job ends REVOKED, and submitting it again
runs it again.
"""

from __future__ import annotations

from producer.app import make_app
from producer.settings import get_settings

app = make_app(settings=get_settings())

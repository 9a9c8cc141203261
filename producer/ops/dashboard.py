"""Flower's app: ``celery -A producer.ops.dashboard flower`` (what ``framefleet flower`` runs).

Built from the environment's settings when Flower loads this module. Task events name the
tasks, so the dashboard needs no worker code (no torch): this module imports the app factory
only.
"""

from __future__ import annotations

from producer.app import make_app
from producer.settings import get_settings

app = make_app(settings=get_settings())

"""The one place that reads ``FRAMEFLEET_*`` environment variables.

Every field is documented and range-checked; ``get_settings()`` reads the environment once per
process (call ``get_settings.cache_clear()`` in tests that change it).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.errors import SettingsError
from producer.settings.api import ApiSettings
from producer.settings.compiled import CompiledSettings
from producer.settings.generation import GenerationSettings
from producer.settings.ops import OpsSettings
from producer.settings.paths import PathSettings
from producer.settings.queue import QueueSettings
from producer.settings.webhooks import WebhookSettings
from producer.settings.worker import WorkerSettings

ENV_PREFIX = "FRAMEFLEET_"


def env_error_text(e: ValidationError) -> str:
    """pydantic's errors, each naming the environment variable (``FRAMEFLEET_RETRY_MAX``)
    and the value it had, not the field."""
    lines = []
    for err in e.errors():
        if err["loc"]:
            name = ENV_PREFIX + str(err["loc"][0]).upper()
            lines.append(f"{name}={err['input']!r}: {err['msg']}")
        else:
            lines.append(str(err["msg"]).removeprefix("Value error, "))
    return "invalid settings: " + "; ".join(lines)


class Settings(BaseSettings, QueueSettings, WorkerSettings, GenerationSettings, OpsSettings,
               PathSettings, WebhookSettings, ApiSettings, CompiledSettings):
    """Every setting, grouped by role in this package's modules; one environment read."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    def __init__(self, **values: Any) -> None:
        """Read the environment (``values`` win); a bad value raises ``SettingsError``."""
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise SettingsError(env_error_text(e)) from None

    @model_validator(mode="after")
    def _visibility(self) -> Settings:
        if self.visibility_timeout_s is not None and (
            self.visibility_timeout_s <= self.max_time_limit_s
        ):
            raise ValueError(
                "FRAMEFLEET_VISIBILITY_TIMEOUT_S must exceed FRAMEFLEET_MAX_TIME_LIMIT_S, "
                "or a running job is delivered to a second worker"
            )
        return self

    @model_validator(mode="after")
    def _local(self) -> Settings:
        for root in self.file_root_list:
            if not os.path.isabs(root) or ".." in Path(root).parts:
                raise ValueError(
                    f"FRAMEFLEET_FILE_ROOTS: {root!r} is not an absolute path without '..'"
                )
        if self.recovery_period_s and self.recovery_grace_s < 3 * self.recovery_period_s:
            raise ValueError(
                "FRAMEFLEET_RECOVERY_GRACE_S must be at least 3 x FRAMEFLEET_RECOVERY_PERIOD_S, "
                "or a live worker that misses one touch loses its jobs to another"
            )
        if 0 < self.reconcile_after_s < 1:
            raise ValueError(
                "FRAMEFLEET_RECONCILE_AFTER_S must be 0 (off) or at least 1: a message is not "
                "lost because no worker took it within a second"
            )
        return self

    @model_validator(mode="after")
    def _flower_auth(self) -> Settings:
        auth = self.flower_basic_auth  # not a field pattern: its error would print the password
        pairs = [p.partition(":") for p in (auth.get_secret_value() if auth else "").split(",")]
        if auth and any(not user or not pw or " " in user + pw for user, _, pw in pairs):
            raise ValueError("FRAMEFLEET_FLOWER_BASIC_AUTH: not user:password (value not shown)")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()

"""The base of every wire model (``producer.spec``, ``producer.results``): frozen, and no field
it does not know (a typo is an error, not a silently ignored setting)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

#: The version of ``JobSpec`` and ``Manifest``.
SCHEMA_VERSION: Literal[1] = 1


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

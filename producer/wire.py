"""The base of every wire model (``producer.spec``, ``producer.results``): frozen, and no field
it does not know (a typo is an error, not a silently ignored setting); and the one check of a
URI a spec names (re-exported by ``producer.spec``)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict

#: The version of ``JobSpec`` and ``Manifest``.
SCHEMA_VERSION: Literal[1] = 1


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def check_uri(value: str, *, field: str) -> str:
    """Accept ``s3://bucket/key`` or ``file:///absolute/path``; refuse ``..`` segments."""
    parsed = urlparse(value)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{field}: s3 URI needs a bucket: {value!r}")
    elif parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"{field}: file URI must be absolute (file:///...): {value!r}")
    else:
        hint = " (a local path is written file:///absolute/path)" if not parsed.scheme else ""
        raise ValueError(f"{field}: scheme must be s3:// or file://, got {value!r}{hint}")
    if any(part in {"..", "."} for part in parsed.path.split("/")):
        raise ValueError(f"{field}: '.' and '..' path segments are not allowed: {value!r}")
    return value

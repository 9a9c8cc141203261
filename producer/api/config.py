"""Read the gateway's two configuration files (keys, models): TOML or JSON by suffix, checked
by a pydantic model, every problem one ``SettingsError`` naming the file and the field."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from producer.errors import SettingsError

M = TypeVar("M", bound=BaseModel)
#: Configuration files are small; a larger one is a mistake (or not ours).
MAX_CONFIG_BYTES = 4 * 1024**2


def load(path: str | Path, model: type[M], setting: str) -> M:
    """Parse ``path`` (``.toml``, else JSON) into ``model``."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise SettingsError(f"{setting}: cannot read {p}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise SettingsError(f"{setting}: {p} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode()) if p.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise SettingsError(f"{setting}: {p} is not valid {p.suffix or 'JSON'}: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'file'}: {err['msg']}"
                           for err in e.errors())
        raise SettingsError(f"{setting}: {p}: {fields}") from None

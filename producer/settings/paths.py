"""Where a job's files may be read and written: file roots and the output prefix."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from producer.errors import InvalidJobError
from producer.wire.base import decode_uri


class PathSettings(BaseModel):
    """The file roots and the output prefix, and the checks on them."""

    file_roots: str | None = Field(
        default=None,
        description="absolute folders (':'-separated) a job's file:// paths may lie under; "
        "unset: the embedded mode's folder, none on a real broker; empty: none",
    )
    output_prefix: str | None = Field(
        default=None, pattern=r"^(s3://[^/\s]+|file:///)\S*$",
        description="s3:// or file:// prefix every job's output.uri must be under; unset: any",
    )

    @field_validator("output_prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        return v if v is None else decode_uri(v, field="FRAMEFLEET_OUTPUT_PREFIX").uri

    def check_output_uri(self, uri: str) -> None:
        """Refuse (``InvalidJobError`` naming ``output.uri``) an output that does not decode
        (``producer.wire.base.decode_uri``) or lies outside ``output_prefix``, compared decoded,
        segment by segment; the client checks at submit, the worker again on receipt."""
        try:
            target = decode_uri(uri, field="output.uri")
        except ValueError as e:
            raise InvalidJobError(str(e)) from None
        prefix = self.output_prefix
        if prefix is None:
            return
        if not target.within(decode_uri(prefix, field="FRAMEFLEET_OUTPUT_PREFIX")):
            raise InvalidJobError(f"output.uri: {uri} is not under this fleet's output prefix "
                                  f"{prefix} (FRAMEFLEET_OUTPUT_PREFIX)")

    @property
    def file_root_list(self) -> tuple[str, ...]:
        """FRAMEFLEET_FILE_ROOTS split on ':' (empty when unset or empty)."""
        return tuple(r for r in (self.file_roots or "").split(":") if r)

"""Compile artifacts: the portable compile caches a worker loads before its warm-up compiles
(``worker.generate.model.artifacts``), and whether it publishes what it compiled itself."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CompiledSettings(BaseModel):
    """Where compile artifacts are found and whether this worker adds to them."""

    compile_artifacts: str | None = Field(
        default=None, max_length=1024,
        description="s3://bucket/prefix or an absolute folder (file:// or path) of compile "
        "artifacts (framefleet compile --out), read after the warm-up model's own compiled/ "
        "folder and before any warm-up compile; also where FRAMEFLEET_PUBLISH_COMPILED writes",
    )
    publish_compiled: bool = Field(
        default=False,
        description="after the warm-up, write an artifact for each tier that compiled a size "
        "no artifact had, into FRAMEFLEET_COMPILE_ARTIFACTS (else the model folder's "
        "compiled/): the next worker of the fleet starts warm. An artifact is replaced only by "
        "one that covers more sizes",
    )
    compile_artifact_max_mib: int = Field(
        default=1024, ge=1, le=64 * 1024,
        description="compile artifacts (and their index) larger than this are refused "
        "(counted while reading)",
    )
    compile_on_cpu: bool = Field(
        default=False,
        description="a CPU worker compiles its transformer blocks too (inductor's C++ "
        "backend; CI checks the compile artifacts with it); default: the CPU runs eager",
    )

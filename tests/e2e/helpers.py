"""Shared steps of the end-to-end tests: put latents in S3, verify a job's output."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save

from producer.app import QUEUE, TASK_NAME
from producer.wire.spec import (
    DEFAULT_TENANT,
    DecoderSpec,
    InputSpec,
    JobResult,
    JobSpec,
    Manifest,
    OutputSpec,
    VideoSpec,
    segment_name,
)
from worker.decoders.pattern import read_frame_index
from worker.pipeline.encode import read_frames_rgb


def put_latents(s3: Any, bucket: str, key: str, latent_frames: int, h: int = 8, w: int = 12,
                fmt: str = "safetensors") -> str:
    z = torch.randn(16, latent_frames, h, w, generator=torch.Generator().manual_seed(1))
    if fmt == "safetensors":
        data = save({"latents": z})
    else:
        buf = io.BytesIO()
        np.save(buf, z.numpy())
        data = buf.getvalue()
    s3.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def pattern_spec(job_id: str, input_uri: str, bucket: str, segment_frames: int = 12,
                 tenant: str = DEFAULT_TENANT, **kw: Any) -> JobSpec:
    return JobSpec(
        job_id=job_id, tenant=tenant, input=InputSpec(uri=input_uri),
        decoder=DecoderSpec(name="pattern"), video=VideoSpec(segment_frames=segment_frames),
        output=OutputSpec(uri=f"s3://{bucket}/out"), **kw,
    )


def verify_output(s3: Any, bucket: str, result: JobResult, tmp: Path,
                  besides: tuple[str, ...] = (), indexed: bool = True,
                  previews: bool = False) -> list[int]:
    """Download manifest and segments; check sizes, hashes and every frame index (``besides``:
    names of other files the job's folder holds, ``ledger.json`` say). ``indexed=False``: the
    frames carry no index (a generate job's): each segment decodes to its frame count.
    ``previews``: the folder's ``previews/`` holds the denoise's previews besides.

    Returns the frame indices read from the video (or their positions), in playback order.
    """
    client = s3.client()
    prefix = f"out/{result.manifest.tenant}/{result.manifest.job_id}/"
    manifest_key = prefix + "manifest.json"
    assert result.manifest_uri == f"s3://{bucket}/{manifest_key}"
    manifest = Manifest.model_validate_json(
        client.get_object(Bucket=bucket, Key=manifest_key)["Body"].read()
    )
    assert manifest.segments == result.manifest.segments
    assert manifest.frames == result.manifest.frames
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
              if not (previews and o["Key"].startswith(prefix + "previews/"))}
    expected = {prefix + segment_name(s.index) for s in manifest.segments}
    expected.add(prefix + "index.m3u8")  # the live playlist, ended before the manifest
    expected |= {prefix + name for name in besides}
    playlist = client.get_object(Bucket=bucket, Key=prefix + "index.m3u8")["Body"].read()
    assert playlist.decode().endswith("#EXT-X-ENDLIST\n")
    assert manifest.playlist_uri == f"s3://{bucket}/{prefix}index.m3u8"
    assert listed == expected | {manifest_key}, listed ^ (expected | {manifest_key})
    indices: list[int] = []
    for seg in manifest.segments:
        data = client.get_object(Bucket=bucket, Key=prefix + segment_name(seg.index))["Body"].read()
        assert len(data) == seg.bytes
        assert hashlib.sha256(data).hexdigest() == seg.sha256
        path = tmp / f"{manifest.job_id}-{seg.index}.mp4"
        path.write_bytes(data)
        frames = read_frames_rgb(path)
        got = ([read_frame_index(f) for f in frames] if indexed
               else list(range(seg.first_frame, seg.first_frame + len(frames))))
        assert got == list(range(seg.first_frame, seg.first_frame + seg.frames))
        indices += got
    assert indices == list(range(manifest.frames))
    return indices


def push_undecodable(r: Any) -> str:
    """Push a well-formed kombu envelope whose body is not JSON onto the queue, as a broken
    producer would; returns its task id."""
    task_id = str(uuid.uuid4())
    envelope = {
        "body": base64.b64encode(b"{{not json").decode(), "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": TASK_NAME, "id": task_id, "root_id": task_id,
                    "parent_id": None, "group": None, "retries": 0},
        "properties": {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": QUEUE},
                       "priority": 0, "body_encoding": "base64",
                       "delivery_tag": str(uuid.uuid4())},
    }  # fmt: skip
    r.lpush(QUEUE, json.dumps(envelope))
    return task_id

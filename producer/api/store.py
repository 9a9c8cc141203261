"""The gateway's only boto3 module: reads outputs, writes uploads, presigns, deletes.

Keys come from the gateway itself (a job's output prefix, which the client checked against
``FRAMEFLEET_OUTPUT_PREFIX``, plus a fixed file name) or from a manifest the fleet wrote, and
are checked to lie under one of the fleet's prefixes before any request: a manifest can never
send the gateway elsewhere in the bucket.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from producer.errors import ApiRequestError
from producer.settings import Settings
from producer.wire.base import Location, decode_uri

CHUNK = 256 * 1024


@dataclass(frozen=True)
class Obj:
    bucket: str
    key: str


def _s3(uri: str) -> Location | None:
    """``uri`` decoded once (``producer.wire.base.decode_uri``, as the workers' stores decode it),
    or None for anything but a safe ``s3://`` object key."""
    try:
        loc = decode_uri(uri, field="uri")
    except ValueError:
        return None
    return loc if loc.scheme == "s3" else None


def parse(uri: str) -> Obj:
    """The bucket and the decoded key of an ``s3://`` URI: the key the workers wrote."""
    loc = _s3(uri)
    if loc is None:
        raise ApiRequestError(500, "not_s3", "the gateway reads s3:// outputs only")
    return Obj(loc.bucket, loc.key)


def under(uri: str, prefix: str) -> bool:
    """Whether ``uri`` names an object strictly under ``prefix``, both decoded once and
    compared segment by segment: no ``.``/``..``, encoded separator, control character or
    ``%`` left after decoding gets past (S3 takes keys literally; a reader of the URL may not)."""
    target, base = _s3(uri), _s3(prefix)
    return target is not None and base is not None and target.within(base, strict=True)


class Store:
    """One boto3 S3 client (thread-safe) for the fleet's endpoint."""

    def __init__(self, settings: Settings) -> None:
        import boto3
        from botocore.config import Config

        self.settings = settings
        self.client: Any = boto3.client(
            "s3", endpoint_url=settings.s3_endpoint_url, region_name=settings.s3_region,
            config=Config(retries={"max_attempts": settings.s3_max_attempts, "mode": "standard"},
                          signature_version="s3v4", connect_timeout=5, read_timeout=60,
                          max_pool_connections=64),
        )

    def _error(self, e: Exception, what: str) -> ApiRequestError:
        from botocore.exceptions import ClientError

        if isinstance(e, ClientError):
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in {"NoSuchKey", "404", "NotFound"}:
                return ApiRequestError(404, "not_found", f"no such file: {what}")
            if code == "InvalidRange":
                return ApiRequestError(416, "range_not_satisfiable", "range not satisfiable")
        return ApiRequestError(503, "store_unavailable", f"the object store failed on {what}")

    def get(self, obj: Obj,
            byte_range: str | None = None) -> tuple[dict[str, Any], Iterator[bytes]]:
        """GetObject (``byte_range``: ``bytes=a-b``): its response fields and a body iterator."""
        from botocore.exceptions import BotoCoreError, ClientError

        args = {"Bucket": obj.bucket, "Key": obj.key}
        if byte_range:
            args["Range"] = byte_range
        try:
            resp = self.client.get_object(**args)
        except (BotoCoreError, ClientError) as e:
            raise self._error(e, obj.key.rsplit("/", 1)[-1]) from None
        body = resp["Body"]

        def chunks() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(CHUNK)
            finally:
                body.close()

        return resp, chunks()

    def head(self, obj: Obj) -> dict[str, Any]:
        """HeadObject: ``ContentLength``, ``ETag`` …"""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            info: dict[str, Any] = self.client.head_object(Bucket=obj.bucket, Key=obj.key)
            return info
        except (BotoCoreError, ClientError) as e:
            raise self._error(e, obj.key.rsplit("/", 1)[-1]) from None

    def presign(self, obj: Obj) -> str:
        url: str = self.client.generate_presigned_url(
            "get_object", Params={"Bucket": obj.bucket, "Key": obj.key},
            ExpiresIn=self.settings.api_presign_s)
        return url

    def put(self, obj: Obj, data: bytes, content_type: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=obj.bucket, Key=obj.key, Body=data,
                                   ContentType=content_type)
        except (BotoCoreError, ClientError) as e:
            raise self._error(e, obj.key.rsplit("/", 1)[-1]) from None

    def delete_prefix(self, obj: Obj) -> int:
        """Delete every object under ``obj.key`` + ``/``; returns how many."""
        from botocore.exceptions import BotoCoreError, ClientError

        prefix, deleted = obj.key.rstrip("/") + "/", 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=obj.bucket, Prefix=prefix)
            for page in pages:
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    self.client.delete_objects(Bucket=obj.bucket, Delete={"Objects": keys})
                    deleted += len(keys)
        except (BotoCoreError, ClientError) as e:
            raise self._error(e, prefix) from None
        return deleted

    def ping(self, obj: Obj) -> None:
        """A cheap request that needs the credentials and the bucket (readiness)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.list_objects_v2(Bucket=obj.bucket, Prefix=obj.key, MaxKeys=1)
        except (BotoCoreError, ClientError) as e:
            raise self._error(e, obj.bucket) from None

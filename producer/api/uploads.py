"""``input_reference`` uploads: checked, then stored under the tenant's own input prefix.

Only PNG, JPEG and WebP are taken, by content (the worker decodes them again, with its own
limits). The object lands at ``{FRAMEFLEET_API_INPUT_PREFIX}/{tenant}/{public id}/`` and no
client ever names its key. :func:`image_fields` is the one seam between an upload and the job
spec: image-to-video (``generate.image``) is arriving in the wire format separately, and until
``GenerateSpec`` has the field the upload is refused there, and deleted.
"""

from __future__ import annotations

from producer.api.store import Store, parse
from producer.errors import ApiRequestError
from producer.settings import Settings
from producer.wire.spec import GenerateSpec

#: (magic test, extension, content type): decided by content, never by the name.
KINDS = (
    (lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"), "png", "image/png"),
    (lambda b: b.startswith(b"\xff\xd8\xff"), "jpg", "image/jpeg"),
    (lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP", "webp", "image/webp"),
)


def _kind(data: bytes) -> tuple[str, str]:
    for test, ext, content_type in KINDS:
        if test(data):
            return ext, content_type
    raise ApiRequestError(400, "invalid_image",
                          "input_reference: not a PNG, JPEG or WebP image", "input_reference")


def input_root(settings: Settings, tenant: str) -> str:
    """``s3://…/TENANT``: everything of the tenant's inputs lies under it."""
    if not settings.api_input_prefix:
        raise ApiRequestError(400, "uploads_disabled", "input_reference: this gateway takes "
                              "no uploads (FRAMEFLEET_API_INPUT_PREFIX is unset)",
                              "input_reference")
    return f"{settings.api_input_prefix.rstrip('/')}/{tenant}"


def store_upload(store: Store, settings: Settings, tenant: str, public_id: str,
                 data: bytes) -> str:
    """Check ``data`` and put it under the tenant's input prefix; returns its ``s3://`` URI."""
    if not data:
        raise ApiRequestError(400, "invalid_image", "input_reference: empty file",
                              "input_reference")
    if len(data) > settings.api_max_upload_bytes:
        raise ApiRequestError(413, "body_too_large", "input_reference: over "
                              f"{settings.api_max_upload_bytes} bytes", "input_reference")
    ext, content_type = _kind(data)
    uri = f"{input_root(settings, tenant)}/{public_id}/input_reference.{ext}"
    store.put(parse(uri), data, content_type)
    return uri


def image_fields(uri: str) -> dict[str, str]:
    """The ``generate`` fields that condition a job on the image at ``uri``.

    The seam: a spec without ``generate.image`` cannot carry it, so the request is refused
    (501, naming ``input_reference``) rather than run as text-to-video."""
    if "image" not in GenerateSpec.model_fields:
        raise ApiRequestError(501, "image_to_video_unavailable", "input_reference: this "
                              "fleet's job spec has no generate.image yet", "input_reference")
    return {"image": uri}


def discard(store: Store, uri: str) -> None:
    obj = parse(uri)
    store.client.delete_object(Bucket=obj.bucket, Key=obj.key)

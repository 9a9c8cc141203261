"""The gateway's rules as functions, beside their end-to-end tests (tests/e2e/test_api_hostile.py,
test_api_contract.py): the model map's one limits check, RFC 9110 ranges, failure codes,
the JSON depth bound, the metric labels, the new settings' ranges."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from producer.api.app import create_app
from producer.api.catalog import NATIVE_FIELDS, VIDEO_FIELDS, ModelEntry, check_limits
from producer.api.context import client_network
from producer.api.errors import error_type
from producer.api.failures import UNEXPECTED, describe, failure
from producer.api.files import byte_range
from producer.api.jsonbody import MAX_DEPTH, parse_json
from producer.api.ops import method_label
from producer.client.jobstate import JobState
from producer.errors import ApiRequestError, SettingsError
from producer.settings import Settings
from tests.gateway import Key
from tests.services import free_port

TINY = ModelEntry.model_validate({"folder": "/m/tiny", "size": "48x32", "seconds": "0.5",
                                  "steps": 2, "limits": {"max_pixels": 4096}})


@pytest.mark.parametrize(("dims", "field"), [
    ((48, 32, 9, 51, False), "steps"),
    ((48, 32, 1001, 2, False), "frames"),       # 62.5 s at 16 fps, over 10 s
    ((4096, 4096, 9, 2, False), "size"),        # over max_pixels
    ((40, 32, 9, 2, False), "size"),            # not a multiple of 16
    ((48, 32, 9, 2, True), "image"),            # a text-to-video model
])
def test_one_limits_check_names_each_apis_own_field(dims: tuple[int, int, int, int, bool],
                                                   field: str) -> None:
    for fields in (VIDEO_FIELDS, NATIVE_FIELDS):
        with pytest.raises(ApiRequestError) as e:
            check_limits(TINY, *dims, fields)
        assert e.value.param == getattr(fields, field)
        assert e.value.message.startswith(f"{getattr(fields, field)}: ")
    check_limits(TINY, 48, 32, 161, 50, False, NATIVE_FIELDS)  # exactly 10 s, 50 steps


@pytest.mark.parametrize(("header", "size", "want"), [
    ("bytes=0-9999999999999999999", 100, (0, 99)),
    ("bytes=10-", 100, (10, 99)),
    ("bytes=10-19", 100, (10, 19)),
    ("bytes=-30", 100, (70, 99)),
    ("bytes=-1000", 100, (0, 99)),
    ("bytes=99-", 100, (99, 99)),
    ("bytes=9-3", 100, None),          # invalid: ignored
    ("bytes=0-1,5-9", 100, None),      # several: ignored
    ("bytes=a-b", 100, None),
    ("items=0-9", 100, None),
    (None, 100, None),
])
def test_a_range_is_clamped_to_the_object(header: str | None, size: int,
                                          want: tuple[int, int] | None) -> None:
    assert byte_range(header, size) == want


@pytest.mark.parametrize(("header", "size"), [("bytes=100-", 100), ("bytes=-0", 100),
                                              ("bytes=0-", 0), ("bytes=200-300", 100)])
def test_a_range_past_the_end_is_416_naming_the_size(header: str, size: int) -> None:
    with pytest.raises(ApiRequestError) as e:
        byte_range(header, size)
    assert (e.value.status, e.value.headers) == (416, {"Content-Range": f"bytes */{size}"})


@pytest.mark.parametrize(("reason", "code", "passes"), [
    ("RuntimeError: shape '[1, 45, 1, -1]' is invalid for input of size 4321", "internal_error",
     False),
    ("InvalidJobError: input s3://b/in/acme/x.npy: latents contain NaN or Inf", "invalid_job",
     True),
    ("InputNotFoundError: no such object: in/acme/x.npy", "input_not_found", True),
    ("StorageError: S3 SlowDown on out/acme/j/segment-00000.mp4", "storage_error", False),
    ("FatalJobError: worker memory over its limit: RSS measured 9000 MiB", "job_failed", False),
    ("TimeLimitExceeded: TimeLimitExceeded(3660,)", "time_limit", False),
    ("not a typed reason at all", "internal_error", False),
])
def test_a_failure_reads_as_a_stable_code(reason: str, code: str, passes: bool) -> None:
    js = JobState("j", "FAILURE", reason=reason)
    found = failure(js)
    assert found is not None and found.code == code
    assert (found.message == reason.split(": ", 1)[-1]) is passes
    assert describe(js) == f"failed: {found.message}"
    assert failure(JobState("j", "FAILURE")) is None
    long = failure(JobState("j", "FAILURE", reason="InvalidJobError: " + "x" * 5000))
    assert long is not None and len(long.message) == 300
    assert UNEXPECTED.code == "internal_error"


@pytest.mark.parametrize("raw", [b"[" * 2000, b"[" * 100 + b"]" * 100,
                                 b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1)])
def test_deep_json_is_a_400_naming_the_body(raw: bytes) -> None:
    with pytest.raises(ApiRequestError) as e:
        parse_json(raw)
    assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_json", "body")
    assert parse_json(b'{"a":' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH) is not None
    with pytest.raises(ApiRequestError, match="body: not JSON"):
        parse_json(b"\xff{")


def test_labels_and_types_come_from_fixed_sets() -> None:
    assert [method_label(m) for m in ("GET", "HEAD", "DELETE", "get", "X" * 4096)] == [
        "GET", "HEAD", "DELETE", "other", "other"]
    assert [error_type(s) for s in (400, 405, 416, 422, 429, 401, 500, 503)] == [
        "invalid_request_error", "invalid_request_error", "invalid_request_error",
        "invalid_request_error", "rate_limit_error", "authentication_error", "server_error",
        "server_error"]
    assert client_network("203.0.113.7") == "203.0.113.7"
    assert client_network("2001:db8:1:2:3:4:5:6") == client_network("2001:db8:1:2::9")
    assert client_network("2001:db8:1:2::9") == "2001:db8:1:2::/64"


@pytest.mark.parametrize(("field", "value"), [
    ("api_anon_rate_per_minute", 0), ("api_max_streams", 0), ("api_max_streams", 10_001),
    ("api_trusted_proxies", "*"), ("api_trusted_proxies", "10.0.0.1/8"),
    ("api_trusted_proxies", "lb.example"),
])
def test_the_new_settings_are_range_checked(field: str, value: object) -> None:
    with pytest.raises(SettingsError, match=f"FRAMEFLEET_{field.upper()}"):
        Settings(**{field: value})
    assert Settings(api_trusted_proxies="10.0.0.0/16, ::1").api_trusted_proxy_list == [
        "10.0.0.0/16", "::1"]


def test_without_redis_a_request_is_a_503_in_the_one_shape(api_settings: Settings,
                                                          keys: dict[str, Key]) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = api_settings.model_copy(update={"broker_url": dead, "result_backend": dead})
    with TestClient(create_app(settings)) as client:
        for headers in (keys["acme"].headers, {}):  # a tenant's limit, an address's limit
            r = client.get("/v1/videos", headers=headers)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "fleet_unavailable"
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 503

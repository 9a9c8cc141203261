"""``decode_uri``: a URI decoded once into the form the stores use, and everything that could
read differently later refused, naming the field."""

from __future__ import annotations

import pytest

from producer.wire.base import Location, check_uri, decode_uri


@pytest.mark.parametrize(("uri", "scheme", "bucket", "path"), [
    ("s3://b", "s3", "b", ""),
    ("s3://b/", "s3", "b", ""),
    ("s3://my-bucket.x/videos/a b/z.npy", "s3", "my-bucket.x", "videos/a b/z.npy"),
    ("s3://b/videos/a%20b/z%41.npy", "s3", "b", "videos/a b/zA.npy"),
    ("s3://b/caf%C3%A9/x", "s3", "b", "café/x"),
    ("s3://b/prefix/", "s3", "b", "prefix/"),
    ("S3://b/k", "s3", "b", "k"),
    ("file:///R/out", "file", "", "/R/out"),
    ("file:///R/out/", "file", "", "/R/out/"),
    ("file://localhost/R/in%20put.npy", "file", "", "/R/in put.npy"),
    ("file:///R/a..b/..c/c..", "file", "", "/R/a..b/..c/c.."),
    ("file:///", "file", "", "/"),
])
def test_a_safe_uri_decodes_once_into_the_stores_form(
    uri: str, scheme: str, bucket: str, path: str
) -> None:
    loc = decode_uri(uri, field="input.uri")
    assert (loc.scheme, loc.bucket, loc.path, loc.uri) == (scheme, bucket, path, uri)
    assert check_uri(uri, field="input.uri") == uri
    assert loc.key == "/".join(p for p in path.split("/") if p)


@pytest.mark.parametrize(("uri", "why"), [
    # dots, encoded or not, in any position and any case
    ("file:///R/out/../x", "'.' and '..' path segments"),
    ("file:///R/out/%2e%2e/x", "'.' and '..' path segments"),
    ("file:///R/out/%2E%2E/x", "'.' and '..' path segments"),
    ("file:///R/out/.%2e", "'.' and '..' path segments"),
    ("file:///R/out/%2e", "'.' and '..' path segments"),
    ("file:///R/./out", "'.' and '..' path segments"),
    ("file:///%2e%2e", "'.' and '..' path segments"),
    ("s3://b/videos/%2e%2e/escaped", "'.' and '..' path segments"),
    ("s3://b/%2E%2E", "'.' and '..' path segments"),
    ("s3://b/..", "'.' and '..' path segments"),
    ("s3://b/a/.", "'.' and '..' path segments"),
    # encoded separators: they would become separators after the checks
    ("file:///R/out/x%2F..%2F..%2Fescaped", "encoded separators"),
    ("file:///R/out/x%2f..%2fescaped", "encoded separators"),
    ("s3://b/videos%2F..%2Fx", "encoded separators"),
    ("s3://b/videos/..%5Cescaped", "encoded separators"),
    ("s3://b/videos/..%5cescaped", "encoded separators"),
    ("file:///R/out/..\\escaped", "'\\', '%', '?' and '#'"),
    # double encoding: decoded once it is the literal '%2e', refused, never a second decode
    ("file:///R/out/%252e%252e/escaped", "'\\', '%', '?' and '#'"),
    ("s3://b/videos/%252E%252E/x", "'\\', '%', '?' and '#'"),
    ("s3://b/videos/%25252e/x", "'\\', '%', '?' and '#'"),
    ("s3://b/videos/%zz", "'\\', '%', '?' and '#'"),
    ("s3://b/videos/100%", "'\\', '%', '?' and '#'"),
    # NUL and other controls, raw or encoded, anywhere (urllib drops some raw ones silently)
    ("file:///R/out/x%00/y", "control characters"),
    ("file:///R/out/x\x00", "control characters"),
    ("s3://b/videos/x%00", "control characters"),
    ("s3://b/videos/x%0A", "control characters"),
    ("s3://b/videos/.\n./x", "control characters"),
    ("file:///R/out/%7F", "control characters"),
    ("s3://b\t/x", "control characters"),
    # query and fragment: urllib would cut them off the path the checks saw
    ("file:///R/out/x?/../../etc", "a query or fragment"),
    ("s3://b/videos/x#/../y", "a query or fragment"),
    ("s3://b/videos/x%3F", "'\\', '%', '?' and '#'"),
    ("s3://b/videos/x%23", "'\\', '%', '?' and '#'"),
    # S3 keys: no leading '/', no empty segment
    ("s3://b//escaped", "may not start with '/'"),
    ("s3://b/%2Fescaped", "encoded separators"),
    ("s3://b/videos//x", "empty path segments"),
    ("file:///R//out", "empty path segments"),
    # the bucket is taken literally: nothing encoded or odd in it
    ("s3://b%2e%2e/x", "not a bucket name"),
    ("s3://user@b/x", "not a bucket name"),
    ("s3://b:9000/x", "not a bucket name"),
    ("s3:///nobucket.npy", "needs a bucket"),
    # not UTF-8 once decoded
    ("s3://b/videos/%ff", "decode as UTF-8"),
    # the scheme and absolute file paths, as before
    ("http://example.com/a.npy", "scheme must be s3:// or file://"),
    ("/R/out", "scheme must be s3:// or file://"),
    ("file://relative/a.npy", "file URI must be absolute"),
    ("file://host/R/a.npy", "file URI must be absolute"),
])
def test_what_could_read_differently_later_is_refused_naming_the_field(
    uri: str, why: str
) -> None:
    with pytest.raises(ValueError) as info:
        decode_uri(uri, field="output.uri")
    assert str(info.value).startswith("output.uri: "), info.value
    assert why in str(info.value), info.value
    with pytest.raises(ValueError, match=r"^decoder\.weights: "):
        check_uri(uri, field="decoder.weights")


def test_within_compares_decoded_segments_in_the_same_store() -> None:
    prefix = decode_uri("file:///R/out", field="p")
    assert decode_uri("file:///R/out", field="o").within(prefix)
    assert decode_uri("file:///R/out/", field="o").within(prefix)
    assert not decode_uri("file:///R/out/", field="o").within(prefix, strict=True)
    assert decode_uri("file:///R/%6Fut/a", field="o").within(prefix, strict=True)
    assert decode_uri("file://localhost/R/out/a", field="o").within(prefix)
    assert not decode_uri("file:///R/outside", field="o").within(prefix)
    assert not decode_uri("file:///R", field="o").within(prefix)
    s3 = decode_uri("s3://b/videos", field="p")
    assert decode_uri("s3://b/videos/t/j", field="o").within(s3)
    assert not decode_uri("s3://b/videos2/t", field="o").within(s3)
    assert not decode_uri("s3://other/videos/t", field="o").within(s3)
    assert not decode_uri("file:///videos/t", field="o").within(s3)
    assert decode_uri("s3://b/x", field="o").within(decode_uri("s3://b", field="p"))


def test_a_location_is_a_frozen_value() -> None:
    loc = decode_uri("s3://b/k", field="f")
    assert loc == Location("s3", "b", "k", "s3://b/k")
    with pytest.raises(AttributeError):
        loc.path = "other"  # type: ignore[misc]

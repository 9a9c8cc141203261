"""The gateway reads the keys the workers wrote: ``s3://`` URIs decoded once
(``producer.wire.base.decode_uri``), and a tenant's prefix compared on the decoded form."""

from __future__ import annotations

import pytest

from producer.api.store import Obj, parse, under
from producer.errors import ApiRequestError

ROOT = "s3://inputs/IN/acme"


@pytest.mark.parametrize("uri", [f"{ROOT}/%2e%2e/beta/z.npy", f"{ROOT}/%2E%2E/beta/z.npy",
                                 f"{ROOT}/x%2F..%2F..%2Fbeta/z.npy", f"{ROOT}/..%5Cbeta",
                                 f"{ROOT}/%252e%252e/beta", f"{ROOT}/x%00", f"{ROOT}//z.npy",
                                 f"{ROOT}/../beta/z.npy", "s3://inputs/IN/acmebeta/z.npy",
                                 "s3://other/IN/acme/z.npy", "file:///IN/acme/z.npy", ROOT,
                                 f"{ROOT}/", f"{ROOT}/z.npy?x=1"])
def test_nothing_outside_the_tenants_prefix_is_under_it(uri: str) -> None:
    assert not under(uri, ROOT)


def test_an_object_under_the_prefix_is_under_it_however_it_is_spelt() -> None:
    assert under(f"{ROOT}/u1/z.npy", ROOT)
    assert under(f"{ROOT}/u1/z.npy", ROOT + "/")
    assert under("s3://inputs/IN/%61cme/u1/z.npy", ROOT)  # %61 is 'a': the same key


def test_parse_gives_the_decoded_key_the_workers_wrote() -> None:
    assert parse("s3://videos/out/my%20clip/index.m3u8") == Obj("videos", "out/my clip/index.m3u8")
    for uri in ("s3://videos/out/%2e%2e/x", "s3://videos//x", "file:///x", "s3://videos/%00"):
        with pytest.raises(ApiRequestError):
            parse(uri)

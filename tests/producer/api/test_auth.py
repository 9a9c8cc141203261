"""Keys: stored hashed, compared in constant time, the tenant taken from the key only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from producer.api import auth
from producer.api.auth import KeyRing
from producer.errors import ApiRequestError, SettingsError
from tests.gateway import write_keys


def test_the_key_names_the_tenant_and_its_limits(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.toml", {"acme": {"delete_outputs": True},
                                               "beta": {"rate_per_minute": 3,
                                                        "max_streams": 2}})
    ring = KeyRing(str(tmp_path / "keys.toml"), rate_per_minute=600, max_in_flight=16,
                   max_streams=8)
    acme = ring.tenant(f"Bearer {keys['acme'].secret}")
    assert (acme.name, acme.delete_outputs, acme.rate_per_minute) == ("acme", True, 600)
    beta = ring.tenant(f"bearer  {keys['beta'].secret} ")
    assert (beta.name, beta.rate_per_minute, beta.max_in_flight, beta.max_streams) == (
        "beta", 3, 16, 2)
    assert acme.max_streams == 8
    # The file holds hashes only: no key is in it.
    text = (tmp_path / "keys.toml").read_text()
    assert keys["acme"].secret not in text and keys["beta"].secret not in text


@pytest.mark.parametrize(("header", "code"), [
    (None, "missing_api_key"), ("", "missing_api_key"), ("Basic abc", "missing_api_key"),
    ("Bearer ", "missing_api_key"), ("Bearer not-a-key", "invalid_api_key"),
])
def test_no_key_or_a_wrong_key_is_401(tmp_path: Path, header: str | None, code: str) -> None:
    write_keys(tmp_path / "keys.toml", {"acme": {}})
    ring = KeyRing(str(tmp_path / "keys.toml"), 600, 16, 8)
    with pytest.raises(ApiRequestError) as e:
        ring.tenant(header)
    assert (e.value.status, e.value.code) == (401, code)


def test_every_entry_is_compared_with_compare_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = write_keys(tmp_path / "keys.toml", {f"t{i}": {} for i in range(5)})
    ring = KeyRing(str(tmp_path / "keys.toml"), 600, 16, 8)
    calls: list[bytes] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    # A match on the first entry still compares all five: the time says nothing.
    assert ring.tenant(f"Bearer {keys['t0'].secret}").name == "t0"
    assert len(calls) == 5
    calls.clear()
    with pytest.raises(ApiRequestError):
        ring.tenant("Bearer wrong")
    assert len(calls) == 5


def test_a_rotated_file_is_read_again_and_a_broken_one_keeps_the_last(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    old = write_keys(path, {"acme": {}})
    ring = KeyRing(str(path), 600, 16, 8)
    new = write_keys(path, {"acme": {}})
    os.utime(path, ns=(1, 2))  # a new mtime, whatever the clock's resolution
    assert ring.tenant(f"Bearer {new['acme'].secret}").name == "acme"
    with pytest.raises(ApiRequestError):
        ring.tenant(f"Bearer {old['acme'].secret}")
    path.write_text("[[keys]]\ntenant = 'acme'\n")  # half-written: no sha256
    os.utime(path, ns=(3, 4))
    assert ring.tenant(f"Bearer {new['acme'].secret}").name == "acme"


def test_a_bad_keys_file_names_the_setting_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    digest = hashlib.sha256(b"k").hexdigest()
    path.write_text(f'{{"keys": [{{"tenant": "../x", "sha256": "{digest}"}}]}}')
    with pytest.raises(SettingsError, match=r"FRAMEFLEET_API_KEYS_FILE: .*keys\.0\.tenant"):
        KeyRing(str(path), 600, 16, 8)
    path.write_text('{"keys": [{"tenant": "a", "sha256": "ABC"}]}')
    with pytest.raises(SettingsError, match=r"keys\.0\.sha256"):
        KeyRing(str(path), 600, 16, 8)

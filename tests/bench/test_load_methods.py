"""bench/startup/load_methods.py's rule: the chosen load method is the fastest one that is
bit-identical to diffusers and wholly on the device, after a dropped page cache where one
ran; a row whose digest differs is never chosen, however fast. And how ``--methods`` reads."""

from __future__ import annotations

from typing import Any

import pytest

from bench.startup.load_methods import choose, mark_exact, parse_methods


def _row(method: str, seconds: float, digest: str, cache: str = "cold",
         on_device: bool = True) -> dict[str, Any]:
    return {"method": method, "cache": cache, "dropped": cache == "cold", "status": "ok",
            "seconds": seconds, "digest": digest, "on_device": on_device}


def test_a_fast_row_with_another_digest_is_never_chosen() -> None:
    # Given diffusers as the reference, a fast method that is exact and a faster one that is not
    rows = [_row("diffusers", 30.0, "ref"), _row("fast:8", 9.0, "ref"),
            _row("fastsafetensors", 4.0, "other")]
    # When the rows are marked and chosen from
    mark_exact(rows)
    chosen = choose(rows)
    # Then the exact one wins and the reason names the one left out
    assert [r["exact"] for r in rows] == [True, True, False]
    assert chosen["method"] == "fast:8" and chosen["seconds"] == 9.0
    assert "not exact, never chosen: fastsafetensors" in chosen["reason"]
    assert "next diffusers 30.00 s" in chosen["reason"]


def test_cold_rows_decide_and_warm_ones_only_without_them() -> None:
    rows = [_row("diffusers", 3.0, "ref", cache="warm"), _row("fast:4", 1.0, "ref", cache="warm"),
            _row("diffusers", 30.0, "ref"), _row("fast:4", 31.0, "ref"),
            _row("fast:16", 2.0, "ref", cache="cold", on_device=False)]
    mark_exact(rows)
    # the fastest warm row and a row with tensors left on the host do not count
    assert choose(rows)["method"] == "diffusers"
    assert "page cache dropped" in choose(rows)["reason"]
    # a "cold" run whose page cache could not be dropped is no cold run
    for r in rows:
        r["dropped"] = False
    assert choose(rows)["method"] == "fast:4" and choose(rows)["cache"] == "warm"


def test_nothing_is_chosen_without_the_diffusers_reference() -> None:
    rows = [_row("fast:4", 1.0, "a"), {"method": "fastsafetensors", "cache": "cold",
                                       "status": "not installed"}]
    mark_exact(rows)
    assert rows[0]["exact"] is None
    assert choose(rows) == {"method": None, "reason": "no row matches diffusers' digest"}


def test_methods_expand_fast_per_thread_count_and_refuse_unknown_names() -> None:
    assert parse_methods("all", [1, 8]) == ["diffusers", "device_map", "fast:1", "fast:8",
                                            "fastsafetensors"]
    assert parse_methods("fast:4,diffusers,fast", [4, 16]) == ["fast:4", "diffusers", "fast:16"]
    with pytest.raises(SystemExit, match="unknown method 'mmap'"):
        parse_methods("diffusers,mmap", [1])

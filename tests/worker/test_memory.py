"""The memory guard's measure and limit, against this process and this host."""

from __future__ import annotations

import psutil
import pytest

from producer.errors import FatalJobError
from producer.settings import Settings
from worker.memory import (
    HOST_SHARE,
    MIB,
    check_memory,
    host_memory_bytes,
    limit_mib,
    rss_bytes,
)


def test_rss_is_this_process_resident_size() -> None:
    ours, theirs = rss_bytes(), psutil.Process().memory_info().rss
    assert abs(ours - theirs) < 64 * MIB, (ours, theirs)


def test_the_default_limit_is_a_share_of_the_host() -> None:
    host = host_memory_bytes()
    assert host is not None and host <= psutil.virtual_memory().total
    assert limit_mib(Settings()) == int(host * HOST_SHARE / MIB)
    assert limit_mib(Settings(max_rss_mib=0)) is None
    assert limit_mib(Settings(max_rss_mib=123)) == 123


def test_over_the_limit_is_a_fatal_error_naming_it() -> None:
    named = r"RSS measured \d+ MiB here, FRAMEFLEET_MAX_RSS_MIB=1;"
    with pytest.raises(FatalJobError, match=named):
        check_memory(Settings(max_rss_mib=1), "here")
    check_memory(Settings(max_rss_mib=rss_bytes() // MIB + 1024), "here")
    check_memory(Settings(max_rss_mib=0), "here")


@pytest.mark.parametrize(("mib", "per_child"), [(700, 700 * 1024), (0, None)])
def test_a_pool_process_over_the_limit_after_its_job_is_replaced(
    mib: int, per_child: int | None
) -> None:
    from worker.lifecycle.main import build_worker_app

    app = build_worker_app(Settings(max_rss_mib=mib, broker_url="redis://127.0.0.1:1/0"))
    assert app.conf.worker_max_memory_per_child == per_child

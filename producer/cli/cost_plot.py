"""``framefleet cost report --plot``: $ per video-minute over time, as a PNG (matplotlib, the
``plot`` extra)."""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from producer.wire.spec import JobResult


def cost_over_time(
    results: Iterable[JobResult], *, bucket_s: float, by: Literal["tenant"] | None = "tenant"
) -> dict[str, list[tuple[float, float]]]:
    """Direct $ per video-minute per ``bucket_s`` of ``finished_at``, per group, time-sorted.

    Jobs without a cost report are left out.
    """
    sums: dict[str, dict[float, list[float]]] = {}
    for r in results:
        if r.cost is None:
            continue
        group = r.manifest.tenant if by == "tenant" else "all"
        start = math.floor(r.finished_at / bucket_s) * bucket_s
        acc = sums.setdefault(group, {}).setdefault(start, [0.0, 0.0])
        acc[0] += r.cost.total_usd
        acc[1] += r.cost.video_seconds / 60.0
    return {
        group: [(t, usd / minutes) for t, (usd, minutes) in sorted(buckets.items()) if minutes]
        for group, buckets in sorted(sums.items())
    }


#: What ``--plot`` needs, the extra that installs it, and where: the environment this
#: ``framefleet`` runs from (its ``bin/`` holds the command; installing into another one
#: gives that one a ``framefleet`` of its own).
PLOT_MISSING = ("--plot needs matplotlib, which is not installed: pip install 'framefleet[plot]' "
                f"into {sys.prefix}, the environment this framefleet runs from (from a checkout: "
                "pip install -e '.[plot]')")


def require_matplotlib() -> None:
    """Raise ``ImportError`` with :data:`PLOT_MISSING` unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(PLOT_MISSING) from e


def cost_figure(results: list[JobResult], *, bucket_s: float, by: str | None) -> Any:
    """A matplotlib Figure (Agg canvas) of $ per video-minute over time, one line per group.

    The time axis spans the points; a single time (one point, or one bucket) gets one bucket
    either side, not matplotlib's default of several years."""
    require_matplotlib()
    import matplotlib.dates as mdates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure with an Agg canvas, not pyplot: no global state, no display needed.
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    series = cost_over_time(results, bucket_s=bucket_s, by="tenant" if by == "tenant" else None)
    for group, points in series.items():
        stamps = [dt.datetime.fromtimestamp(t, tz=dt.UTC) for t, _ in points]
        times = mdates.date2num(stamps)  # type: ignore[no-untyped-call]
        ax.plot(times, [v for _, v in points], marker="o", label=group)
    ax.xaxis_date(tz=dt.UTC)
    starts = {t for points in series.values() for t, _ in points}
    if len(starts) == 1:
        (t,) = starts
        pad = dt.timedelta(seconds=bucket_s)
        mid = dt.datetime.fromtimestamp(t, tz=dt.UTC)
        ax.set_xlim(mdates.date2num(mid - pad), mdates.date2num(mid + pad))  # type: ignore[no-untyped-call]
    ax.set_title(f"$ per video-minute (direct), {bucket_s / 60:g}-minute buckets")
    ax.set_ylabel("USD per video-minute")
    ax.set_xlabel("finished (UTC)")
    locator = ax.xaxis.get_major_locator()
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    highest = max((v for points in series.values() for _, v in points), default=0.0)
    ax.set_ylim(0, highest * 1.15 or 1.0)  # headroom, also when every point is equal
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(loc="best", fontsize="small")
    return fig


def write_plot(results: list[JobResult], path: Path, *, bucket_s: float, by: str | None) -> None:
    """PNG of $ per video-minute over time (``cost_figure``), at 110 dpi."""
    cost_figure(results, bucket_s=bucket_s, by=by).savefig(path, dpi=110)

"""What one model of the map accepts, as sets a schema can list: its sizes, frame counts,
durations and steps.

A request is checked by three rules in turn: the spec's own bounds (``GenerateSpec``: 16 to 4096
px, ``4k+1`` frames), the map's limits (``producer.api.catalog.check_limits``) and the fleet's
and the model's (``producer.wire.fits``, with the model's ``Reach`` where this host has its
folder). The three only ever bound one quantity at a time, but for the pixels (width x
height), so what passes is a product of independent sets: sizes (pairs), frames, steps. This
module computes those sets from the same numbers the checks read, so that the OpenAPI document
(``producer.api.schema``) says exactly what the checks let through; a test holds the two
together on samples (tests/producer/api/test_accepts.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from producer.api.catalog import MAX_SECONDS, SIZE_RE, ModelEntry
from producer.settings import Settings
from producer.wire.fits import multiples
from producer.wire.reach import Reach

#: ``GenerateSpec``'s own bounds on a side, on frames and on steps.
MIN_SIDE, MAX_SIDE, MAX_FRAMES, MAX_STEPS = 16, 4096, 100_000, 10_000


@dataclass(frozen=True)
class Band:
    """Heights ``low`` to ``high`` (multiples of ``step``) take widths up to ``widest``."""

    low: int
    high: int
    widest: int


@dataclass(frozen=True)
class Accepts:
    """What one model takes."""

    width_step: int  # widths are multiples of it, from width_step's first multiple >= 16
    height_step: int
    bands: tuple[Band, ...]  # the grid's sizes under the pixel limit, by height
    listed: tuple[tuple[int, int], ...] | None  # the map's own list of sizes, those that pass
    frames: tuple[int, ...]  # every frame count, ascending
    steps: int  # the most steps (from 1)
    image: bool  # takes an input image

    def sizes(self) -> list[tuple[int, int]]:
        """Every (width, height) it takes."""
        if self.listed is not None:
            return list(self.listed)
        return [(w, h) for band in self.bands
                for h in range(band.low, band.high + 1, self.height_step)
                for w in range(first_side(self.width_step), band.widest + 1, self.width_step)]

    def takes_size(self, width: int, height: int) -> bool:
        if self.listed is not None:
            return (width, height) in self.listed
        return width % self.width_step == 0 and width >= MIN_SIDE and any(
            b.low <= height <= b.high and height % self.height_step == 0 and width <= b.widest
            for b in self.bands)


def first_side(step: int) -> int:
    """The smallest multiple of ``step`` that is a side ``GenerateSpec`` takes."""
    return step * math.ceil(MIN_SIDE / step)


def accepts(entry: ModelEntry, model: Reach | None, settings: Settings) -> Accepts:
    """What ``entry`` takes, with its folder's ``model`` (None: not on this host) under the
    fleet's limits in ``settings``."""
    mw, mh = multiples(model) if model is not None else (1, 1)
    wstep, hstep = math.lcm(entry.size_multiple, mw), math.lcm(entry.size_multiple, mh)
    widest = min(MAX_SIDE, model.width if model else MAX_SIDE)
    tallest = min(MAX_SIDE, model.height if model else MAX_SIDE)
    pixels = min(entry.limits.max_pixels, settings.max_pixels)
    bands: list[Band] = []
    for h in range(first_side(hstep), tallest + 1, hstep):
        most = min(widest, pixels // h) // wstep * wstep
        if most < first_side(wstep):
            break  # taller ones take fewer pixels' width still
        if bands and bands[-1].widest == most and bands[-1].high + hstep == h:
            bands[-1] = Band(bands[-1].low, h, most)
        else:
            bands.append(Band(h, h, most))
    grid = Accepts(wstep, hstep, tuple(bands), None, (), 0, False)
    listed = None
    if entry.limits.sizes:
        pairs = [SIZE_RE.match(s) for s in entry.limits.sizes]
        listed = tuple(dict.fromkeys((int(m[1]), int(m[2])) for m in pairs if m is not None
                                     and grid.takes_size(int(m[1]), int(m[2]))))
    return Accepts(wstep, hstep, tuple(bands), listed, _frames(entry, model, settings),
                   min(entry.limits.max_steps, settings.max_denoise_steps, MAX_STEPS),
                   entry.image_to_video)


def _frames(entry: ModelEntry, model: Reach | None, settings: Settings) -> tuple[int, ...]:
    step = math.lcm(4, model.temporal) if model is not None else 4
    most = min(MAX_FRAMES, settings.max_frames, model.frames if model else MAX_FRAMES)
    # the map's duration, exactly: frames - 1 intervals at fps within max_seconds
    intervals = Decimal(str(entry.limits.max_seconds)) * Decimal(str(entry.fps))
    return tuple(f for f in range(1, most + 1, step) if Decimal(f - 1) <= intervals)


def seconds(entry: ModelEntry, frames: tuple[int, ...]) -> dict[str, int]:
    """Every duration ``/v1/videos`` takes, written as it must be (``0.5``, ``1``, ``1.25``),
    with its frame count: ``seconds x fps`` intervals, a finite decimal in (0, 3600]."""
    fps = Fraction(Decimal(str(entry.fps)))
    out = {}
    for f in frames:
        value = Fraction(f - 1) / fps
        if f > 1 and value <= MAX_SECONDS and _finite(value):
            out[written(Decimal(value.numerator) / Decimal(value.denominator))] = f
    return out


def _finite(value: Fraction) -> bool:
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def written(value: Decimal) -> str:
    """A duration as ``/v1/videos`` writes and reads it: no exponent, no trailing zeros."""
    text = format(value.normalize(), "f")
    return text

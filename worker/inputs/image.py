"""An image a job conditions on (``generate.image``, ``generate.last_image``): read, decoded
safely, converted and sized.

- **Read** with the same bounded reader as latents (``worker.stores.storage.read_uri``: a
  ``file://`` path inside the worker's roots, symlinks resolved, a regular file; or ``s3://``),
  at most ``FRAMEFLEET_MAX_IMAGE_BYTES``.
- **Decoded** with Pillow, restricted to PNG, JPEG and WebP (decided by the content's magic
  bytes, never by the name). The header is read first: an image of more pixels than
  ``FRAMEFLEET_MAX_IMAGE_PIXELS`` is refused before any pixel is decoded (a decompression
  bomb), and Pillow's own bomb check is set to the same limit. A truncated or corrupt file
  fails (truncated images are not loaded half). Animated files give their first frame.
- **Converted** explicitly to 8-bit RGB: the EXIF orientation is applied; CMYK by Pillow's
  conversion; palette images through RGBA; 16-bit grey scaled to 8 bits (high byte); any alpha
  composited over white.
- **Sized** to the job's width x height by ``generate.image_resize``: ``crop`` (the default:
  scale to cover, centre crop), ``pad`` (scale to fit, black bars) or ``stretch``.

Every refusal is an ``InvalidJobError`` naming the field.
"""

from __future__ import annotations

import hashlib
import io
import re
import warnings
from dataclasses import dataclass
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings
from worker.stores.storage import read_uri

#: (magic test, Pillow format): what a job's image may be, by content.
KINDS = (
    (lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"), "PNG"),
    (lambda b: b.startswith(b"\xff\xd8\xff"), "JPEG"),
    (lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP", "WEBP"),
)
#: Background of transparent pixels.
ALPHA_BACKGROUND = (255, 255, 255)


@dataclass(frozen=True)
class JobImage:
    """A decoded, converted, sized image and what the manifest records of it."""

    image: Any  # PIL.Image.Image, RGB, width x height of the job
    sha256: str  # of the file's bytes
    format: str
    source_size: tuple[int, int]  # (width, height) as stored, before the EXIF rotation
    size: tuple[int, int]  # (width, height) given to the model


def sniff(data: bytes, field: str) -> str:
    for test, fmt in KINDS:
        if test(data):
            return fmt
    raise InvalidJobError(f"{field}: not a PNG, JPEG or WebP image (judged by its content)")


def decode(data: bytes, field: str, max_pixels: int) -> Any:
    """Bytes → an 8-bit RGB PIL image, upright, within the pixel limit."""
    from PIL import Image, ImageOps

    fmt = sniff(data, field)
    Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow's own bomb check, at the same limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=[fmt])
            width, height = img.size
            if width * height > max_pixels:
                raise _bomb(field, width * height, max_pixels, f"{width}x{height} is ")
            img.seek(0)
            img.load()
    except InvalidJobError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        # Pillow's words name its own threshold (twice the limit, for its error): only the
        # size it read is kept, against the one limit a user can set.
        size = re.search(r"\((\d+) pixels\)", str(e))
        raise _bomb(field, int(size[1]) if size else None, max_pixels) from None
    except Image.UnidentifiedImageError:
        # Pillow's words show its buffer object ("<_io.BytesIO object at 0x…>")
        raise InvalidJobError(f"{field}: not a {fmt} image Pillow can read: it begins with a "
                              f"{fmt} signature, but what follows is not one") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise InvalidJobError(f"{field}: truncated or corrupt {fmt} image: "
                              f"{readable(e)}") from None
    upright: Any = ImageOps.exif_transpose(img) or img
    return to_rgb(upright)


def _bomb(field: str, pixels: int | None, limit: int, size: str = "") -> InvalidJobError:
    count = f"{size}{pixels:,} pixels" if pixels is not None else "more pixels"
    return InvalidJobError(f"{field}: refused as a decompression bomb: {count}, over the "
                           f"limit of {limit:,} pixels (FRAMEFLEET_MAX_IMAGE_PIXELS)")


#: A Python object's repr in a library's message: ``<_io.BytesIO object at 0x7f1b1bdaa390>``.
_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")


def readable(e: BaseException) -> str:
    """A library's error in words a person can read: no object's repr."""
    text = _REPR.sub("", str(e)).strip().rstrip(":")
    return text or type(e).__name__


def to_rgb(img: Any) -> Any:
    """Every mode Pillow decodes PNG, JPEG and WebP into, as 8-bit RGB (see the docstring)."""
    from PIL import Image

    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        import numpy as np

        grey = np.asarray(img, dtype=np.uint32)
        img = Image.fromarray((grey >> 8).clip(0, 255).astype(np.uint8), mode="L")
    if img.mode == "P" or img.mode == "PA":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB")


def fit(img: Any, width: int, height: int, policy: str) -> Any:
    """``img`` at width x height by the resize policy."""
    from PIL import Image, ImageOps

    if img.size == (width, height):
        return img
    if policy == "crop":
        return ImageOps.fit(img, (width, height), method=Image.Resampling.BICUBIC)
    if policy == "pad":
        return ImageOps.pad(img, (width, height), method=Image.Resampling.BICUBIC, color=(0, 0, 0))
    return img.resize((width, height), Image.Resampling.BICUBIC)


def load_image(uri: str, field: str, width: int, height: int, policy: str,
               settings: Settings) -> JobImage:
    """Read, decode, convert and size the image at ``uri`` for one job."""
    data = read_uri(uri, settings.max_image_bytes, settings, field=field)
    if not data:
        raise InvalidJobError(f"{field}: {uri} is empty")
    fmt = sniff(data, field)
    img = decode(data, field, settings.max_image_pixels)
    from PIL import Image

    with Image.open(io.BytesIO(data), formats=[fmt]) as header:
        source = header.size
    sized = fit(img, width, height, policy)
    return JobImage(sized, hashlib.sha256(data).hexdigest(), fmt, source, sized.size)

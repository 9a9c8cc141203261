"""Images a job conditions on: decoded by content with Pillow, bounded, converted explicitly,
sized by the job's policy; everything hostile refused naming the field."""

from __future__ import annotations

import io
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from producer.errors import InvalidJobError, PathRefusedError
from producer.settings import Settings
from worker.inputs.image import load_image


def _settings(root: Path, **kw: object) -> Settings:
    return Settings(device="cpu", file_roots=str(root), **kw)  # type: ignore[arg-type]


def _save(img: Image.Image, path: Path, fmt: str, **kw: object) -> Path:
    img.save(path, format=fmt, **kw)
    return path


def _rgb(w: int = 60, h: int = 40) -> Image.Image:
    return Image.fromarray((np.random.default_rng(0).random((h, w, 3)) * 255).astype(np.uint8))


def _load(path: Path, root: Path, policy: str = "crop", **kw: object) -> object:
    return load_image(path.as_uri(), "generate.image", 48, 32, policy, _settings(root, **kw))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_formats_by_content_whatever_the_name(tmp_path: Path, fmt: str) -> None:
    path = _save(_rgb(), tmp_path / "picture.bin", fmt)  # the name says nothing
    img = _load(path, tmp_path)
    assert img.format == fmt and img.size == (48, 32)  # type: ignore[attr-defined]
    assert img.source_size == (60, 40)  # type: ignore[attr-defined]
    assert img.image.mode == "RGB"  # type: ignore[attr-defined]


def test_resize_policies(tmp_path: Path) -> None:
    wide = Image.new("RGB", (96, 32), (200, 10, 10))
    wide.paste((10, 200, 10), (0, 0, 24, 32))  # a green band on the left quarter
    path = _save(wide, tmp_path / "w.png", "PNG")
    crop = np.asarray(_load(path, tmp_path, "crop").image)  # type: ignore[attr-defined]
    pad = np.asarray(_load(path, tmp_path, "pad").image)  # type: ignore[attr-defined]
    stretch = np.asarray(_load(path, tmp_path, "stretch").image)  # type: ignore[attr-defined]
    assert crop.shape == pad.shape == stretch.shape == (32, 48, 3)
    assert crop[16, 2, 0] > 150  # centre crop: the green band is cut away
    assert stretch[16, 2, 1] > 150  # stretched: still there, squeezed
    assert (pad[0, :, :] == 0).all() and pad[16, 2, 1] > 150  # black bars above and below


def test_modes_are_converted_explicitly(tmp_path: Path) -> None:
    cmyk = _save(Image.new("CMYK", (48, 32), (0, 255, 255, 0)), tmp_path / "c.jpg", "JPEG")
    assert np.asarray(_load(cmyk, tmp_path).image)[5, 5].tolist()[0] > 200  # type: ignore
    palette = _save(_rgb(48, 32).convert("P"), tmp_path / "p.png", "PNG")
    assert _load(palette, tmp_path).image.mode == "RGB"  # type: ignore[attr-defined]
    grey16 = Image.fromarray(np.full((32, 48), 40000, dtype=np.uint16))
    g = np.asarray(_load(_save(grey16, tmp_path / "g.png", "PNG"), tmp_path).image)  # type: ignore
    assert g[0, 0].tolist() == [40000 >> 8] * 3
    rgba = Image.new("RGBA", (48, 32), (255, 0, 0, 0))  # fully transparent red
    a = np.asarray(_load(_save(rgba, tmp_path / "a.png", "PNG"), tmp_path).image)  # type: ignore
    assert a[0, 0].tolist() == [255, 255, 255]  # composited over white


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    img = Image.new("RGB", (32, 48), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 32, 8))  # white on top, portrait
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to view: top becomes right
    path = _save(img, tmp_path / "r.jpg", "JPEG", exif=exif, quality=95)
    out = _load(path, tmp_path, "stretch")
    pixels = np.asarray(out.image)  # type: ignore[attr-defined]
    assert out.source_size == (32, 48)  # type: ignore[attr-defined]
    assert pixels[16, 45].mean() > 200 and pixels[16, 2].mean() < 60


def _bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header claiming width x height, with a tiny compressed body."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    idat = zlib.compress(b"\x00" * (width + 1) * 16, 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def test_hostile_images_are_refused_naming_the_field(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_bomb_png(30_000, 30_000))  # 900 Mpx claimed, a few KB on disk
    with pytest.raises(InvalidJobError) as refused:
        _load(bomb, tmp_path)
    # One limit, the one a user can set (was: "over FRAMEFLEET_MAX_IMAGE_PIXELS=40000000):
    # Image size (900000000 pixels) exceeds limit of 80000000 pixels", Pillow's own too)
    assert str(refused.value) == (
        "generate.image: refused as a decompression bomb: 900,000,000 pixels, over the limit "
        "of 40,000,000 pixels (FRAMEFLEET_MAX_IMAGE_PIXELS)")
    small_bomb = tmp_path / "b2.png"  # under twice the limit (Pillow warns there), over it
    small_bomb.write_bytes(_bomb_png(1200, 1000))
    with pytest.raises(InvalidJobError) as refused:
        _load(small_bomb, tmp_path, max_image_pixels=1_000_000)
    assert str(refused.value) == (
        "generate.image: refused as a decompression bomb: 1,200,000 pixels, over the limit "
        "of 1,000,000 pixels (FRAMEFLEET_MAX_IMAGE_PIXELS)")
    buf = io.BytesIO()
    _rgb(480, 320).save(buf, format="PNG")
    truncated = tmp_path / "t.png"
    truncated.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(InvalidJobError, match="generate.image: truncated or corrupt PNG"):
        _load(truncated, tmp_path)
    text = tmp_path / "notes.png"
    text.write_text("not an image at all\n")
    with pytest.raises(InvalidJobError, match="generate.image: not a PNG, JPEG or WebP image"):
        _load(text, tmp_path)
    big = _save(_rgb(), tmp_path / "big.png", "PNG")
    with pytest.raises(InvalidJobError, match="generate.image: .* over the 1024 byte limit"):
        _load(big, tmp_path, max_image_bytes=1024)


@pytest.mark.parametrize(("signature", "fmt"), [
    (b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"RIFF\0\0\0\0WEBP", "WEBP")])
def test_a_polyglot_is_refused_in_words_a_person_reads(tmp_path: Path, signature: bytes,
                                                       fmt: str) -> None:
    # A file with an image's signature and another kind of file after it (here an HTML page)
    polyglot = tmp_path / "polyglot.png"
    polyglot.write_bytes(signature + b"<html><body>not an image</body></html>\n" * 4)
    with pytest.raises(InvalidJobError) as refused:
        _load(polyglot, tmp_path)
    text = str(refused.value)
    # Was: "cannot identify image file <_io.BytesIO object at 0x7f1b1bdaa390>"
    assert text.startswith(f"generate.image: not a {fmt} image Pillow can read"), text
    assert " at 0x" not in text and "<" not in text and "BytesIO" not in text, text


def test_outside_the_roots_and_symlinks_out_are_refused(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    outside = _save(_rgb(), elsewhere / "o.png", "PNG")
    with pytest.raises(PathRefusedError, match="generate.image: .* outside the folders"):
        _load(outside, root)
    link = root / "link.png"
    os.symlink(outside, link)
    with pytest.raises(PathRefusedError, match="generate.image: .*link.png is outside"):
        _load(link, root)

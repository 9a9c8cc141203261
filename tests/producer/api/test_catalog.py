"""The model map: names to folders, size and seconds to width, height and 4k+1 frames."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.api.catalog import ModelEntry, load_catalog, shape
from producer.errors import ApiRequestError, SettingsError


def entry(**kw: object) -> ModelEntry:
    return ModelEntry.model_validate({"folder": "/models/wan", "size": "832x480",
                                      "seconds": "5", **kw})


def test_defaults_become_wan_frames_and_size() -> None:
    s = shape(entry(), None, None, None)
    assert (s.width, s.height, s.frames, s.steps) == (832, 480, 81, 50)  # 5 s at 16 fps
    s = shape(entry(fps=24, size="1280x704", size_multiple=32), None, "5", 4)
    assert (s.width, s.height, s.frames, s.steps) == (1280, 704, 121, 4)  # Wan2.2-5B


@pytest.mark.parametrize(("size", "seconds", "steps", "param"), [
    ("832x481", None, None, "size"),        # not a multiple of 16
    ("832*480", None, None, "size"),        # not WxH
    ("4096x4096", None, None, "size"),      # over max_pixels
    (None, "4.1", None, "seconds"),         # 65.6 intervals: not 4k+1 frames
    (None, "0.1", None, "seconds"),
    (None, "nan", None, "seconds"),
    (None, "-4", None, "seconds"),
    (None, "11", None, "seconds"),          # over max_seconds
    (None, None, 51, "steps"),              # over max_steps
])
def test_what_the_model_cannot_do_is_a_400_naming_the_field(
        size: str | None, seconds: str | None, steps: int | None, param: str) -> None:
    with pytest.raises(ApiRequestError) as e:
        shape(entry(), size, seconds, steps)
    assert (e.value.status, e.value.param) == (400, param)
    assert e.value.message.startswith(f"{param}: ")


def test_an_allow_list_of_sizes_is_kept() -> None:
    e = entry(limits={"sizes": ["832x480"]})
    assert shape(e, "832x480", None, None).width == 832
    with pytest.raises(ApiRequestError, match="not one of"):
        shape(e, "480x832", None, None)


def test_folders_are_absolute_and_defaults_must_fit(tmp_path: Path) -> None:
    assert entry().folder == "file:///models/wan"
    assert entry(folder="file:///models/wan").folder == "file:///models/wan"
    for bad in ("models/wan", "/models/../etc", "s3://bucket/wan"):
        with pytest.raises(ValueError, match="folder"):
            entry(folder=bad)
    with pytest.raises(ValueError, match="defaults break"):
        entry(size="100x100")
    path = tmp_path / "models.toml"
    path.write_text('[models.tiny]\nfolder = "/m/tiny"\nsize = "48x31"\n')
    with pytest.raises(SettingsError, match=r"FRAMEFLEET_API_MODELS_FILE: .*models.tiny"):
        load_catalog(str(path))


def test_an_unknown_model_is_a_400_naming_model(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text('{"models": {"tiny": {"folder": "/m/tiny", "size": "48x32", '
                    '"seconds": "0.5"}}}')
    catalog = load_catalog(str(path))
    assert catalog.get(None)[0] == "tiny"  # the first listed is the default
    with pytest.raises(ApiRequestError) as e:
        catalog.get("/etc/passwd")
    assert (e.value.status, e.value.code, e.value.param) == (400, "unknown_model", "model")

"""The fMP4 segments and the live playlist: standalone MP4s that are also HLS segments."""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from producer.wire.spec import (
    DecoderSpec,
    InputSpec,
    JobSpec,
    OutputSpec,
    PipelineSpec,
    SegmentInfo,
    VideoSpec,
)
from tests.require import require_binary
from worker.decoders.pattern import PatternDecoder, read_frame_index
from worker.pipeline import ClosedSegment, run_pipeline
from worker.pipeline.encode import init_size, read_frames_rgb
from worker.run import DecoderCache, run_job
from worker.sinks.hls import PLAYLIST, LivePlaylist, target_duration
from worker.stores.storage import JobOutput

pytestmark = pytest.mark.usefixtures("file_roots")

FFPROBE_INSTALL = "Debian package ffmpeg (scripts/install-system-deps.sh)"


def _run(tmp: Path, latent_frames: int = 10, **video: object) -> tuple[JobSpec, Path]:
    np.save(tmp / "z.npy", np.zeros((16, latent_frames, 6, 8), np.float32))
    spec = JobSpec(job_id="h1", input=InputSpec(uri=(tmp / "z.npy").as_uri()),
                   decoder=DecoderSpec(name="pattern"), video=VideoSpec(**video),  # type: ignore[arg-type]
                   output=OutputSpec(uri=(tmp / "out").as_uri()))
    run_job(spec, DecoderCache(torch.device("cpu")))
    return spec, tmp / "out" / spec.tenant / spec.job_id


def _playlist_entries(text: str) -> list[tuple[str, int, int, int, float]]:
    """(name, init bytes, media length, media offset, seconds) per listed segment."""
    pattern = (r'#EXT-X-MAP:URI="([^"]+)",BYTERANGE="(\d+)@0"\n#EXTINF:([0-9.]+),\n'
               r"#EXT-X-BYTERANGE:(\d+)@(\d+)\n([^\n]+)\n")
    out = []
    for m in re.finditer(pattern, text):
        assert m[1] == m[6]  # the map and the media are the same file
        out.append((m[1], int(m[2]), int(m[4]), int(m[5]), float(m[3])))
    return out


def test_every_segment_is_a_standalone_mp4_and_an_hls_segment(tmp_path: Path) -> None:
    ffprobe = require_binary("ffprobe", FFPROBE_INSTALL)
    _, folder = _run(tmp_path, segment_frames=12, first_segment_frames=3, fps=16.0)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["playlist_uri"] == (folder / PLAYLIST).as_uri()
    segments = [SegmentInfo.model_validate(s) for s in manifest["segments"]]
    # A short first segment, then segment_frames each (37 frames: 3 + 12 + 12 + 10)
    assert [s.frames for s in segments] == [3, 12, 12, 10]
    playlist = (folder / PLAYLIST).read_text()
    entries = _playlist_entries(playlist)
    assert [e[0] for e in entries] == [f"segment-{i:05d}.mp4" for i in range(4)]
    assert playlist.endswith("#EXT-X-ENDLIST\n")
    assert "#EXT-X-PLAYLIST-TYPE:EVENT\n" in playlist and "#EXT-X-VERSION:7\n" in playlist
    assert "#EXT-X-TARGETDURATION:1\n" in playlist  # 12 frames at 16 fps: 0.75 s
    for seg, (name, init, length, offset, seconds) in zip(segments, entries, strict=True):
        path = folder / name
        data = path.read_bytes()
        # The manifest's hash and size cover the one file both readers use
        assert hashlib.sha256(data).hexdigest() == seg.sha256 and len(data) == seg.bytes
        # The byte ranges split it into ftyp+moov and moof/mdat, nothing left over
        assert offset == init == init_size(path) and init + length == len(data)
        assert data[4:8] == b"ftyp" and data[init + 4 : init + 8] == b"moof"
        assert seconds == pytest.approx(seg.frames / 16.0)
        # ffprobe counts exactly the segment's frames, starting at its place on the timeline
        probe = json.loads(subprocess.run(
            [ffprobe, "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
             "stream=codec_name,nb_read_frames,start_time,width,height", "-of", "json", str(path)],
            check=True, capture_output=True, timeout=60).stdout)["streams"][0]
        assert probe["codec_name"] == "h264" and int(probe["nb_read_frames"]) == seg.frames
        assert (probe["width"], probe["height"]) == (64, 48)
        assert float(probe["start_time"]) == pytest.approx(seg.first_frame / 16.0)
        # PyAV decodes the same frames, with the pattern's global indices, in order
        with av.open(str(path)) as src:
            frames = list(src.decode(video=0))
        assert [f.pts * f.time_base for f in frames] == [
            Fraction(seg.first_frame + k, 16) for k in range(seg.frames)]
        got = [read_frame_index(f.to_ndarray(format="rgb24")) for f in frames]
        assert got == list(range(seg.first_frame, seg.first_frame + seg.frames))


def test_stitched_file_of_fmp4_segments_has_every_frame_once(tmp_path: Path) -> None:
    _, folder = _run(tmp_path, segment_frames=8, stitch=True)
    frames = read_frames_rgb(folder / "full.mp4")
    assert [read_frame_index(f) for f in frames] == list(range(37))
    with av.open(str(folder / "full.mp4")) as src:
        pts = [p.pts for p in src.demux(video=0) if p.pts is not None]
    assert len(set(pts)) == 37  # no two frames share a timestamp


def _segment(index: int, frames: int = 4) -> SegmentInfo:
    return SegmentInfo(index=index, uri=f"file:///x/segment-{index:05d}.mp4",
                       first_frame=index * frames, frames=frames, bytes=1000, sha256="0" * 64,
                       seconds=frames / 16)


def test_playlist_lists_only_the_contiguous_prefix(tmp_path: Path) -> None:
    out = JobOutput((tmp_path / "o").as_uri())
    listed: list[int] = []
    playlist = LivePlaylist(out, VideoSpec(segment_frames=4), on_listed=lambda s: listed.append(
        s.index))
    path = tmp_path / "o" / PLAYLIST
    # Segment 1 finishing first publishes nothing: 0 is still encoding
    playlist.landed(_segment(1), 100)
    assert not path.exists() and listed == []
    playlist.landed(_segment(0), 100)
    assert [e[0] for e in _playlist_entries(path.read_text())] == [
        "segment-00000.mp4", "segment-00001.mp4"]
    assert listed == [0, 1]
    playlist.landed(_segment(3), 100)
    with pytest.raises(RuntimeError, match=r"segments \[2\] never landed"):
        playlist.finish()
    assert "#EXT-X-ENDLIST" not in path.read_text()
    playlist.landed(_segment(2), 100)
    assert listed == [0, 1, 2, 3]
    assert playlist.finish() == path.as_uri()
    assert path.read_text().endswith("#EXT-X-ENDLIST\n")


def test_a_playlist_ended_early_keeps_what_it_listed_and_takes_nothing_more(
    tmp_path: Path,
) -> None:
    out = JobOutput((tmp_path / "o").as_uri())
    playlist = LivePlaylist(out, VideoSpec(segment_frames=4))
    path = tmp_path / "o" / PLAYLIST
    # A playlist never uploaded is not created by ending it
    assert playlist.end_early() is None and not path.exists()
    for index in (0, 1, 3):
        playlist.landed(_segment(index), 100)
    # Ended early: segments 0 and 1 stay listed (3 was never listed: 2 is missing)
    assert playlist.end_early() == path.as_uri()
    text = path.read_text()
    assert [e[0] for e in _playlist_entries(text)] == ["segment-00000.mp4", "segment-00001.mp4"]
    assert text.endswith("#EXT-X-ENDLIST\n") and text.count("#EXT-X-ENDLIST") == 1
    with pytest.raises(RuntimeError, match="already ended"):
        playlist.landed(_segment(2), 100)
    assert playlist.end_early() is None and path.read_text() == text


def test_a_retry_keeps_only_an_open_listing_of_its_own_spec(tmp_path: Path) -> None:
    out = JobOutput((tmp_path / "o").as_uri())
    folder = tmp_path / "o"
    first = LivePlaylist(out, VideoSpec(segment_frames=4), digest="d1")
    for index in (0, 1):
        first.landed(_segment(index), 100)
        (folder / f"segment-{index:05d}.mp4").write_bytes(bytes([index]) * 1000)
    text = (folder / PLAYLIST).read_text()
    # The same spec finds both entries; another spec, none
    assert LivePlaylist(out, VideoSpec(segment_frames=4), digest="d1").resume() == 2
    assert LivePlaylist(out, VideoSpec(segment_frames=4), digest="d2").resume() == 0
    # A kept segment is read back as stored; one whose file changed size is not kept
    again = LivePlaylist(out, VideoSpec(segment_frames=4), digest="d1")
    again.resume()
    assert again.reuse(0, max_bytes=10_000) == (b"\0" * 1000, 100)
    (folder / "segment-00001.mp4").write_bytes(b"x" * 1001)
    assert again.reuse(1, max_bytes=10_000) is None
    assert again.reuse(0, max_bytes=999) is None  # over the caller's bound: not read
    assert again.reuse(2, max_bytes=10_000) is None  # never listed
    # An ended playlist, or a listing that names files this module never writes, is not kept
    (folder / PLAYLIST).write_text(text + "#EXT-X-ENDLIST\n")
    assert LivePlaylist(out, VideoSpec(segment_frames=4), digest="d1").resume() == 0
    (folder / PLAYLIST).write_text(text.replace("segment-00000.mp4", "../../etc/passwd"))
    assert LivePlaylist(out, VideoSpec(segment_frames=4), digest="d1").resume() == 0
    # Until segment 0 lands again, every upload still lists what was kept
    (folder / PLAYLIST).write_text(text)
    third = LivePlaylist(out, VideoSpec(segment_frames=4), digest="d1")
    assert third.resume() == 2
    third.landed(_segment(2), 100)  # not contiguous: nothing uploaded
    assert (folder / PLAYLIST).read_text() == text
    assert third.end_early() == out.uri(PLAYLIST)
    assert len(_playlist_entries((folder / PLAYLIST).read_text())) == 2


def test_concurrent_landings_never_upload_an_older_playlist(tmp_path: Path) -> None:
    out = JobOutput((tmp_path / "o").as_uri())
    uploads: list[int] = []
    put = out.put_bytes

    def recording_put(name: str, data: bytes, *args: str) -> str:
        uploads.append(data.decode().count("#EXTINF"))
        return put(name, data, *args)

    out.put_bytes = recording_put  # type: ignore[method-assign]
    listed: list[int] = []
    playlist = LivePlaylist(out, VideoSpec(segment_frames=4), listed.append)  # type: ignore[arg-type]
    order = list(range(40))
    random.Random(7).shuffle(order)
    threads = [threading.Thread(target=playlist.landed, args=(_segment(i), 100)) for i in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert uploads == sorted(uploads) and uploads[-1] == 40
    assert [s.index for s in listed] == list(range(40))  # type: ignore[attr-defined]


def test_target_duration_covers_the_longest_segment() -> None:
    assert target_duration(VideoSpec(segment_frames=48, fps=16)) == 3
    assert target_duration(VideoSpec(segment_frames=48, fps=24000 / 1001)) == 3  # 2.002 s
    assert target_duration(VideoSpec(segment_frames=8, first_segment_frames=40, fps=16)) == 3
    assert target_duration(VideoSpec(segment_frames=1, fps=240)) == 1


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_a_short_first_segment_closes_with_its_last_frame(tmp_path: Path, mode: str) -> None:
    closed: list[ClosedSegment] = []
    seen: list[tuple[int, int]] = []  # (frames done, segments done) after each chunk
    run_pipeline(
        PatternDecoder(), torch.zeros(16, 10, 6, 8),
        video=VideoSpec(segment_frames=12, first_segment_frames=1),
        pipeline=PipelineSpec(mode=mode), scratch=tmp_path, sink=closed.append,
        progress=lambda done, total, segs: seen.append((done, segs)),
    )
    assert [c.file.frames for c in sorted(closed, key=lambda c: c.index)] == [1, 12, 12, 12]
    if mode == "sequential":
        # Chunk 0 is one frame: segment 0 is complete, and stored, before chunk 1 is decoded
        assert seen[0] == (1, 1)

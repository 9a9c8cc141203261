"""The progress bar of ``wait``: on a terminal (a console that says it is one, writing to a
buffer), and piped (a console that is not), as a person at each meets it (issue 54, points 5
and 6)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from producer.client.bar import Bar
from producer.client.jobstate import JobState
from producer.wire.spec import PreviewInfo, Progress

OUT = "s3://videos/out/default/a-job-with-a-rather-long-name-20261206-123456"
PREVIEW = PreviewInfo(step=1, steps_total=40, uri=f"{OUT}/previews/step-0001.mp4",
                      latest_uri=f"{OUT}/previews/latest.mp4", width=8, height=8, frames=3,
                      fps=16)
WARNING = ("this CPU worker estimates ~13 min for this job (decode ~13 min; this CPU runs 20 "
           "GFLOP/s): a GPU worker takes seconds; fewer frames, a smaller size or fewer steps "
           "finish sooner")
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def _denoise(step: int, preview: bool = True) -> Progress:
    return Progress(frames_done=0, frames_total=9, segments_done=0, stage="denoise",
                    steps_done=step, steps_total=40, worker="cpu0@host",
                    preview=PREVIEW if preview else None, warning=WARNING)


def _drive(console: Console) -> str:
    bar = Bar("a-job-with-a-rather-long-name", console=console)
    try:
        bar.show(JobState("a-job", "QUEUED"))
        bar.show(JobState("a-job", "STARTED", worker="cpu0@host"))
        bar.update(_denoise(1))
        bar.update(_denoise(2))
        bar.update(Progress(frames_done=5, frames_total=9, segments_done=1, worker="cpu0@host"))
    finally:
        bar.close()
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_no_markup_shows_as_text_on_a_terminal() -> None:
    terminal = Console(file=io.StringIO(), force_terminal=True, width=60)
    shown = ANSI.sub("", _drive(terminal))
    # Was: "[bold]a-job-…" redrawn after the preview's line (the description column's markup
    # read as text once a line was printed above the live bar)
    assert "[bold]" not in shown and "[/" not in shown, shown
    # The preview's line is one line, whatever the width: the terminal wraps it, and a copy
    # of it is the URI whole
    line = (f"preview after step 1/40: {PREVIEW.uri} (the newest: {PREVIEW.latest_uri})")
    assert line in shown.replace("\r", "\n").splitlines(), shown


def test_piped_lines_are_whole_one_per_stage() -> None:
    piped = Console(file=io.StringIO(), width=80)  # what rich gives a pipe: 80 columns
    lines = _drive(piped).splitlines()
    # Was: the preview's line broken at 80 columns, the warning too, and the bar's last frame
    # cut with an ellipsis in the middle of a URI
    assert lines == [
        "a-job-with-a-rather-long-name: queued",
        "a-job-with-a-rather-long-name: started on cpu0@host",
        f"warning: {WARNING}",
        f"preview after step 1/40: {PREVIEW.uri} (the newest: {PREVIEW.latest_uri})",
        f"a-job-with-a-rather-long-name: denoise 1/40, preview at {PREVIEW.uri} on cpu0@host",
        "a-job-with-a-rather-long-name: decode 5/9 frames, 1 segment on cpu0@host",
    ], "\n".join(lines)

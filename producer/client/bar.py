"""The progress bar of ``JobHandle.wait(progress=True)`` (rich, imported when a bar is drawn).

On a terminal it is a bar redrawn in place. Anywhere else (a pipe, a file, CI's log) nothing is
redrawn: each new stage is one plain line (``fox-1: denoise 0/40 on cpu0@host``), and no line
is ever wrapped or cut, so a URI in it stays whole and copyable.
"""

from __future__ import annotations

from typing import Any

from producer.client.jobstate import JobState
from producer.wire.spec import PREVIEW_LATEST, JobResult, Progress


class Bar:
    """A rich progress bar fed from the job's states: queued, started, retrying (and why),
    then denoise steps, frames, and the last uploads. A generate job's first preview is
    printed above the bar, once, with where the newest one always is: a bar redrawn in place
    (or not drawn at all, without a terminal) would leave no URI to open.

    ``console``: where to draw (default: stdout)."""

    def __init__(self, job_id: str, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console if console is not None else Console()
        self.live = self.console.is_terminal
        self.key = job_id
        # No markup anywhere in the bar: a print with markup off while the bar is live made
        # rich render a "[bold]…" column as text (a literal "[bold]" after a preview line),
        # and a state's reason may hold brackets.
        self.progress = Progress(
            TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
            TextColumn("{task.fields[what]}", markup=False), TimeElapsedColumn(),
            console=self.console, disable=not self.live,
        )
        self.task = self.progress.add_task(job_id, total=None, what="", unit="")
        self.previewed = False
        self.warned: str | None = None
        self.phase: str | None = None
        self.progress.start()

    def say(self, line: str) -> None:
        """Print ``line`` above the bar (the bar stays whole), never wrapped: the terminal
        wraps a long line itself, and a pipe gets it whole."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _line(self, phase: str, what: str) -> None:
        """Without a terminal: one line per new phase (a bar's every frame would be noise)."""
        if not self.live and phase != self.phase:
            self.say(f"{self.key}: {what}")
        self.phase = phase

    def show(self, js: JobState) -> None:
        """Queued, started, retrying (and why) before the frames, then the frames."""
        if js.progress is not None:
            self.update(js.progress)
        else:
            what = js.describe()
            self.progress.update(self.task, what=what)
            self._line(what, what)

    def finished(self, result: JobResult) -> None:
        """The job's end: a generate job that stored previews the bar never saw (it ended
        between two looks) still names where the newest one is."""
        m = result.manifest
        if m.generate is not None and m.generate.previews and not self.previewed:
            self.previewed = True
            folder = result.manifest_uri.rsplit("/", 1)[0]
            self.say(f"previews: {m.generate.previews}, the newest at "
                     f"{folder}/{PREVIEW_LATEST}")
        self.update(Progress(frames_done=m.frames, frames_total=m.frames,
                             segments_done=len(m.segments), stage="upload",
                             worker=result.worker.node))

    def update(self, p: Progress) -> None:
        where = f" on {p.worker}" if p.worker else ""
        if p.warning is not None and p.warning != self.warned:
            self.warned = p.warning  # a CPU worker's estimate, said again when it changed
            self.say(f"warning: {p.warning}")
        if p.preview is not None and not self.previewed:
            self.previewed = True
            self.say(f"preview after step {p.preview.step}/{p.preview.steps_total}: "
                     f"{p.preview.uri} (the newest: {p.preview.latest_uri})")
        what = p.describe() + where
        if p.stage == "denoise":  # generate jobs: denoise 12/50, then frames
            self.progress.update(self.task, completed=p.steps_done, total=p.steps_total,
                                 what=what, unit="denoise steps")
        else:
            self.progress.update(self.task, completed=p.frames_done, total=p.frames_total,
                                 what=what, unit="frames")
        self._line(p.stage, what)

    def close(self) -> None:
        self.progress.stop()

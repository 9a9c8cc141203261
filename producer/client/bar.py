"""The progress bar of ``JobHandle.wait(progress=True)`` (rich, imported when a bar is drawn)."""

from __future__ import annotations

from producer.client.jobstate import JobState
from producer.wire.spec import PREVIEW_LATEST, JobResult, Progress


class Bar:
    """A rich progress bar fed from the job's states: queued, started, retrying (and why),
    then denoise steps, frames, and the last uploads. A generate job's first preview is
    printed above the bar, once, with where the newest one always is: a bar redrawn in place
    (or not drawn at all, without a terminal) would leave no URI to open."""

    def __init__(self, job_id: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # The state column is plain text: a retry's reason may hold brackets.
        self.progress = Progress(
            "[bold]{task.description}", BarColumn(), TextColumn("{task.fields[what]}",
                                                               markup=False),
            TimeElapsedColumn(),
        )
        self.task = self.progress.add_task(job_id, total=None, what="submitted", unit="")
        self.previewed = self.warned = False
        self.progress.start()

    def say(self, line: str) -> None:
        """Print ``line`` above the bar (the bar stays whole)."""
        self.progress.console.print(line, markup=False, highlight=False)

    def show(self, js: JobState) -> None:
        """Queued, started, retrying (and why) before the frames, then the frames."""
        if js.progress is not None:
            self.update(js.progress)
        else:
            self.progress.update(self.task, what=js.describe())

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
        if p.warning is not None and not self.warned:
            self.warned = True
            self.say(f"warning: {p.warning}")
        if p.preview is not None and not self.previewed:
            self.previewed = True
            self.say(f"preview after step {p.preview.step}/{p.preview.steps_total}: "
                     f"{p.preview.uri} (the newest: {p.preview.latest_uri})")
        if p.stage == "denoise":  # generate jobs: denoise 12/50, then frames
            self.progress.update(self.task, completed=p.steps_done, total=p.steps_total,
                                 what=p.describe() + where, unit="denoise steps")
            return
        self.progress.update(self.task, completed=p.frames_done, total=p.frames_total,
                             what=p.describe() + where, unit="frames")

    def close(self) -> None:
        self.progress.stop()

"""What workers report is read by the release before too: a field a client does not know is
left out (``producer.wire.base.Reported``), while a spec still refuses one, naming it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producer.wire.results import Progress, StateTime
from producer.wire.spec import JobSpec


def test_a_newer_workers_progress_and_state_times_are_read_without_the_new_field() -> None:
    sent = {"frames_done": 4, "frames_total": 9, "segments_done": 1, "stage": "decode",
            "worker": "gpu0@a", "added_in_a_later_release": {"x": 1}}
    p = Progress.model_validate(sent)
    assert (p.frames_done, p.frames_total, p.worker) == (4, 9, "gpu0@a")
    assert "added_in_a_later_release" not in p.model_dump()
    at = StateTime.model_validate({"state": "STARTED", "at": 1.5, "by": "later"})
    assert at == StateTime(state="STARTED", at=1.5)


def test_a_spec_still_refuses_a_field_it_does_not_know() -> None:
    with pytest.raises(ValidationError, match="colour"):
        JobSpec.model_validate({"job_id": "a", "input": {"uri": "s3://b/k.npy"},
                                "output": {"uri": "s3://b/out"}, "colour": "red"})

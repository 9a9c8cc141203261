"""``producer.spec`` is the name users import the models by; the models live in the wire's room."""

from __future__ import annotations

import producer.spec
import producer.wire.spec
from producer.spec import JobSpec, Manifest, parse_spec, segment_name


def test_producer_spec_re_exports_every_public_name_of_the_wire_spec() -> None:
    # Given the names the wire's spec module exports
    # Then the public module holds each, the same object
    missing = [n for n in producer.wire.spec.__all__
               if getattr(producer.spec, n, None) is not getattr(producer.wire.spec, n)]
    assert not missing, missing
    assert JobSpec is producer.wire.spec.JobSpec and Manifest is producer.wire.spec.Manifest


def test_a_spec_parsed_through_the_public_name_is_the_wire_model() -> None:
    spec = parse_spec({"job_id": "clip-1", "input": {"uri": "s3://b/in.npy"},
                       "output": {"uri": "s3://b/out"}})
    assert type(spec) is producer.wire.spec.JobSpec
    assert segment_name(3) == producer.wire.spec.segment_name(3)

"""The gateway never imports torch, a codec or worker code: the producer image has none."""

from __future__ import annotations

from tests.blocked_imports import import_blocked


def test_the_gateway_imports_without_torch_av_or_worker() -> None:
    out = import_blocked(["producer.api.app", "producer.api.serve", "producer.cli"],
                         ["torch", "av", "diffusers", "transformers", "worker"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

"""The tiny random Wan pipelines, saved once per test session; a client and a CPU worker
that serves them through real Redis and SeaweedFS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.worker.generate.tiny import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


@pytest.fixture(scope="session")
def wan22_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Wan2.2 layouts in miniature: TI2V (48 channels, x16 VAE) and two experts (A14B)."""
    root = tmp_path_factory.mktemp("models22")
    return {p: save_tiny_model(root / p, preset=p) for p in ("tiny-ti2v", "tiny-a14b")}


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()
    return Client(broker_url=redis_url, backend_url=redis_url)


@pytest.fixture
def worker(worker_factory: Any, tiny_model: Path, tmp_path_factory: Any) -> Any:
    (w,) = worker_factory(1, env={
        "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
        # the models and the test folders lie under pytest's base folder
        "FRAMEFLEET_FILE_ROOTS": str(tmp_path_factory.getbasetemp()),
        "FRAMEFLEET_MAX_DENOISE_STEPS": "2000", "FRAMEFLEET_WARMUP_MODEL": str(tiny_model),
    })
    return w


@pytest.fixture(scope="session")
def i2v_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wan2.1 I2V's layout in miniature: image channels and a CLIP image encoder."""
    return save_tiny_model(tmp_path_factory.mktemp("models-i2v") / "tiny-i2v", preset="tiny-i2v")


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A PNG and a JPEG of another aspect than the jobs' frames (cropped to fit)."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    png = root / "first.png"
    Image.fromarray((rng.random((40, 60, 3)) * 255).astype(np.uint8)).save(png)
    jpg = root / "last.jpg"
    Image.fromarray((rng.random((50, 50, 3)) * 255).astype(np.uint8)).save(jpg, quality=95)
    return {"png": png, "jpg": jpg}

"""The soak's inputs and its worker's environment (``bench/soak/soak.py``): model folders, an image,
two LoRAs, a hostile model folder, decode-only latents, and latents larger than the worker's
memory limit (a sparse file: it costs no disk, only the worker's memory when read)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.soak.soak_plan import Setup

#: The worker's memory limit (FRAMEFLEET_MAX_RSS_MIB), on a GPU host and on the CPU.
LIMIT_MIB = {"gpu": 16 * 1024, "tiny": 1536}
#: The worker's FRAMEFLEET_STUCK_S: seconds without progress after which a job is taken for hung.
STUCK_S = {"gpu": 240, "tiny": 120}
LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_lora(preset: str, path: Path, seed: int, rank: int = 16) -> Path:
    """A random LoRA on the attention projections of ``preset``'s transformer (its shapes read
    from a model on the meta device: no weights are built)."""
    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file

    from worker.generate.model.presets import PRESETS

    with torch.device("meta"):
        model = WanTransformer3DModel(**PRESETS[preset].transformer)
    g = torch.Generator("cpu").manual_seed(seed)
    state = {}
    for i in range(len(model.blocks)):
        for target in LORA_TARGETS:
            layer = model.get_submodule(f"blocks.{i}.{target}")
            key = f"transformer.blocks.{i}.{target}"
            state[f"{key}.lora_A.weight"] = torch.randn(rank, layer.in_features,
                                                        generator=g) * 0.01
            state[f"{key}.lora_B.weight"] = torch.randn(layer.out_features, rank,
                                                        generator=g) * 0.01
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, path)
    return path


def _latents(path: Path, shape: tuple[int, ...], seed: int) -> Path:
    np.save(path, np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))
    return path


def prepare(work: Path, tiny: bool) -> tuple[Setup, dict[str, str]]:
    """The folders and files of the plan, and the worker's environment."""
    from PIL import Image

    big_preset, small_preset = ("tiny-ti2v", "tiny") if tiny else (
        "wan2.2-ti2v-5b", "wan2.1-t2v-1.3b")
    big, small = work / "models" / "big", work / "models" / "small"
    image = work / "first.png"
    Image.fromarray((np.random.default_rng(0).random((480, 832, 3)) * 255)
                    .astype(np.uint8)).save(image)
    loras = [make_lora(big_preset, work / f"lora-{i}.safetensors", i) for i in range(2)]
    hostile = work / "models" / "hostile"  # a pickle where the weights go: refused by content
    (hostile / "transformer").mkdir(parents=True)
    torch.save({"w": torch.zeros(2)}, hostile / "transformer" / "diffusion_pytorch_model.bin")
    (hostile / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    if tiny:
        decode = [("wan2.1-vae", _latents(work / "d0.npy", (16, 3, 4, 6), 0), 9),
                  ("wan2.1-vae", _latents(work / "d1.npy", (16, 2, 6, 4), 1), 5)]
        sizes: dict[str, Any] = {"big_sizes": [(64, 64, 9), (32, 64, 9)],
                                 "small_sizes": [(32, 48, 9), (48, 32, 9)],
                                 "steps": 3, "long_steps": 12, "cancel_steps": 900,
                                 # the GPU's tiers: the fp8 jobs go to the worker's refusal
                                 "tiers": ["exact", "fp8", "cache", "fp8+cache"],
                                 "refused": ["fp8", "fp8+cache"]}
    else:
        decode = [("wan2.2-vae", _latents(work / "d0.npy", (48, 9, 24, 40), 0), 33),
                  ("wan2.1-vae", _latents(work / "d1.npy", (16, 9, 60, 104), 1), 33)]
        sizes = {"big_sizes": [(480, 832, 49), (704, 1280, 33)],
                 "small_sizes": [(480, 832, 33), (320, 576, 33)],
                 "steps": 8, "long_steps": 20, "cancel_steps": 80,
                 "tiers": ["exact", "fp8", "cache", "fp8+cache"]}
    setup = Setup(big=big, small=small, out=(work / "out").as_uri(), image=image, loras=loras,
                  hostile=hostile, hog=work / "hog.npy", decode_inputs=decode, **sizes)
    limit = LIMIT_MIB["tiny" if tiny else "gpu"]
    tiers = "exact" if tiny else "exact,fp8"
    def listed(sizes: list[tuple[int, int, int]]) -> str:
        return ",".join(f"{h}x{w}x{f}" for h, w, f in sizes)

    env = {
        "FRAMEFLEET_SOAK_MODELS": f"{big_preset}={big}:{tiers};{small_preset}={small}:exact",
        "FRAMEFLEET_SOAK_SIZES": f"{big_preset}={listed(setup.big_sizes)};"
                                 f"{small_preset}={listed(setup.small_sizes)}",
        "FRAMEFLEET_DEVICE": "cpu" if tiny else "cuda",
        "FRAMEFLEET_FILE_ROOTS": str(work), "FRAMEFLEET_WORK_DIR": str(work / "scratch"),
        "FRAMEFLEET_MODEL_CACHE_GIB": "120", "FRAMEFLEET_DECODE_GRAPHS": "8",
        "FRAMEFLEET_MAX_DENOISE_STEPS": "1000", "FRAMEFLEET_MAX_RSS_MIB": str(limit),
        "FRAMEFLEET_MAX_INPUT_BYTES": str(64 * 1024**3), "FRAMEFLEET_MAX_FRAMES": "200000",
        "FRAMEFLEET_POOL_START_TIMEOUT_S": "900",
        # A hang explains itself within the soak's time (stacks in the worker's log, the job
        # FAILURE "stuck in <stage>"); the soak's slowest healthy silence is a compile at a
        # new size, 63-105 s on an H200.
        "FRAMEFLEET_STUCK_S": str(STUCK_S["tiny" if tiny else "gpu"]),
        "FRAMEFLEET_COMPILE_CACHE_DIR": str(Path(tempfile_root()) / "ff-compile-cache"),
    }
    (work / "scratch").mkdir()
    return setup, env


def from_artifacts(folder: Path, work: Path, setup: Setup, tiny: bool) -> dict[str, str]:
    """The worker's environment to start from ``soak_prime.py``'s artifacts in ``folder``: an
    empty compile cache of its own, so that nothing but the artifacts serves its compiles. On
    the CPU one size compiles (the big model's first: ``soak_prime.TINY_COMPILED``), with
    inductor's C++ backend, and the rest runs eager."""
    env = {"SOAK_ARTIFACTS": str(folder.absolute()),
           "FRAMEFLEET_COMPILE_CACHE_DIR": str(work / "compile-cache-from-artifacts")}
    if tiny:
        h, w, f = setup.big_sizes[0]
        env.update({"FRAMEFLEET_COMPILE_ON_CPU": "1", "FRAMEFLEET_COMPILED_SIZES": "1",
                    "FRAMEFLEET_SOAK_SIZES": f"tiny-ti2v={h}x{w}x{f}"})
    return env


def tempfile_root() -> str:
    import tempfile

    return tempfile.gettempdir()


def pool_pids(worker_pid: int) -> list[int]:
    """The worker's pool processes (children of its main process), from /proc."""
    pids = []
    for task in Path(f"/proc/{worker_pid}/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match[1]) / 1024 if match else 0.0


def size_hog(setup: Setup, worker_pid: int, tiny: bool) -> None:
    """Latents that take the pool process 1 GiB past its limit once read: a sparse file."""
    base = max((rss_mib(p) for p in pool_pids(worker_pid)), default=0.0)
    limit = LIMIT_MIB["tiny" if tiny else "gpu"]
    need = max(limit - base, 0) + 1024  # MiB
    per_frame = 16 * 136 * 240 * 4 / 2**20  # one latent frame of 1088x1920, float32
    t = int(need / per_frame) + 1
    np.lib.format.open_memmap(setup.hog, mode="w+", dtype=np.float32,
                              shape=(16, t, 136, 240)).flush()
    print(f"pool process RSS {base:.0f} MiB; memory job reads {t * per_frame:.0f} MiB "
          f"(limit {limit} MiB)", flush=True)


def wait_ready(worker: subprocess.Popen[bytes], log: Path, metrics_url: str,
               timeout: float = 900) -> float:
    """Seconds until the worker's pool process reports ready (/metrics)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if worker.poll() is not None:
            raise RuntimeError(f"worker exited with {worker.returncode}: "
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            text = urllib.request.urlopen(metrics_url, timeout=2).read().decode()
            if re.search(r"^framefleet_worker_ready 1\.0$", text, re.M):
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"worker not ready in {timeout} s: {log.read_text()[-3000:]}")

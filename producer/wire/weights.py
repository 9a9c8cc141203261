"""Which decoders need weights, and the check both ends of the wire make.

The Wan decoders need a model: a diffusers-layout folder (``config.json`` and
``diffusion_pytorch_model.safetensors`` of an ``AutoencoderKLWan``, such as the ``vae/``
folder of the released Wan2.1/Wan2.2 Diffusers repositories), or ``"random"``, which asks on
purpose for a seeded random init that decodes to noise (tests, demos; the manifest and the
result then say ``random_weights``). A job that names neither is refused at once: noise must
never pass for a video. The pattern decoder draws its frames and takes no weights.

The client checks before it queues a job; the worker checks again (the wire is not trusted)
where it chooses the decoder (``worker.inputs.weights``).
"""

from __future__ import annotations

from producer.errors import InvalidJobError
from producer.wire.spec import RANDOM_WEIGHTS, DecoderSpec, JobSpec

#: What a job made with random weights says wherever it is shown: the CLI's result line, the
#: API's video object and the page (the manifest and the result carry ``random_weights``).
NOISE_NOTE = "random weights: noise"
#: Decoders that draw frames without a model.
NO_WEIGHTS = frozenset({"pattern"})
HINT = (
    "give a diffusers-layout folder of the VAE (config.json + "
    "diffusion_pytorch_model.safetensors, e.g. the vae/ folder of "
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers) as file:///path, or \"random\" for a seeded random "
    "init that decodes to noise"
)


def needs_weights(name: str) -> bool:
    return name not in NO_WEIGHTS


def check_weights(decoder: DecoderSpec) -> None:
    """Raise ``InvalidJobError`` naming ``decoder.weights`` unless the spec says what to load."""
    if not needs_weights(decoder.name):
        if decoder.weights is not None:
            raise InvalidJobError(
                f"decoder.weights: the {decoder.name} decoder takes no weights "
                f"(got {decoder.weights!r})"
            )
        return
    if decoder.weights is None:
        raise InvalidJobError(f"decoder.weights: the {decoder.name} decoder needs weights: {HINT}")


def check_job_weights(spec: JobSpec) -> None:
    """``check_weights`` of the job's decoder; a job that generates its latents (a
    ``generate`` section) decodes with its model's own VAE, so its ``decoder`` is not used and
    not checked."""
    if spec.generate is None:
        check_weights(spec.decoder)


def uses_random_weights(decoder: DecoderSpec) -> bool:
    """True when the job asked for random weights: its output is noise."""
    return needs_weights(decoder.name) and decoder.weights == RANDOM_WEIGHTS

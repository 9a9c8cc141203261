"""Latent→RGB linear factors of the Wan latent formats: a preview's colours without the VAE.

Each latent channel c contributes ``RGB[c]`` to a pixel's red, green and blue, plus one bias
per colour; the result is in [-1, 1] (ComfyUI's convention: (x + 1) / 2, clamped, times 255).
The factors apply to latents in the transformer's space, normalised by the VAE's per-channel
mean and std (diffusers' Wan pipelines and ComfyUI's ``process_in`` normalise alike).

Where the numbers come from: ComfyUI, ``comfy/latent_formats.py`` (github.com/Comfy-Org/
ComfyUI, commit 75399d78ddcc01f46f9b94521b29f1fe8a90ed53), the ``latent_rgb_factors`` and
``latent_rgb_factors_bias`` of ``Wan21`` (16 channels: Wan2.1 and the VAE of Wan2.2 A14B) and
of ``Wan22`` (48 channels: Wan2.2 TI2V-5B). They are published fits of the real VAEs; both
formats have them, so no fit of our own is needed. A model of random weights (``framefleet
models tiny``) has the same channel counts and gets the same factors: its previews are noise
of the right size and range, like its videos. A latent format with another channel count has
no factors: its jobs make no previews (the worker logs it once per job).
"""

from __future__ import annotations

#: ComfyUI ``Wan21.latent_rgb_factors``: one (R, G, B) row per latent channel.
WAN21_RGB: tuple[tuple[float, float, float], ...] = (
    (-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747),
    (0.0372, 0.2344, 0.1420), (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665),
    (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975), (-0.0412, 0.0267, -0.1364),
    (-0.1293, 0.0740, 0.1636), (0.0680, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699), (0.0060, -0.0633, 0.0005), (0.3477, 0.2275, 0.2950),
    (0.1984, 0.0913, 0.1861),
)
#: ComfyUI ``Wan21.latent_rgb_factors_bias``.
WAN21_BIAS = (-0.1835, -0.0868, -0.3360)

#: ComfyUI ``Wan22.latent_rgb_factors``: one (R, G, B) row per latent channel.
WAN22_RGB: tuple[tuple[float, float, float], ...] = (
    (0.0119, 0.0103, 0.0046), (-0.1062, -0.0504, 0.0165), (0.0140, 0.0409, 0.0491),
    (-0.0813, -0.0677, 0.0607), (0.0656, 0.0851, 0.0808), (0.0264, 0.0463, 0.0912),
    (0.0295, 0.0326, 0.0590), (-0.0244, -0.0270, 0.0025), (0.0443, -0.0102, 0.0288),
    (-0.0465, -0.0090, -0.0205), (0.0359, 0.0236, 0.0082), (-0.0776, 0.0854, 0.1048),
    (0.0564, 0.0264, 0.0561), (0.0006, 0.0594, 0.0418), (-0.0319, -0.0542, -0.0637),
    (-0.0268, 0.0024, 0.0260), (0.0539, 0.0265, 0.0358), (-0.0359, -0.0312, -0.0287),
    (-0.0285, -0.1032, -0.1237), (0.1041, 0.0537, 0.0622), (-0.0086, -0.0374, -0.0051),
    (0.0390, 0.0670, 0.2863), (0.0069, 0.0144, 0.0082), (0.0006, -0.0167, 0.0079),
    (0.0313, -0.0574, -0.0232), (-0.1454, -0.0902, -0.0481), (0.0714, 0.0827, 0.0447),
    (-0.0304, -0.0574, -0.0196), (0.0401, 0.0384, 0.0204), (-0.0758, -0.0297, -0.0014),
    (0.0568, 0.1307, 0.1372), (-0.0055, -0.0310, -0.0380), (0.0239, -0.0305, 0.0325),
    (-0.0663, -0.0673, -0.0140), (-0.0416, -0.0047, -0.0023), (0.0166, 0.0112, -0.0093),
    (-0.0211, 0.0011, 0.0331), (0.1833, 0.1466, 0.2250), (-0.0368, 0.0370, 0.0295),
    (-0.3441, -0.3543, -0.2008), (-0.0479, -0.0489, -0.0420), (-0.0660, -0.0153, 0.0800),
    (-0.0101, 0.0068, 0.0156), (-0.0690, -0.0452, -0.0927), (-0.0145, 0.0041, 0.0015),
    (0.0421, 0.0451, 0.0373), (0.0504, -0.0483, -0.0356), (-0.0837, 0.0168, 0.0055),
)
#: ComfyUI ``Wan22.latent_rgb_factors_bias``.
WAN22_BIAS = (0.0317, -0.0878, -0.1388)

#: Factors and bias per latent channel count, and the format's name (for logs and notes).
FORMATS: dict[int, tuple[str, tuple[tuple[float, float, float], ...],
                         tuple[float, float, float]]] = {
    16: ("wan2.1", WAN21_RGB, WAN21_BIAS),
    48: ("wan2.2", WAN22_RGB, WAN22_BIAS),
}


def rgb_factors(channels: int) -> tuple[tuple[tuple[float, ...], ...], tuple[float, ...]] | None:
    """The 3×C matrix (one row per colour) and the bias of a format with ``channels`` latent
    channels; None when no published factors exist for it."""
    found = FORMATS.get(channels)
    if found is None:
        return None
    _, rows, bias = found
    return tuple(zip(*rows, strict=True)), bias

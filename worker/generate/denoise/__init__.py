"""The denoise stage: the pipeline's denoise loop with latent output, and its previews."""

"""Chunk decoders: latents in, one decoded chunk of frames at a time out."""

from worker.decoders.base import ChunkDecoder, frames_for_latents

__all__ = ["ChunkDecoder", "frames_for_latents"]

"""The conditions stage: a job's images and LoRA adapters, and its encoded prompt."""

"""framefleet worker: everything that touches a GPU, a codec or S3."""

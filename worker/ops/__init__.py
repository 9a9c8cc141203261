"""Fleet operations: what runs once per fleet, not once per GPU.

``exporter`` serves the broker's queue depth to Prometheus and, through ``cloudwatch``, to the
autoscaling group. It runs in the producer image (the ``[ops]`` extra: prometheus-client and
boto3, no torch): nothing here imports the pipeline, the decoders or CUDA.
"""

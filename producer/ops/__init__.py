"""Fleet operations: what runs once per fleet, not once per GPU, in the producer image.

- ``exporter``: the queue's depth and oldest waiting job for Prometheus (and CloudWatch through
  ``cloudwatch``);
- ``dashboard``: Flower's Celery app (``celery -A producer.ops.dashboard flower``).
"""

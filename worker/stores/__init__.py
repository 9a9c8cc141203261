"""The store below both ends: local paths a job names and the object stores (``file://``,
``s3://``) that inputs read through and sinks write through."""

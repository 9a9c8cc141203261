"""``framefleet api``: the HTTP gateway in the OpenAI ``/v1/videos`` shape, the native
``/v1/jobs`` API with Server-Sent Events, and a page to watch jobs live.

Stateless: every replica talks to the fleet only through the producer client (Redis) and reads
outputs from the store (S3), so N replicas behind a load balancer give the same answers. The
tenant comes from the API key, never from the request; models are names mapped server-side,
never paths. Needs the ``api`` extra (FastAPI, uvicorn, boto3, limits, prometheus-client);
never imports torch or ``worker``.

The app factory is ``producer.api.app.create_app``.
"""

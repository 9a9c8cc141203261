"""The wire: what both ends of a message share, light enough for both (pydantic, no Celery).

``base`` (the frozen model, the schema version, the one reading of a URI), the request
(``spec``, with ``generation`` for prompt jobs), the result side (``results``), the fleet's rules
for a spec, applied at submit and on receipt (``rules``), and which decoders need weights
(``weights``). Users import the models as ``producer.spec``, which re-exports ``wire.spec``.
"""

"""The job's wire format under the name users import it by: ``from producer.spec import JobSpec``.

The models live in ``producer/wire/spec.py`` (with the generate request and the result side it
re-exports); this module only re-exports its public names, so the public path stays.
"""

from producer.wire.spec import *  # noqa: F403
from producer.wire.spec import __all__ as __all__
from producer.wire.spec import unset_generate_fields as unset_generate_fields

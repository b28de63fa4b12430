"""Every KQL test runs against both nexus backends (see ``tests/nexus_backends.py``)."""

from nexus_backends import nexus_backend  # noqa: F401  (an autouse fixture)

"""What the KQL layer needs of the KIP runtime that hosts it, as a typed interface.

The runtime (``akrelay.kip.runtime.KipRuntime``) sits a layer above KQL, so KQL
names what it uses here instead of importing it.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Mapping, Protocol

from akrelay.kip.nexus import NexusBase
from akrelay.kip.paging import CursorCodec
from akrelay.kip.space import TrustState


class KqlConfig(Protocol):
    """The operator configuration KQL reads (``akrelay.kip.config.KipConfig``)."""

    @property
    def trust(self) -> TrustState: ...

    @property
    def default_policy(self) -> str: ...


class KqlEnvironment(Protocol):
    """The installed Schema packages (``akrelay.kip.package.SchemaEnvironment``)."""

    @property
    def version(self) -> int: ...

    #: ``(exact ref, definition)``; KQL reads only the exact ref (the definition is a Schema package's object)
    def resolve(self, name: str, kind: str | None = None) -> tuple[str, Mapping[str, object]]: ...


class KqlRuntime(Protocol):
    """What KQL evaluation needs of the KIP runtime (``akrelay.kip.runtime.KipRuntime``, a layer above).

    ``config`` (origin, trust, default policy) and ``environment`` (the installed
    Schema packages) are the runtime's operator configuration.
    """

    nexus: NexusBase
    cursors: CursorCodec
    now_ms: Callable[[], int]

    @property
    def config(self) -> KqlConfig: ...

    @property
    def environment(self) -> KqlEnvironment: ...

    #: held for a whole request: one request at a time per runtime, at one nexus snapshot
    @property
    def lock(self) -> ContextManager[object]: ...

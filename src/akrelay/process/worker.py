"""The application factory: a :class:`~akrelay.node.RelayNode` behind the HTTP app.

It sits above both: :mod:`akrelay.http.app` only mounts routes and runs the
node's lifespan, :mod:`akrelay.node` only owns the relay and its components.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Collection, Sequence

from akrelay.http.app import RelayApp, build_app
from akrelay.node import Component, RelayNode
from akrelay.settings import Settings, defaults, from_resolved_env

if TYPE_CHECKING:
    from akrelay.relay.core import Relay


def create_app(target: RelayNode | Settings | Relay, settings: Settings | None = None, *,
               components: Collection[str] | None = None,
               extra: Sequence[Component] = ()) -> RelayApp:
    """The app over a node, or over one built here.

    ``target`` is a :class:`RelayNode`, ``Settings`` (a node opening the relay
    in ``settings.data``, closed when the app shuts down) or a ``Relay`` (a node
    over it; the caller closes it). ``components`` and ``extra`` go to the node
    built here (``components=()``: the core §9.1 app alone).
    """
    if isinstance(target, RelayNode):
        node = target
    elif isinstance(target, Settings):
        node = RelayNode.open(target, components=components, extra=extra)
    else:
        node = RelayNode(target, settings if settings is not None else defaults(), components=components,
                         extra=extra)
    return build_app(node)


def create_app_from_env() -> RelayApp:
    """Granian factory target: each worker resolves the launcher's settings and owns one node.

    When the launcher runs the log followers in their own process (:mod:`akrelay.process.followers`),
    the worker's node only reads the search index and the KIP nexus.
    """
    from akrelay.process.followers import FOLLOWER_PROCESS_ENV

    settings = from_resolved_env()
    follow = os.environ.get(FOLLOWER_PROCESS_ENV) != "1"
    return create_app(RelayNode.open(settings, follow=follow))

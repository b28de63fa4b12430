"""The relay's processes under ``akrelay serve``, one module per role.

- :mod:`akrelay.process.launcher`: the command's own process; checks the settings, prepares the
  data directory once, starts the followers' process and Granian, and stops both.
- :mod:`akrelay.process.worker`: the app factory each Granian worker runs (one
  :class:`~akrelay.node.RelayNode` per worker).
- :mod:`akrelay.process.followers`: the log followers' own process (search indexer, KIP importer).

The owner of the relay and its components, :mod:`akrelay.node`, is not a role: every process
opens one, so it stays beside the components, below these modules. This package imports nothing,
so that a worker importing its factory does not load the launcher, nor the launcher the worker.
"""

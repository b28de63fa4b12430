"""The web explorer: server-rendered, read-only HTML pages over the relay (``/explorer/``)."""

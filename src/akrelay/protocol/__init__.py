"""The sans-I/O protocol core: Agent Identity 1.0 and Agent Knowledge 1.0.

Pure functions over bytes and values. Nothing in this package performs I/O,
reads the clock, or imports another akrelay package.
"""

from akrelay.protocol.errors import HTTP_STATUS, ProtocolError

__all__ = ["HTTP_STATUS", "ProtocolError"]

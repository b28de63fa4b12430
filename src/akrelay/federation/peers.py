"""The peer configuration file (TOML): which origins we replicate from, and how.

The file is operator-owned and small, so it is read with ``tomllib`` and written
back by hand in a fixed layout; ``akrelay peers add|remove`` round-trips it.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Iterable, TypedDict, cast
from urllib.parse import urlsplit

from akrelay.protocol.discovery import canonical_origin

#: Defaults applied to a peer entry that omits a field.
DEFAULT_INTERVAL = 30.0
DEFAULT_PAGE_LIMIT = 500
#: With these two, a pass stays within 64 MB of memory whatever a peer sends (docs/federation.md).
DEFAULT_MAX_PAGE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MAX_PAGES = 100_000


class PeerConfigError(ValueError):
    """The peer file (or one entry of it) cannot be used; the message says where."""


def canonical_https_origin(url: str) -> str:
    """``https://host[:port]`` with a lower-case host and no default port.

    Peers are contacted only over HTTPS and only at their origin, so anything
    with a path, query, fragment or userinfo is refused rather than trimmed.
    """
    if not isinstance(url, str) or not url:
        raise PeerConfigError("a peer origin must be a non-empty string")
    try:
        parts = urlsplit(url)
        parts.port  # raises ValueError for a malformed or out-of-range port
    except ValueError as exc:
        raise PeerConfigError(f"{url!r} is not a valid URL: {exc}") from None
    if parts.scheme.lower() != "https":
        raise PeerConfigError(f"{url!r}: peer origins must use https")
    if not parts.hostname:
        raise PeerConfigError(f"{url!r}: a peer origin needs a host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise PeerConfigError(f"{url!r}: userinfo is not allowed in a peer origin")
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        raise PeerConfigError(f"{url!r}: a peer origin has no path, query or fragment")
    try:
        return canonical_origin(url)  # the core's one serialization of an origin
    except ValueError as exc:
        raise PeerConfigError(f"{url!r} is not a valid HTTPS origin: {exc}") from None


@dataclass(frozen=True, slots=True)
class Peer:
    """One configured peer relay."""

    origin: str
    enabled: bool = True
    #: Seconds between passes when the previous pass succeeded.
    interval: float = DEFAULT_INTERVAL
    #: ``limit`` sent with every query page (1 through 1000).
    page_limit: int = DEFAULT_PAGE_LIMIT
    #: Largest response body accepted for one query page or discovery document.
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    #: Total bytes of dependency envelopes fetched with ``batch`` for one event.
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    #: PEM bundle that alone is trusted for this peer (wins over SSL_CERT_FILE etc.).
    ca_file: str | None = None
    #: Allow private, loopback and link-local addresses (test meshes, LANs).
    allow_private: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    #: Deadline of one whole request: connecting, TLS, sending, headers and body.
    read_timeout: float = DEFAULT_READ_TIMEOUT
    #: Query pages per pass; a pass that needs more saves its progress and fails.
    max_pages: int = DEFAULT_MAX_PAGES
    #: The peer's pinned Merkle log key (C2SP vkey, issue 23): each pass then verifies its signed log.
    log_key: str | None = None
    #: Subscribe to the peer's push stream when its discovery advertises one (then it is pulled at once).
    push: bool = True
    #: After a reconciliation, offer the peer the events it lacks when its discovery invites offers (issue 26).
    offer: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "origin", canonical_https_origin(self.origin))
        _check_bool("enabled", self.enabled)
        _check_bool("allow_private", self.allow_private)
        _check_bool("push", self.push)
        _check_bool("offer", self.offer)
        for name in ("interval", "connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise PeerConfigError(f"{self.origin}: {name} must be a positive number of seconds")
            object.__setattr__(self, name, float(value))
        if not _is_int(self.page_limit) or not 1 <= self.page_limit <= 1000:
            raise PeerConfigError(f"{self.origin}: page_limit must be an integer from 1 through 1000")
        if not _is_int(self.max_pages) or self.max_pages < 1:
            raise PeerConfigError(f"{self.origin}: max_pages must be a positive integer")
        for name in ("max_page_bytes", "max_batch_bytes"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1024:
                raise PeerConfigError(f"{self.origin}: {name} must be an integer of at least 1024")
        if self.log_key is not None:
            from akrelay.protocol.note import NoteError, parse_vkey

            try:
                parse_vkey(self.log_key) if isinstance(self.log_key, str) else parse_vkey("")
            except NoteError as exc:
                raise PeerConfigError(f"{self.origin}: log_key is not a verifier key: {exc}") from None
        if self.ca_file is not None and (not isinstance(self.ca_file, str) or not self.ca_file):
            raise PeerConfigError(f"{self.origin}: ca_file must be a path")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise PeerConfigError(f"{name} must be true or false")


_FIELDS = tuple(f.name for f in fields(Peer))


@dataclass(slots=True)
class PeerFile:
    """The whole file: an ordered list of peers with distinct origins."""

    peers: list[Peer] = field(default_factory=list)

    def get(self, origin: str) -> Peer | None:
        origin = canonical_https_origin(origin)
        return next((p for p in self.peers if p.origin == origin), None)

    def add(self, peer: Peer) -> bool:
        """Add or update ``peer``; ``True`` when it was new."""
        for i, existing in enumerate(self.peers):
            if existing.origin == peer.origin:
                self.peers[i] = peer
                return False
        self.peers.append(peer)
        return True

    def remove(self, origin: str) -> bool:
        origin = canonical_https_origin(origin)
        before = len(self.peers)
        self.peers = [p for p in self.peers if p.origin != origin]
        return len(self.peers) != before

    def enabled(self) -> list[Peer]:
        return [p for p in self.peers if p.enabled]


def parse_peers(text: str, *, base_dir: Path | None = None, source: str = "peer file") -> PeerFile:
    """Parse the TOML text of a peer file; relative ``ca_file`` paths resolve from ``base_dir``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PeerConfigError(f"{source} is not valid TOML: {exc}") from None
    unknown = set(doc) - {"peer"}
    if unknown:
        raise PeerConfigError(f"{source}: unknown top-level keys {sorted(unknown)} (peers are [[peer]] tables)")
    entries = doc.get("peer", [])
    if not isinstance(entries, list):
        raise PeerConfigError(f"{source}: 'peer' must be an array of tables ([[peer]])")
    result = PeerFile()
    for index, entry in enumerate(entries, 1):
        where = f"{source}, peer #{index}"
        if not isinstance(entry, dict):
            raise PeerConfigError(f"{where}: must be a table")
        bad = set(entry) - set(_FIELDS)
        if bad:
            raise PeerConfigError(f"{where}: unknown keys {sorted(bad)}")
        if "origin" not in entry:
            raise PeerConfigError(f"{where}: 'origin' is required")
        values = dict(entry)
        ca = values.get("ca_file")
        if isinstance(ca, str) and ca and base_dir is not None and not os.path.isabs(ca):
            values["ca_file"] = str((base_dir / ca).resolve())
        try:
            peer = Peer(**values)
        except PeerConfigError as exc:
            raise PeerConfigError(f"{where}: {exc}") from None
        if result.get(peer.origin) is not None:
            raise PeerConfigError(f"{where}: duplicate origin {peer.origin}")
        result.add(peer)
    return result


def load_peers(path: str | os.PathLike[str], *, missing_ok: bool = False) -> PeerFile:
    """Read a peer file; with ``missing_ok`` an absent file is an empty configuration."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return PeerFile()
        raise PeerConfigError(f"peer file {path} does not exist") from None
    except OSError as exc:
        raise PeerConfigError(f"cannot read peer file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PeerConfigError(f"peer file {path} is not UTF-8") from None
    return parse_peers(text, base_dir=path.parent, source=f"peer file {path}")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        out = ['"']
        for ch in value:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_peers(peer_file: PeerFile) -> str:
    """TOML text for ``peer_file``: one ``[[peer]]`` table each, defaults written out."""
    lines = ["# akrelay peer configuration (see peers/README.md).", ""]
    for peer in peer_file.peers:
        lines.append("[[peer]]")
        for name in _FIELDS:
            value = getattr(peer, name)
            if value is None:
                continue
            lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def save_peers(path: str | os.PathLike[str], peer_file: PeerFile) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    path = Path(path)
    text = dump_peers(peer_file)
    parse_peers(text)  # never write what we could not read back
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class PeerFields(TypedDict, total=False):
    """:class:`Peer`'s fields other than ``origin``, by keyword."""

    enabled: bool
    interval: float
    page_limit: int
    max_page_bytes: int
    max_batch_bytes: int
    ca_file: str | None
    allow_private: bool
    connect_timeout: float
    read_timeout: float
    max_pages: int
    log_key: str | None
    push: bool
    offer: bool


def make_peer(origin: str, **options: object) -> Peer:
    """A :class:`Peer` from CLI-style options, ignoring those left as ``None`` (``Peer`` checks each value)."""
    return with_changes(Peer(origin=origin), **options)


def with_changes(peer: Peer, **changes: object) -> Peer:
    """``peer`` with the options that are not ``None`` changed; ``Peer.__post_init__`` checks every value."""
    fields = cast(PeerFields, {k: v for k, v in changes.items() if v is not None})
    return replace(peer, **fields)


def distinct_origins(peers: Iterable[Peer], own_origin: str | None, limit: int = 32) -> list[str]:
    """Origins to advertise in discovery (§9.2): enabled, distinct, not ours, at most ``limit``."""
    own = None
    if own_origin:
        try:
            own = canonical_https_origin(own_origin)
        except PeerConfigError:
            own = None
    seen: list[str] = []
    for peer in peers:
        if peer.enabled and peer.origin != own and peer.origin not in seen:
            seen.append(peer.origin)
        if len(seen) == limit:
            break
    return seen

"""Launching the relay: settings -> relay -> Granian over HTTPS.

Workers are separate processes (Granian), each opening the same data
directory; the store serializes ``seq`` allocation at its commit point, so N
workers are as safe as one. The launcher resolves the settings once and hands
them to every worker in one environment variable, so all workers agree. The
log followers (search indexer, KIP importer) run in one process of their own
beside the workers (:mod:`akrelay.process.followers`, ``--followers process``), which
the launcher starts with Granian (waiting for it first only when the index and
the nexus do not exist yet) and stops after it.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from pathlib import Path
from typing import TextIO

from akrelay.process.followers import FOLLOWER_PROCESS_ENV, READY_TIMEOUT, FollowerProcess, derived_state_exists
from akrelay.node import RelayNode, check_components
from akrelay.settings import RESOLVED_ENV, Settings, SettingsError, record_origin

APP_FACTORY = "akrelay.process.worker:create_app_from_env"
#: Seconds Granian waits for the workers to stop after SIGTERM before killing them (all together).
WORKERS_KILL_TIMEOUT = 2


def check_origin(settings: Settings) -> str:
    """The canonical origin, or a clear :class:`SettingsError`."""
    from akrelay.protocol.discovery import canonical_origin

    try:
        origin = canonical_origin(settings.origin)
    except ValueError as exc:
        raise SettingsError(f"--origin {settings.origin!r} is not an HTTPS origin: {exc}") from None
    if origin != settings.origin.rstrip("/"):
        # A path, query or non-canonical spelling would make discovery disagree with itself.
        from urllib.parse import urlsplit

        if urlsplit(settings.origin).path not in ("", "/"):
            raise SettingsError(f"--origin {settings.origin!r} must be an origin (no path)")
    return origin


def check_tls_files(settings: Settings) -> tuple[Path, Path] | None:
    """The operator's certificate and key when given (both must be files), else ``None``."""
    if not settings.tls_cert or not settings.tls_key:  # the settings hold both or neither
        return None
    cert, key = Path(settings.tls_cert), Path(settings.tls_key)
    for path in (cert, key):
        if not path.is_file():
            raise SettingsError(f"TLS file not found: {path}")
    return cert, key


def validate(settings: Settings) -> Settings:
    """Every check of the settings that has no side effect, with the canonical origin.

    Run before the port is probed: a bad setting is reported as itself, whether or
    not something else already listens on the port (and nothing is created for it).
    """
    check_components(settings)  # a bad peer or contexts file
    origin = check_origin(settings)
    check_tls_files(settings)
    return settings.replace(origin=origin)


def tls_files(settings: Settings, out: TextIO | None = None) -> tuple[Path, Path]:
    """The operator's certificate, or the data directory's self-signed one (printed)."""
    operator = check_tls_files(settings)
    if operator is not None:
        return operator
    from akrelay.tls import ensure_self_signed

    files = ensure_self_signed(settings.data_dir, settings.origin)
    if out is not None:
        verb = "created" if files.created else "using"
        print(f"akrelay: {verb} self-signed TLS certificate {files.cert.resolve()} "
              f"(clients trust it with --cacert {files.cert.resolve()})", file=out, flush=True)
    return files.cert, files.key


def prepare(settings: Settings, out: TextIO | None = None) -> tuple[Settings, Path, Path]:
    """Everything that must happen once before workers start: origin, data dir, store, TLS."""
    origin = check_origin(settings)
    settings = settings.replace(origin=origin, data=str(settings.data_dir.resolve()))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    record_origin(settings.data_dir, origin)  # what sync and reindex --kip take as this relay's origin
    # Open once in the launcher so that schema creation and the relay secret exist
    # before several workers race to create them.
    RelayNode.open(settings, components=()).stop()
    cert, key = tls_files(settings, out)
    return settings, cert, key


def check_address_free(host: str, port: int) -> None:
    """Refuse an address another process already listens on, naming it.

    Granian's workers bind with port reuse, so the kernel would otherwise let a
    second relay share the port and split connections between two unrelated
    services. A probe bound without port reuse fails exactly when someone
    listens there (``SO_REUSEADDR`` only forgives connections in TIME_WAIT).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise SettingsError(f"--host {host!r} cannot be resolved: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    ip, bound_port = str(address[0]), str(address[1])  # an IP address and port (AF_INET or AF_INET6)
    shown = f"[{ip}]:{bound_port}" if family == socket.AF_INET6 else f"{ip}:{bound_port}"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SettingsError(f"address {shown} is already in use by another process (another relay?); "
                                    "stop it or choose another --port/--host") from None
            raise SettingsError(f"cannot listen on {shown}: {exc.strerror}") from None


def banner(settings: Settings) -> str:
    """The start line: the origin clients must use, apart from the address listened on.

    A relay answers only by its origin (§9.2), so the listen address is not printed as a URL:
    ``https://127.0.0.1:8443`` would be refused by every client as another origin.
    """
    listen = f"[{settings.host}]" if ":" in settings.host else settings.host
    return (f"akrelay: serving origin {settings.origin} (clients use --relay {settings.origin}), listening on "
            f"{listen}:{settings.port} with {settings.workers} worker(s), data in {settings.data_dir}")


def start_followers(followers: FollowerProcess, settings: Settings, out: TextIO) -> None:
    """Start the followers' process: beside the workers on a restart, before them on a first start.

    On a restart the search index and the KIP nexus exist: the workers open them while the
    followers' process starts, so neither waits for the other (issue 25: awaiting it first
    cost seconds before any worker began). On a first start the launcher waits for the
    process to create them, so they exist before the first request, even on a busy machine.
    """
    def say(ready: bool) -> None:
        print(f"akrelay: log followers (search indexer, KIP importer) in process {followers.pid}"
              f"{' ready' if ready else ' (still starting)'}", file=out, flush=True)

    if derived_state_exists(settings.data_dir):
        followers.start(on_ready=say)
    else:
        say(followers.start(ready_timeout=READY_TIMEOUT))


def serve(settings: Settings, out: TextIO | None = None) -> None:
    """Run Granian in the foreground until interrupted."""
    from granian import Granian
    from granian.constants import Interfaces

    out = out if out is not None else sys.stderr
    settings = validate(settings)  # validation first, the port second
    check_address_free(settings.host, settings.port)
    settings, cert, key = prepare(settings, out)
    os.environ[RESOLVED_ENV] = settings.to_env()
    from akrelay.observability.metrics import prepare_multiprocess

    prepare_multiprocess(settings.data_dir)  # before any worker exists: /metrics sums every worker
    print(banner(settings), file=out, flush=True)
    followers = None
    os.environ.pop(FOLLOWER_PROCESS_ENV, None)
    if settings.followers == "process" and not settings.core_only:
        followers = FollowerProcess()
        os.environ[FOLLOWER_PROCESS_ENV] = "1"  # the workers only read the derived state
    server = Granian(
        APP_FACTORY,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        workers=settings.workers,
        factory=True,
        ssl_cert=cert,
        ssl_key=key,
        log_access=False,
        backlog=2048,
        respawn_failed_workers=True,
        # A worker that has not ended this long after SIGTERM is killed (Granian issue #875: a
        # worker sometimes never exits). Acceptances are committed before they are acknowledged
        # and the followers' state is crash-safe, so a kill loses nothing acknowledged.
        workers_kill_timeout=WORKERS_KILL_TIMEOUT,
    )
    if followers is not None:
        start_followers(followers, settings, out)
    try:
        server.serve()
    finally:
        if followers is not None:
            followers.stop()

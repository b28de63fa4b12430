"""Operator settings for ``akrelay serve``.

Every option is declared once in :data:`OPTIONS` and is then settable three
ways, with precedence flag > environment (``AKRELAY_<NAME>``) > TOML config file
(``--config``) > default. Other areas add their options with one call to
:func:`option` at import time of their own module, so nobody edits this table.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, TypeVar

from akrelay.optionkit import (  # noqa: F401  (re-exported: the settings' public names)
    ENV_PREFIX, OPTIONS, Option, _bool, _int, _port, _positive_int, _rate, _seconds, _str, area_kwargs, area_values,
    build_area, option, setting,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Area = TypeVar("_Area", bound="DataclassInstance")

#: The resolved settings, serialized for Granian worker processes.
RESOLVED_ENV = "AKRELAY__RESOLVED_SETTINGS"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the source."""


def load_option_modules() -> None:
    """Declare the options of every component (each area keeps its own ``options`` module).

    This module imports them all (below its own declarations, so that ``--help``
    lists the relay-wide options first), so the call is kept only for the callers
    that name it: a module missing there is an import error, never a silently
    absent option.
    """


option("data", _str, "./akrelay-data", "data directory (SQLite store, TLS certificate, relay secret)", metavar="DIR")
def _store_url(text: object) -> str:
    """The ``--store`` value as given (stripped): :func:`akrelay.backend.backend_class` parses it against
    the backend registry, which knows the schemes (``""``/``sqlite``: the embedded store in ``--data``)."""
    return _str(text).strip()


option("store", _store_url, "",
       "the acceptance log: empty for the embedded SQLite file in --data, or redis://HOST:PORT/DB for a log "
       "shared by several relay nodes (docs/operations.md, Scaling out)", metavar="URL")


def _namespace(text: object) -> str:
    value = _str(text).strip()
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be a non-empty word without spaces")
    return value


option("store_namespace", _namespace, "akrelay",
       "with a redis:// --store: the prefix of every key of this deployment, so several deployments can share "
       "one Redis database", metavar="NAME")
option("accept_weak_durability", _bool, False,
       "with a redis:// --store: start even when Redis's live settings are not appendonly=yes and "
       "appendfsync=always (or CONFIG is disabled), accepting that a crash may lose acknowledged acceptances",
       kind="flag")
option("host", _str, "127.0.0.1", "address to listen on", serve_only=True)
option("port", _port, 8443, "TCP port to listen on", serve_only=True)
option("origin", _str, None,
       "the public service origin; discovery and every response use it. Not given: https://localhost:PORT "
       "for a loopback or wildcard --host, else https://HOST:PORT (the address actually served)", metavar="URL")
option("workers", _positive_int, 1, "number of Granian worker processes (all share the data directory)", metavar="N",
       serve_only=True)
option("tls_cert", _str, None, "operator TLS certificate (PEM); default: a self-signed one in the data directory",
       metavar="PEM", serve_only=True)
option("tls_key", _str, None, "private key for --tls-cert (PEM)", metavar="PEM", serve_only=True)
option("log_key", _str, None,
       "Ed25519 key (PKCS#8 PEM) that signs the Merkle log's checkpoints; default: log-key.pem made in the data "
       "directory. Every node of a Redis deployment needs the same file (docs/transparency.md)", metavar="PEM")
option("no_merkle_log", _bool, False,
       "do not extend the Merkle log in commits and serve no checkpoints (benchmarks of its cost only; the next "
       "start without it back-fills what was committed meanwhile)", kind="flag")
option("max_envelope_bytes", _positive_int, 262144,
       "largest accepted request body / envelope in bytes (payload_too_large)", metavar="N")
option("body_timeout", _seconds, 30.0,
       "seconds a request body may take to arrive completely after its headers; then 408 and close", metavar="SECONDS",
       serve_only=True)
option("write_rate", _rate, 50.0, "submissions per second per client IP (0 disables)", metavar="RPS", serve_only=True)
option("write_burst", _positive_int, 100, "token-bucket burst for submissions per client IP", metavar="N",
       serve_only=True)
option("read_rate", _rate, 200.0, "reads per second per client IP (0 disables)", metavar="RPS", serve_only=True)
option("read_burst", _positive_int, 400, "token-bucket burst for reads per client IP", metavar="N",
       serve_only=True)
option("licence_allow", _str, [], "accept only these licence URLs; each argument is a URL or a file with one URL per line",
       kind="list", metavar="FILE|URL")
option("core_only", _bool, False,
       "serve only the Knowledge core endpoints (no search, KIP or federation extensions)", kind="flag",
       serve_only=True)
def _followers(text: object) -> str:
    value = _str(text).strip().lower()
    if value not in ("process", "thread"):
        raise ValueError("must be 'process' or 'thread'")
    return value


option("followers", _followers, "process",
       "where the search indexer and the KIP importer run: 'process' (one low-priority process per data "
       "directory, started and stopped by serve; workers only read) or 'thread' (in whichever worker wins "
       "the lock)", metavar="process|thread", serve_only=True)
option("follow_max_defer", _seconds, 1.0,
       "while the log grows faster than 500 records/s, the longest the search indexer and the KIP importer "
       "hold off before they take what arrived (seconds): larger values leave more CPU to acceptance during "
       "a burst, and search and KIP answers that much further behind until it ends (docs/operations.md)",
       metavar="SECONDS")
option("refuse_legacy_retract", _bool, False,
       "refuse knowledge.retract payloads without `license` (the earlier draft's form, accepted by default)", kind="flag")
# Federation (docs/federation.md): the peer file enables the sync loop inside serve.
def _peer_file(text: object) -> str:
    """The peer file's path; its content is checked by the sync component (``akrelay.node.check_components``) at startup."""
    return _str(text)


option("peers", _peer_file, "", "peer configuration file (TOML, see peers/README.md); runs the sync loop", metavar="FILE")
option("follow_hints", _bool, False, "also sync from origins that peers advertise as hints (bounded below)", kind="flag")
option("hint_hops", _positive_int, 1, "with --follow-hints: how many hint hops away from a configured peer", metavar="N")
option("hint_count", _positive_int, 8, "with --follow-hints: most hinted origins followed in total", metavar="N")
# The push stream (GET /v1/knowledge/stream, docs/federation.md "Push"): announces acceptances to subscribed peers.
option("no_push_stream", _bool, False, "serve no push stream and do not advertise it (peers then only poll)",
       kind="flag", serve_only=True)
option("push_heartbeat", _seconds, 15.0, "seconds between heartbeat comments on an idle push stream", metavar="SECONDS",
       serve_only=True)
option("push_streams_per_client", _positive_int, 4, "push streams one client IP may hold open on a worker (then 429)",
       metavar="N", serve_only=True)
option("push_streams", _positive_int, 256, "push streams a worker holds open in all (then 503)", metavar="N",
       serve_only=True)
option("push_poll", _seconds, 0.1,
       "with SQLite and several workers: how often a worker with open push streams reads the checkpoint to hear "
       "the other workers' commits (Redis announces them instead)", metavar="SECONDS", serve_only=True)


def _interval(text: object) -> float:
    """Seconds, or 0 for never."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError("must be a number of seconds")
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError("must be 0 or a positive, finite number of seconds")
    return value


option("no_reconcile", _bool, False,
       "neither serve POST /v1/knowledge/reconcile (nor advertise it) nor reconcile with peers; sync then only "
       "pulls after_seq (docs/federation.md)", kind="flag")
option("reconcile_interval", _interval, 3600.0,
       "seconds between two set reconciliations with each peer that advertises it, which heal holes the "
       "after_seq pull leaves (0: only on first contact and with `akrelay sync --reconcile`)", metavar="SECONDS")
def _copy_cap(text: object) -> int:
    value = _int(text)
    if not 0 <= value <= 50_000_000:
        raise ValueError("must be an integer from 0 through 50000000")
    return value


option("reconcile_copy_max", _copy_cap, 2_000_000,
       "largest reconciliation set each serving process keeps in memory (about 50 bytes an event), copied at "
       "start and kept current so that reconciliations are answered from memory (0: never; a larger set is read "
       "from the store's aggregates)", metavar="N")


def _offer_count(text: object) -> int:
    value = _int(text)
    if not 0 <= value <= 100_000:
        raise ValueError("must be an integer from 0 through 100000")
    return value


option("no_offer", _bool, False,
       "after a reconciliation, do not offer a peer that accepts offers the events it lacks (docs/federation.md)",
       kind="flag")
option("offer_max", _offer_count, 1000,
       "events offered to one peer per reconciliation at most (0: none)", metavar="N")
option("no_accept_offers", _bool, False,
       "do not advertise reconcile.accepts_offers: peers that reconciled with us then do not POST us the events "
       "we lack (they still arrive by our own pulls)", kind="flag", serve_only=True)


# Each area's options and frozen settings, declared after the relay-wide options above (the --help order).
from akrelay.explorer.options import ExplorerSettings  # noqa: E402
from akrelay.kip.options import KipSettings  # noqa: E402
from akrelay.knowql.options import KnowqlSettings  # noqa: E402
from akrelay.observability.options import ObservabilitySettings  # noqa: E402
from akrelay.search.options import SearchSettings  # noqa: E402


@dataclass(frozen=True, slots=True)
class FederationSettings:
    """Sync, the push stream and reconciliation (``settings.federation``)."""

    peers: str = setting("peers")
    follow_hints: bool = setting("follow_hints")
    hint_hops: int = setting("hint_hops")
    hint_count: int = setting("hint_count")
    no_push_stream: bool = setting("no_push_stream")
    push_heartbeat: float = setting("push_heartbeat")
    push_streams_per_client: int = setting("push_streams_per_client")
    push_streams: int = setting("push_streams")
    push_poll: float = setting("push_poll")
    no_reconcile: bool = setting("no_reconcile")
    reconcile_interval: float = setting("reconcile_interval")
    reconcile_copy_max: int = setting("reconcile_copy_max")
    no_offer: bool = setting("no_offer")
    offer_max: int = setting("offer_max")
    no_accept_offers: bool = setting("no_accept_offers")


#: The areas' settings: ``Settings`` field name -> its frozen dataclass (options declared in its module).
AREAS: "dict[str, type[DataclassInstance]]" = {
    "federation": FederationSettings, "search": SearchSettings, "kip": KipSettings, "knowql": KnowqlSettings,
    "explorer": ExplorerSettings, "observability": ObservabilitySettings,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Resolved option values: the relay-wide ones as typed fields, each area's in its own frozen value.

    ``settings.port``, ``settings.search.candidates``, ``settings.federation.peers``. Each field names
    the option it holds (:func:`akrelay.optionkit.setting`), so the option declarations stay the one
    source of flags, environment variables, defaults and validation. Build one with
    :func:`load_settings`, :func:`defaults` or :meth:`from_values`; change one with :meth:`replace`.
    """

    data: str = setting("data")
    store: str = setting("store")
    store_namespace: str = setting("store_namespace")
    accept_weak_durability: bool = setting("accept_weak_durability")
    host: str = setting("host")
    port: int = setting("port")
    #: Never ``None`` once built: without ``--origin`` it is :func:`served_origin` of host and port.
    origin: str = setting("origin")
    workers: int = setting("workers")
    tls_cert: str | None = setting("tls_cert")
    tls_key: str | None = setting("tls_key")
    log_key: str | None = setting("log_key")
    no_merkle_log: bool = setting("no_merkle_log")
    max_envelope_bytes: int = setting("max_envelope_bytes")
    body_timeout: float = setting("body_timeout")
    write_rate: float = setting("write_rate")
    write_burst: int = setting("write_burst")
    read_rate: float = setting("read_rate")
    read_burst: int = setting("read_burst")
    licence_allow: tuple[str, ...] = setting("licence_allow")
    core_only: bool = setting("core_only")
    followers: str = setting("followers")
    follow_max_defer: float = setting("follow_max_defer")
    refuse_legacy_retract: bool = setting("refuse_legacy_retract")
    federation: FederationSettings = field(default_factory=FederationSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    kip: KipSettings = field(default_factory=KipSettings)
    knowql: KnowqlSettings = field(default_factory=KnowqlSettings)
    explorer: ExplorerSettings = field(default_factory=ExplorerSettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    #: Where each value came from: ``flag``, ``env``, ``file``, ``default``, ``launcher`` or ``code``.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: Every option's value by option name, also those of an option no field above holds yet (:meth:`view`).
    option_values: Mapping[str, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.origin is None:
            object.__setattr__(self, "origin", served_origin(self.host, self.port))
        held = area_values(self)
        for name in AREAS:
            held.update(area_values(getattr(self, name)))
        given = dict(self.option_values)
        object.__setattr__(self, "option_values", {
            name: given.get(name, opt.default) if name not in held else held[name] for name, opt in OPTIONS.items()})

    @classmethod
    def from_values(cls, values: Mapping[str, object], sources: Mapping[str, str] | None = None) -> "Settings":
        """Settings from parsed values keyed by option name (an option not given keeps its default)."""
        unknown = set(values) - set(OPTIONS)
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        kwargs = area_kwargs(cls, values)
        kwargs.update({name: build_area(area, values) for name, area in AREAS.items()})
        return cls(**kwargs, sources=dict(sources or {}), option_values=dict(values))

    def replace(self, **changes: object) -> "Settings":
        """These settings with some options (by option name) changed; their source becomes ``code``."""
        unknown = set(changes) - set(OPTIONS)
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        return Settings.from_values({**self.option_values, **changes},
                                    {**self.sources, **{k: "code" for k in changes}})

    def view(self, cls: type[_Area]) -> _Area:
        """The typed settings of any dataclass whose fields are :func:`~akrelay.optionkit.setting` s.

        The areas above are fields already (``settings.search``); this serves an area
        whose settings are not (yet) one of them, with the same values.
        """
        return build_area(cls, self.option_values)

    def as_dict(self) -> dict[str, object]:
        """``{option name: value}`` of every option, in declaration order (a list option as a list)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in self.option_values.items()}

    @property
    def data_dir(self) -> Path:
        return Path(self.data)

    def to_env(self) -> str:
        """Serialize for a worker process (:func:`from_resolved_env`)."""
        return json.dumps(self.as_dict())


def add_arguments(parser: argparse.ArgumentParser, *, include_serve_only: bool = True) -> None:
    """Add ``--config`` and one flag per option; flags default to "not given"."""
    load_option_modules()
    parser.add_argument("--config", metavar="TOML", default=None,
                        help=f"TOML config file (keys are option names, e.g. port = 8443); env {ENV_PREFIX}CONFIG")
    for opt in OPTIONS.values():
        if opt.serve_only and not include_serve_only:
            continue
        default_text = "off" if opt.kind == "flag" else (opt.default if opt.default not in (None, []) else "none")
        help_text = f"{opt.help} [env {opt.env}; default {default_text}]"
        if opt.kind == "flag":
            parser.add_argument(opt.flag, dest=opt.name, action="store_const", const=True,
                                default=None, help=help_text)
        elif opt.kind == "list":
            parser.add_argument(opt.flag, dest=opt.name, nargs="+", default=None,
                                metavar=opt.metavar, help=help_text)
        else:
            parser.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.metavar, help=help_text)


def _parse(opt: Option, raw: object, source: str) -> object:
    try:
        if opt.kind == "list":
            if isinstance(raw, str):
                raw = raw.split()
            if not isinstance(raw, (list, tuple)):
                raise ValueError("must be a list")
            return [opt.parse(item) for item in raw]
        if opt.kind == "flag":
            return _bool(raw)
        return opt.parse(raw)
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"{opt.flag} from {source}: {raw!r} {exc}") from None


def load_settings(args: argparse.Namespace | Mapping[str, object] | None = None,
                  env: Mapping[str, str] | None = None,
                  config: str | os.PathLike[str] | None = None) -> Settings:
    """Resolve every option: flag > environment > config file > default."""
    load_option_modules()
    env = os.environ if env is None else env
    given: dict[str, object] = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    given_config = given.get("config")
    if given_config is not None and not isinstance(given_config, (str, os.PathLike)):
        raise SettingsError(f"--config: {given_config!r} is not a path")
    config = given_config or config or env.get(ENV_PREFIX + "CONFIG")
    file_values: dict[str, object] = {}
    if config:
        path = Path(config)
        try:
            with path.open("rb") as fh:
                loaded = tomllib.load(fh)
        except OSError as exc:
            raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
        for key, value in loaded.items():
            name = key.replace("-", "_")
            if name not in OPTIONS:
                raise SettingsError(f"config file {path}: unknown option {key!r}")
            file_values[name] = value
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, opt in OPTIONS.items():
        if given.get(name) is not None:
            values[name], sources[name] = _parse(opt, given[name], "the command line"), "flag"
        elif opt.env in env:
            values[name], sources[name] = _parse(opt, env[opt.env], opt.env), "env"
        elif name in file_values:
            values[name], sources[name] = _parse(opt, file_values[name], f"config {config}"), "file"
        else:
            values[name], sources[name] = opt.default, "default"
    if (values.get("tls_cert") is None) != (values.get("tls_key") is None):
        raise SettingsError("--tls-cert and --tls-key must be given together")
    host, port = values.get("host", "127.0.0.1"), values.get("port")
    if values.get("origin") is None and isinstance(host, str) and isinstance(port, int):  # parsed: always so
        values["origin"] = served_origin(host, port)
    return Settings.from_values(values, sources)


#: Listen addresses that a client on this machine reaches as ``localhost``.
_LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "0.0.0.0", "::", "", "localhost"})


def served_origin(host: str, port: int) -> str:
    """The origin of the address served, for when ``--origin`` is not given.

    Loopback and wildcard hosts become ``localhost`` (the name the self-signed
    certificate covers); a specific address or name is used as it is.
    """
    name = "localhost" if host.strip("[]") in _LOCAL_HOSTS else host
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"
    return f"https://{name}:{port}"


def from_resolved_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings handed to a worker by the launcher, or resolved afresh."""
    env = os.environ if env is None else env
    if RESOLVED_ENV in env:
        values = json.loads(env[RESOLVED_ENV])
        return Settings.from_values(values, {name: "launcher" for name in values})
    return load_settings({}, env)


def defaults(**overrides: object) -> Settings:
    """Default settings (no flags, no environment, no file) plus ``overrides``."""
    return load_settings({}, {}).replace(**overrides) if overrides else load_settings({}, {})


def licence_allow_list(settings: Settings, read_file: Callable[[str], str] | None = None) -> frozenset[str] | None:
    """Expand ``--licence-allow`` (URLs or files of URLs) into a set, or ``None`` when unset."""
    items: Iterable[str] = settings.licence_allow
    if not items:
        return None
    allowed: set[str] = set()
    for item in items:
        if item.startswith(("https://", "http://")):
            allowed.add(item)
            continue
        try:
            text = read_file(item) if read_file else Path(item).read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"--licence-allow: cannot read {item}: {exc.strerror}") from None
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                allowed.add(line)
    return frozenset(allowed)


#: The file in a data directory naming the origin ``serve`` last served it at: the origin its data
#: belongs to (KIP Space ids embed it, and sync must not take a peer on it for itself).
ORIGIN_RECORD = "served-origin"


def recorded_origin(data_dir: str | os.PathLike[str]) -> str | None:
    """The origin ``serve`` last used for ``data_dir``, if it recorded one."""
    try:
        text = (Path(data_dir) / ORIGIN_RECORD).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def record_origin(data_dir: str | os.PathLike[str], origin: str) -> None:
    """Remember ``origin`` as the one ``data_dir`` is served at (atomically, only when it changed)."""
    if recorded_origin(data_dir) == origin:
        return
    path = Path(data_dir) / ORIGIN_RECORD
    tmp = path.with_name(ORIGIN_RECORD + ".tmp")
    tmp.write_text(origin + "\n", encoding="utf-8")
    os.replace(tmp, path)


def with_data_origin(settings: Settings) -> Settings:
    """``settings`` with the data directory's recorded origin when no origin was given.

    The default origin (``https://localhost:8443``) describes a ``serve`` on the
    default port, not the data directory a command works on: a command that
    needs the relay's own origin takes it from ``--origin`` (or the environment
    or config), else from what ``serve`` recorded, else refuses.
    """
    if settings.sources.get("origin", "default") != "default":
        return settings
    recorded = recorded_origin(settings.data_dir)
    if recorded is None:
        raise SettingsError(f"the data directory {settings.data_dir} has no recorded origin (`akrelay serve` "
                            f"records the origin it serves in {ORIGIN_RECORD} there): pass --origin URL, "
                            "the relay's public origin")
    return settings.replace(origin=recorded)

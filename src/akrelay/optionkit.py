"""The option machinery, below the settings and every area's ``options`` module.

``akrelay.settings`` resolves options; each area declares its own with
:func:`option` in its ``options`` module, which imports only this module, so
that the settings can import those modules without an import cycle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "AKRELAY_"

_Area = TypeVar("_Area", bound="DataclassInstance")


def _positive_int(text: object) -> int:
    value = _int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _int(text: object) -> int:
    if isinstance(text, bool):
        raise ValueError("must be an integer")
    if isinstance(text, int):
        return text
    if not isinstance(text, str) or not text.strip().isdigit():
        raise ValueError("must be a decimal integer")
    return int(text.strip())


def _rate(text: object) -> float:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError("must be a number")
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0 (0 disables the limit)")
    return value


def _seconds(text: object) -> float:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError("must be a number of seconds")
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError("must be a positive, finite number of seconds")
    return value


def _port(text: object) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a TCP port (0-65535)")
    return value


def _str(text: object) -> str:
    if not isinstance(text, str):
        raise ValueError("must be a string")
    return text


def _bool(text: object) -> bool:
    if isinstance(text, bool):
        return text
    if isinstance(text, str) and text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(text, str) and text.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be a boolean (true/false)")


@dataclass(frozen=True)
class Option:
    """One setting: its name, parser, default and help text.

    ``kind`` is ``"value"`` (one value), ``"flag"`` (boolean switch) or
    ``"list"`` (zero or more values; whitespace-separated in the environment).
    ``serve_only`` marks what only the HTTP server reads (listener, TLS, rates),
    so that ``akrelay sync`` does not offer it.
    """

    name: str
    #: Takes a flag's or an environment variable's text, or a TOML config file's value.
    parse: Callable[[object], object]
    default: object
    help: str
    kind: str = "value"
    metavar: str | None = None
    serve_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


#: Every serve option, in help order. Extend with :func:`option`.
OPTIONS: dict[str, Option] = {}

def option(name: str, parse: Callable[[object], object], default: object, help: str, *,
           kind: str = "value", metavar: str | None = None, serve_only: bool = False) -> Option:
    """Declare a serve option (a one-line change for any area)."""
    if kind not in ("value", "flag", "list"):
        raise ValueError(f"unknown option kind {kind!r}")
    opt = Option(name, parse, default, help, kind, metavar, serve_only)
    OPTIONS[name] = opt
    return opt


#: The metadata key of a settings field naming the option it holds.
OPTION_KEY = "akrelay.option"


def setting(name: str) -> Any:  # Any: a dataclass field default; the field's own annotation gives its type
    """A typed field of an area's frozen settings that holds the declared option ``name``.

    The option (parser, default, help, flag and environment variable) stays the
    one declaration; the field adds only its Python type. A list option's field
    holds a tuple, so the settings stay immutable.
    """
    opt = OPTIONS[name]
    if opt.kind == "list":
        assert isinstance(opt.default, (list, tuple)), f"list option {name} has a default that is not a list"
        default = tuple(opt.default)
        return dataclasses.field(default_factory=lambda: default, metadata={OPTION_KEY: name})
    return dataclasses.field(default=opt.default, metadata={OPTION_KEY: name})


def option_names(cls: "type[DataclassInstance]") -> dict[str, str]:
    """``{field name: option name}`` of a settings dataclass (only the fields that hold an option)."""
    return {f.name: f.metadata[OPTION_KEY] for f in dataclasses.fields(cls) if OPTION_KEY in f.metadata}


def area_kwargs(cls: "type[DataclassInstance]",
                values: Mapping[str, object]) -> dict[str, Any]:  # Any: keyword arguments of typed fields (parsed values)
    """The keyword arguments of a settings dataclass's option fields from values keyed by option name."""
    kwargs: dict[str, object] = {}
    for field_name, name in option_names(cls).items():
        if name in values:
            value = values[name]
            kwargs[field_name] = tuple(value) if isinstance(value, list) else value
    return kwargs


def build_area(cls: type[_Area], values: Mapping[str, object]) -> _Area:
    """An area's settings from resolved option values (by option name); a missing one keeps its default."""
    return cls(**area_kwargs(cls, values))


def area_values(area: "DataclassInstance") -> dict[str, object]:
    """``{option name: value}`` of an area's settings (the inverse of :func:`build_area`)."""
    return {name: getattr(area, field_name) for field_name, name in option_names(type(area)).items()}

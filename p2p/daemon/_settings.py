"""One settings model per daemon, read from defaults, a file, the environment and the CLI.

Precedence, lowest first (later ones win, nested keys merge)::

    defaults  <  config file (--config FILE: TOML, or JSON by its .json suffix)
              <  legacy environment names (DaemonSettings.legacy_env)
              <  COSMICAC_<DAEMON>__<KEY>[__<NESTED>...] environment variables
              <  command-line options (``overrides``)

Environment variables follow the platform's override form (seeds/relay.txt):
``__`` descends into a nested key, names are case-insensitive, and a list is
a JSON array (``COSMICAC_RELAY__ALLOW='["<key>"]'``; comma-separated works
too). A variable with the daemon's prefix that names no setting is an error,
as a misspelt key in the file is: a typo must not silently fall back to a
default.

Every failure is a :class:`ConfigError` naming the dotted key, where the value
came from, and what is wrong with it; daemons print it as one line and exit 2.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import AliasPath, BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ._types import LogFormat, LogLevel, Port

try:
    from pydantic_settings.sources.utils import parse_env_vars
except ImportError:  # pragma: no cover - older pydantic-settings
    from pydantic_settings.sources import parse_env_vars  # type: ignore[attr-defined,no-redef]

__all__ = ["ConfigError", "DaemonSettings", "MetricsSettings", "load_settings"]

S = TypeVar("S", bound="DaemonSettings")


class ConfigError(Exception):
    """A setting is missing, unknown or has a bad value; or the file is unreadable.

    Attributes:
        key: dotted path of the setting (``metrics.port``), or None for the file.
        source: where the value came from (``COSMICAC_RELAY__PORT``,
            ``config file relay.toml``, ``the command line``), or None.
        problem: what is wrong, in one line.
    """

    def __init__(self, key: str | None, problem: str, *, source: str | None = None) -> None:
        self.key = key
        self.source = source
        self.problem = problem
        where = f" (from {source})" if source else ""
        text = f"bad setting {key}{where}: {problem}" if key else problem
        super().__init__(" ".join(text.split()))  # always one line


class MetricsSettings(BaseModel):
    """Where the process's one Prometheus endpoint listens."""

    model_config = {"extra": "forbid"}

    host: str = "127.0.0.1"
    #: 0 turns the endpoint off.
    port: Port = 0


class DaemonSettings(BaseSettings):
    """Base of every daemon's settings: storage, logging and metrics.

    Subclass it with the daemon's own fields and its environment prefix::

        class RelaySettings(DaemonSettings):
            model_config = SettingsConfigDict(env_prefix="COSMICAC_RELAY__")
            port: Port = 49737

    and build it with :func:`load_settings` (never by calling the class with
    the environment in mind: that skips the file and the error mapping).
    """

    model_config = SettingsConfigDict(
        env_prefix="COSMICAC_DAEMON__",
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
    )

    #: Environment names that predate the prefix, mapped to dotted keys. They
    #: rank below the prefixed names.
    legacy_env: ClassVar[Mapping[str, str]] = {"COSMICAC_LOG_LEVEL": "log_level"}

    #: The daemon's folder: identity and state. None: the daemon keeps none
    #: (then nothing is locked).
    storage: Path | None = None
    log_level: LogLevel = "info"
    #: ``auto``: text on a terminal, JSON lines otherwise.
    log_format: LogFormat = "auto"
    metrics: MetricsSettings = MetricsSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        loading = _LOADING.get()
        file_data = loading.file_data if loading else {}
        legacy = _legacy_values(cls, loading.environ if loading else os.environ)
        return (
            init_settings,
            _EnvSource(settings_cls),
            InitSettingsSource(settings_cls, init_kwargs=legacy),
            InitSettingsSource(settings_cls, init_kwargs=file_data),
        )


class _Loading:
    def __init__(self, file_data: dict[str, Any], environ: Mapping[str, str]) -> None:
        self.file_data = file_data
        self.environ = environ


_LOADING: ContextVar[_Loading | None] = ContextVar("_LOADING", default=None)


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, reading the environ being loaded."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        loading = _LOADING.get()
        environ = loading.environ if loading else os.environ
        return parse_env_vars(environ, self.case_sensitive, self.env_ignore_empty,
                              self.env_parse_none_str)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # A field read through an AliasPath (the worker's ``bootstrap`` from
        # ``interconnect.bootstrap``) takes its value from the section the path
        # names, which that section's own variables fill. pydantic-settings
        # would look the path's head up as an unprefixed variable
        # (``INTERCONNECT``): a stray name in the environment must not count.
        if _read_elsewhere(field):
            return None, field_name, False
        return super().get_field_value(field, field_name)


def _read_elsewhere(field: FieldInfo) -> bool:
    """The field's value is read at another key (an :class:`~pydantic.AliasPath`)."""
    return isinstance(field.validation_alias, AliasPath)


def _nest(path: str, value: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    node = result
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return result


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _legacy_values(cls: type[DaemonSettings], environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, path in cls.legacy_env.items():
        if name in environ:
            _merge(values, _nest(path, environ[name]))
    return values


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(None, f"cannot read config file {path}: "
                                f"{exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(None, f"config file {path} is not UTF-8 text") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except ValueError as exc:  # JSONDecodeError and TOMLDecodeError both are
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise ConfigError(None, f"config file {path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(None, f"config file {path} must hold a table of settings")
    return data


def _env_name(cls: type[DaemonSettings], loc: tuple[str | int, ...]) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    return (prefix + "__".join(str(part) for part in loc)).upper()


def _lookup(data: Mapping[str, Any], loc: tuple[str | int, ...]) -> bool:
    node: Any = data
    for part in loc:
        if isinstance(part, int):
            return True  # an item of a list that is there
        if not isinstance(node, Mapping):
            return False
        matches = [key for key in node if str(key).lower() == str(part).lower()]
        if not matches:
            return False
        node = node[matches[0]]
    return True


def _source_of(cls: type[DaemonSettings], loc: tuple[str | int, ...], *,
               overrides: Mapping[str, Any], environ: Mapping[str, str],
               file_data: Mapping[str, Any], config_file: Path | None) -> str | None:
    """Which source holds the value at ``loc`` (highest precedence first)."""
    keys = tuple(part for part in loc if isinstance(part, str))
    if keys and _lookup(overrides, keys):
        return "the command line"
    upper = {name.upper(): name for name in environ}
    for depth in range(len(keys), 0, -1):  # the key itself, or a parent holding JSON
        name = _env_name(cls, keys[:depth])
        if name in upper:
            return upper[name]
    for name, path in cls.legacy_env.items():
        if name in environ and tuple(path.split(".")) == keys[: len(path.split("."))]:
            return name
    if keys and _lookup(file_data, keys):
        return f"config file {config_file}"
    return None


def _dotted(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _problem(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "no such setting"
    if kind == "missing":
        return "required, and not given"
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        if shown not in message and "got " not in message:
            message += f", got {shown}"
    return message


def _unknown_env(cls: type[DaemonSettings], environ: Mapping[str, str]) -> ConfigError | None:
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    if not prefix:
        return None
    for name in sorted(environ):
        if not name.upper().startswith(prefix):
            continue
        path = [part.lower() for part in name[len(prefix):].split("__")]
        model: type[BaseModel] | None = cls
        for part in path:
            fields = model.model_fields if model is not None else {}
            if part not in fields or _read_elsewhere(fields[part]):
                return ConfigError(".".join(path), "no such setting", source=name)
            annotation = fields[part].annotation
            is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
            model = annotation if is_model else None
            if model is None:
                break  # a leaf (a JSON value may fill a nested key; the model checks it)
    return None


def load_settings(
    cls: type[S],
    *,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> S:
    """Build ``cls`` from defaults, ``config_file``, the environment and ``overrides``.

    Args:
        cls: the daemon's :class:`DaemonSettings` subclass.
        config_file: a TOML file (JSON if it ends in ``.json``); None: no file.
        overrides: values given on the command line, keyed like the model
            (nested keys as nested dicts, or dotted: ``{"metrics.port": 9100}``).
            A value of None means "not given" and is left out.
        environ: the environment (``os.environ`` by default).

    Returns:
        The validated settings.

    Raises:
        ConfigError: naming the key, the source and the problem.
    """
    environ = os.environ if environ is None else environ
    path = Path(config_file) if config_file is not None else None
    file_data = _read_file(path) if path is not None else {}
    given: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _merge(given, _nest(key, value))
    unknown = _unknown_env(cls, environ)
    if unknown is not None:
        raise unknown
    token = _LOADING.set(_Loading(file_data, environ))
    try:
        return cls(**given)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        loc = tuple(first["loc"])
        source = _source_of(cls, loc, overrides=given, environ=environ, file_data=file_data,
                            config_file=path)
        problem = _problem(first)
        if first["type"] == "missing":
            problem = (f"required: set it in the config file, as {_env_name(cls, loc)}, "
                       "or with its option")
        # A value read twice (a section and a field aliased into it) fails twice.
        more = len({tuple(error["loc"]) for error in errors}) - 1
        if more:
            problem += f" (and {more} more)"
        raise ConfigError(_dotted(loc) or "(settings)", problem, source=source) from None
    except SettingsError as exc:
        # A nested key given as JSON that does not parse (COSMICAC_X__METRICS='{...').
        text = str(exc)
        field = text.split('"')[1] if text.count('"') >= 2 else None
        source = _env_name(cls, (field,)) if field else None
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(field or "(settings)", f"not valid JSON{cause}",
                          source=source) from None
    finally:
        _LOADING.reset(token)

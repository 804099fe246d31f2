"""The validators the configs share: each error names the field and what to do."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from surge.errors import ConfigError

T = TypeVar("T")


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" Did you mean {close[0]!r}?" if close else f" Known keys: {', '.join(known)}."


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build a config dataclass from a dict, naming `where` in every error."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}.")
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}.{_suggest(str(key), known)}")
    try:
        return cls(**data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def unreadable(key: str, path: str, exc: OSError | UnicodeDecodeError, what: str,
               reader: str) -> ConfigError:
    """The ConfigError for a file named by `key` that cannot be read, saying what to do."""
    if isinstance(exc, FileNotFoundError):
        return ConfigError(f"{key}: no such file {path!r}")
    if isinstance(exc, IsADirectoryError):
        return ConfigError(f"{key}: {path!r} is a directory; give {what}")
    if isinstance(exc, PermissionError):
        return ConfigError(f"{key}: cannot read {path!r} (permission denied); make it "
                           f"readable by {reader}")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    return ConfigError(f"{key}: cannot read {path!r}: {reason}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(name: str, value: object, *, minimum: float, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _require(_is_number(value) and value >= minimum,  # type: ignore[operator]
             f"{name} must be a number >= {minimum}, got {value!r}.")


def _positive(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _require(_is_number(value) and value > 0,  # type: ignore[operator]
             f"{name} must be a number > 0, got {value!r}.")


def _integer(name: str, value: object, *, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             f"{name} must be an integer >= {minimum}, got {value!r}.")

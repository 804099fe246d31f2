"""The one schema mechanism every config-like input uses: keys, ranges, typed decoding.

Deployment and app configs, `surge simulate` scenarios, `surge pulse` options and LLM
configs all check their input with these few functions, so a mistake reads the same
wherever it is made:

* `check_keys` rejects an unknown key with the closest known one ("Did you mean"), the
  only place that computes a suggestion (`closest`);
* `number` (`number_in` for `section[key]`) and `choice` check one value, every range
  in one message format (`NAME must be an integer >= 1, got 0.`);
* `decode` builds a msgspec Struct (typed fields, `forbid_unknown_fields=True`, ranges
  as `msgspec.Meta`) from plain data and words msgspec's failures the same way.

Each failure is a `FieldError`: a ConfigError that also carries the key path it blames,
relative to the mapping that was checked, so a loader that knows where each key was
written places it without reading the message: `load_yaml` gives a file's data and each
key path's line, `at_line` turns a FieldError into `FILE:LINE: PATH: problem`
(api/config_file.py collects many such lines; `surge pulse` scenarios raise the first).
`within(where, at)` prefixes an outer location and the key the inner mapping was under.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, TypeVar

import msgspec
import yaml

from surge.errors import ConfigError

__all__ = ["FieldError", "KeyPath", "at_line", "check_keys", "choice", "closest", "decode",
           "dotted", "from_mapping", "key_lines", "line_of", "load_yaml", "number",
           "number_in", "require", "suggestion", "unknown_key", "unreadable"]

T = TypeVar("T")
KeyPath = tuple[str | int, ...]

# difflib's ratio above which a known key is offered: 0.6 catches one or two typos in a
# short key ("prot" -> "port") without offering unrelated keys.
SUGGEST_CUTOFF = 0.6


class FieldError(ConfigError):
    """A config value that is wrong, with the key path it is about (`()`: the whole)."""

    def __init__(self, message: str, path: KeyPath = (), problem: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.problem = message if problem is None else problem  # the text after "PATH: "

    def within(self, where: str, at: KeyPath = ()) -> FieldError:
        """The same error seen from outside: its message prefixed with `where`, its path
        with `at` (the key the inner mapping was under) unless the path starts with it."""
        path = self.path if self.path[:len(at)] == at else (*at, *self.path)
        return FieldError(f"{where}: {self}", path, self.problem)


def closest(key: str, known: Iterable[str], cutoff: float = SUGGEST_CUTOFF) -> str | None:
    """The known name `key` was most likely meant to be, if any is close enough."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=cutoff)
    return match[0] if match else None


def suggestion(key: str, known: Collection[str]) -> str:
    """The hint after an unknown key: the closest known key, else all of them."""
    close = closest(key, known)
    if close is not None:
        return f" Did you mean {close!r}?"
    return f" Known keys: {', '.join(known)}." if known else ""


def unknown_key(key: str, known: Collection[str], where: str) -> FieldError:
    """The error for one unknown key of the mapping at `where`."""
    hint = suggestion(key, known)
    return FieldError(f"{where}: unknown key {key!r}.{hint}", (key,), f"unknown key.{hint}")


def check_keys(data: Mapping[Any, Any], known: Collection[str], where: str) -> None:
    """Raise a FieldError for the first key of `data` not in `known`."""
    for key in data:
        if key not in known:
            raise unknown_key(str(key), known, where)


def require(ok: bool, message: str) -> None:
    """A ConfigError with `message` unless `ok` (for checks no helper here words)."""
    if not ok:
        raise ConfigError(message)


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str, at: KeyPath = ()) -> T:
    """Build a config dataclass from a dict, naming `where` in every error (and `at`, the
    key it was under, in every FieldError's path)."""
    if not isinstance(data, Mapping):
        raise FieldError(f"{where}: expected a mapping, got {type(data).__name__}.")
    try:
        check_keys(data, [f.name for f in dataclasses.fields(cls)], where)  # type: ignore[arg-type]
    except FieldError as exc:
        raise FieldError(str(exc), (*at, *exc.path), exc.problem) from None
    try:
        return cls(**data)
    except FieldError as exc:
        raise exc.within(where, at) from None
    except (ConfigError, TypeError) as exc:
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


def _is_number(value: object, integer: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        return False
    return integer or math.isfinite(value)


def _bounds(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    low = f"{ge:g}" if ge is not None else f"{gt:g}" if gt is not None else None
    high = f"{le:g}" if le is not None else f"{lt:g}" if lt is not None else None
    if low is not None and high is not None:
        return f" in {'[' if ge is not None else '('}{low}, {high}{']' if le is not None else ')'}"
    if low is not None:
        return f" {'>=' if ge is not None else '>'} {low}"
    if high is not None:
        return f" {'<=' if le is not None else '<'} {high}"
    return ""


def number(name: str, value: Any, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, integer: bool = False,
           allow_none: bool = False, path: KeyPath | None = None) -> Any:
    """`value` if it is a finite number (an int if `integer`) in range, else a FieldError.

    The message is `NAME must be a number >= 0, got -1.` whoever asks; the path blamed is
    `name` split at its dots unless `path` is given.
    """
    if value is None and allow_none:
        return None
    ok = _is_number(value, integer) and not (
        (ge is not None and value < ge) or (gt is not None and value <= gt)
        or (le is not None and value > le) or (lt is not None and value >= lt))
    if not ok:
        kind = "an integer" if integer else "a number"
        null = " (or null)" if allow_none else ""
        raise FieldError(f"{name} must be {kind}{_bounds(ge, gt, le, lt)}{null}, "
                         f"got {value!r}.", tuple(name.split(".")) if path is None else path)
    return value


def number_in(section: Mapping[str, Any], key: str, where: str, default: Any = None, *,
              ge: float | None = None, gt: float | None = None, le: float | None = None,
              lt: float | None = None, integer: bool = False,
              allow_none: bool = False) -> Any:
    """`number` for `section[key]` (`default` when absent), named `where.key`."""
    return number(f"{where}.{key}", section.get(key, default), ge=ge, gt=gt, le=le, lt=lt,
                  integer=integer, allow_none=allow_none, path=(key,))


def choice(name: str, value: Any, options: Collection[Any], *,
           path: KeyPath | None = None) -> Any:
    """`value` if it is one of `options`, else a FieldError naming them."""
    if value not in options:
        raise FieldError(f"{name} must be one of {', '.join(map(str, options))}, "
                         f"got {value!r}.", tuple(name.split(".")) if path is None else path)
    return value


# -- where each key was written --------------------------------------------------------------


def key_lines(node: yaml.Node | None) -> dict[KeyPath, int]:
    """Each key path of a composed YAML document (`yaml.compose`) -> its 1-based line."""
    lines: dict[KeyPath, int] = {}
    if node is not None:
        _index_lines(node, (), lines)
    return lines


def _index_lines(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            lines[child] = key.start_mark.line + 1
            _index_lines(value, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, (*path, index), lines)


def line_of(lines: Mapping[KeyPath, int], path: KeyPath) -> int | None:
    """The line of `path`, else of its nearest enclosing key that has one."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def dotted(path: KeyPath) -> str:
    """`applications[0].deployments[1].name`, as the user would write it."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


def load_yaml(text: str, source: str) -> tuple[Any, dict[KeyPath, int]]:
    """A YAML document's data and `key_lines`; bad YAML is a ConfigError at its line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: not valid YAML: {problem}") from None
    return data, key_lines(node)


def at_line(source: str, lines: Mapping[KeyPath, int], error: FieldError) -> ConfigError:
    """`FILE:LINE: PATH: problem` for an error in a file read with `load_yaml`."""
    line = line_of(lines, error.path)
    where = f"{source}:{line}" if line else source
    return FieldError(f"{where}: {dotted(error.path)}: {error.problem}", error.path,
                      error.problem)


# -- msgspec --------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")
_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<type>[^`]*)`(?P<rest>.*)$")
_KINDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
          "object": "a mapping", "array": "a list"}


def decode(cls: type[T], data: Any, where: str) -> T:
    """`data` as a `cls` (a msgspec Struct, or a type built of them), or a FieldError.

    Messages match the hand-written checks: unknown keys get the closest field name,
    out-of-range values read as `number` words them; `where` names the input.
    """
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise _field_error(cls, data, str(exc), where) from None


def _field_error(cls: type, data: Any, text: str, where: str) -> FieldError:
    found = _AT.match(text)
    what = found["what"] if found else text
    at = (found["path"] if found else None) or ""
    path: KeyPath = tuple(name if name else int(index) for name, index in _PART.findall(at))
    name = ".".join([where, *(str(p) if isinstance(p, str) else f"[{p}]" for p in path)])
    name = name.replace(".[", "[")
    if unknown := _UNKNOWN.match(what):
        struct = _struct_at(cls, path)
        known = [f.encode_name for f in msgspec.structs.fields(struct)] if struct else []
        error = unknown_key(unknown["key"], known, name)
        return FieldError(str(error), (*path, *error.path), error.problem)
    last = next((str(p) for p in reversed(path) if isinstance(p, str)), where)
    if missing := _MISSING.match(what):
        tail = f"{missing['key']} is required."
        return FieldError(f"{name}.{tail}", (*path, missing["key"]), tail)
    if expected := _EXPECTED.match(what):
        kind = " or ".join(_KINDS.get(t, t) for t in expected["type"].split(" | "))
        rest = expected["rest"].removeprefix(",").strip()
        bound = "" if rest.startswith("got") else " " + re.sub(r"(\d)\.0\b", r"\1", rest)
        tail = f"must be {kind}{bound.rstrip()}, got {_value_at(data, path)!r}."
        return FieldError(f"{name} {tail}", path, f"{last} {tail}")
    return FieldError(f"{name}: {what}", path, what)


def _struct_at(cls: Any, path: KeyPath) -> Any:
    """The Struct type that holds `path` (for the field names an unknown key is offered)."""
    tp = cls
    for part in path:
        if isinstance(part, int):
            tp = _element(tp)
        else:
            struct = _struct_in(tp)
            field = next((f for f in msgspec.structs.fields(struct) if f.encode_name == part),
                         None) if struct is not None else None
            tp = field.type if field is not None else None
    return _struct_in(tp)


def _struct_in(tp: Any) -> Any:
    """The Struct `tp` is, or is an Optional of; else None."""
    for candidate in (tp, *getattr(tp, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def _element(tp: Any) -> Any:
    """The item type of a list (or an Optional list) type."""
    for candidate in (tp, *getattr(tp, "__args__", ())):
        args = getattr(candidate, "__args__", ())
        if getattr(candidate, "__origin__", None) in (list, tuple) and args:
            return args[0]
    return None


def _value_at(data: Any, path: KeyPath) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data

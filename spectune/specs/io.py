"""Reading specs from JSON/TOML into frozen dataclasses with errors that name field and file,
and writing JSON atomically (a crash never leaves a half-written file behind)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from spectune.specs.errors import SpecError, closest_names, unknown_name_error

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")

MAX_SPEC_FILE_BYTES = 16 * 1024 * 1024


def help_field(default: Any = dataclasses.MISSING, *, help: str) -> Any:
    """A dataclass field with a one-line help string (the CLI and error messages read it)."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def read_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a JSON or TOML file (by suffix) into a dict; errors name the file and the problem."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such file")
    if p.stat().st_size > MAX_SPEC_FILE_BYTES:
        raise SpecError(f"{p}: file is larger than {MAX_SPEC_FILE_BYTES} bytes; is it a spec?")
    text = p.read_bytes()
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text.decode("utf-8"))
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise SpecError(f"{p}: unsupported file type {suffix!r}; use .json or .toml")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: not valid {suffix[1:].upper()}: {e}") from e
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a table/object at the top level, got {type(data).__name__}")
    return data


def _check_type(value: Any, hint: Any, where: str) -> Any:
    """Coerce/check one field value against a simple annotation (int, float, str, bool, Optional)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(value, inner[0], where)
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise SpecError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SpecError(f"{where}: expected a list, got {value!r}")
        (elem, *_rest) = typing.get_args(hint)
        return tuple(_check_type(v, elem, f"{where}[{i}]") for i, v in enumerate(value))
    return value


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build dataclass `cls` from `data`; unknown, missing or mistyped fields raise SpecError
    naming the field and `where` (a file path or a description)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        k = unknown[0]
        near = closest_names(k, fields)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise SpecError(f"{where}: unknown field {k!r}{hint}; known fields: {', '.join(fields)}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _check_type(data[name], hints[name], f"{where}: field {name!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            help_ = f.metadata.get("help", "")
            raise SpecError(f"{where}: missing required field {name!r} ({help_})")
    try:
        return cls(**kwargs)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from e


def preset(presets: Mapping[str, T], name: str, kind: str) -> T:
    """The preset called `name` (case-insensitive); an unknown name lists the closest presets."""
    key = name.lower()
    if key not in presets:
        raise unknown_name_error(kind, name, presets)
    return presets[key]


def load_spec(
    cls: type[T], name_or_path: str | os.PathLike[str], presets: Mapping[str, T], kind: str
) -> T:
    """A preset name, or the path of a JSON/TOML file with the fields of dataclass `cls`."""
    s = str(name_or_path)
    if s.lower().endswith((".json", ".toml")) or os.sep in s:
        return from_mapping(cls, read_mapping(s), str(Path(s)))
    return preset(presets, s, kind)


def parse_int_list(text: str, what: str = "value") -> list[int]:
    """Parse '1,8,64' into [1, 8, 64]: non-negative integers, at least one (SpecError naming
    `what` otherwise). Shared by the CLI's list options and the dashboards' text inputs."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(
            f"{what}: expected comma-separated integers like 1,8,64, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise SpecError(f"{what}: expected non-negative integers like 1,8,64, got {text!r}")
    return values


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> None:
    """Write `obj` as JSON to `path` through a temp file + rename, so readers never see half a file."""
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (temp file in the same folder, fsync, rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

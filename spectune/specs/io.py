"""Reading user files within bounds, and writing files atomically.

Every file spectune reads from a user (specs, policies, traces, measurements, calibration runs,
dashboard uploads, arrival traces) comes through here, so one set of bounds applies everywhere:
a `Limits` caps the decompressed bytes of a file (gzip is streamed and stopped at the cap, so a
small bomb never inflates), the length of one line, the nesting depth, the number of values and
the length of a string; numbers must be finite, integers within +-2**53 and floats within
+-1e30. A breach is a SpecError naming the file (and line) and the field, e.g.
`run.json: field 'runs'[3]['speedup']: NaN is not a finite number`.

Documents are JSON or TOML (by suffix) parsed into plain dicts, then into frozen dataclasses by
`from_mapping`, which checks each field's type; writing goes through a temp file and a rename,
keeping an existing file's mode, so a crash never leaves half a file or a changed permission.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import sys
import tempfile
import types
import typing
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from spectune.specs.errors import SpecError, closest_names, unknown_name_error

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")

MiB = 1 << 20
MAX_ABS_INT = 2**53  # integers must be exact in float64 (and fit int64)
MAX_ABS_FLOAT = 1e30  # no physical quantity spectune reads comes near this


@dataclass(frozen=True)
class Limits:
    """What one file may hold; anything past a bound is a SpecError, never a crash or a swap."""

    max_bytes: int = 16 * MiB  # decompressed bytes of the whole file
    max_line_bytes: int = 4 * MiB  # one line of a JSONL or CSV file
    max_lines: int = 2_000_000  # lines of a JSONL or CSV file, blank ones included
    max_depth: int = 32  # nesting of objects and arrays
    max_items: int = 4_000_000  # values in one document (one JSONL line is one document)
    max_string: int = 1 << 16  # characters in one string or key


SPEC_LIMITS = Limits()
"""Specs, policies, calibrations, measurements, calibration runs."""
TRACE_LIMITS = Limits(max_bytes=64 * MiB, max_items=100_000)
"""Acceptance traces (spectune.trace/v1) and arrival traces: per line, 100k values."""

MAX_SPEC_FILE_BYTES = SPEC_LIMITS.max_bytes


class _Rejected:
    """A parsed number that breaks a bound; the walk reports it with its field path."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def _parse_float(text: str) -> Any:
    """TOML floats: 'nan' and 'inf' become a rejection the walk reports with the field."""
    x = float(text)
    return x if math.isfinite(x) else _Rejected(f"{text} is not a finite number")


def _parse_constant(text: str) -> Any:
    """JSON's NaN, Infinity and -Infinity (Python extensions, not JSON)."""
    return _Rejected(f"{text} is not a finite number")


def _field(path: list[str | int]) -> str:
    if not path:
        return "the document"
    head, *rest = path
    if len(rest) > 8:  # a hostile nesting: name where it starts and how deep it goes
        return f"field {head!r}" + "".join(f"[{k!r}]" for k in rest[:4]) + f"...({len(path)} deep)"
    return f"field {head!r}" + "".join(f"[{k!r}]" for k in rest)


def _scalar_problem(value: Any, limits: Limits) -> str | None:
    """Why a non-container value breaks the bounds, or None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{value!r} is not a finite number"
        return None if abs(value) <= MAX_ABS_FLOAT else f"{value!r} is out of range (|x| <= 1e30)"
    if isinstance(value, int):
        return None if abs(value) <= MAX_ABS_INT else "integer out of range (|x| <= 2**53)"
    if isinstance(value, str):
        n = len(value)
        return None if n <= limits.max_string else f"string over {limits.max_string} characters"
    if isinstance(value, _Rejected):
        return value.why
    return f"unsupported value of type {type(value).__name__}"


def check_values(obj: Any, where: str, limits: Limits = SPEC_LIMITS) -> Any:
    """Walk a parsed document (without recursion) and enforce `limits`: depth, number of values,
    string length, finite numbers in range. Returns `obj`; SpecError names `where` and the field."""
    if not isinstance(obj, dict | list):
        why = _scalar_problem(obj, limits)
        if why:
            raise SpecError(f"{where}: {why}")
        return obj
    count = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(obj, ())]
    while stack:
        container, path = stack.pop()
        if len(path) >= limits.max_depth:
            raise SpecError(
                f"{where}: {_field(list(path))}: nested too deeply (more than {limits.max_depth} levels)"
            )
        items = container.items() if isinstance(container, dict) else enumerate(container)
        count += len(container)
        if count > limits.max_items:
            raise SpecError(f"{where}: more than {limits.max_items} values")
        for key, value in items:
            if isinstance(value, dict | list):
                stack.append((value, (*path, key)))
                continue
            why = _scalar_problem(value, limits)
            if why is None and isinstance(key, str) and len(key) > limits.max_string:
                why = f"key over {limits.max_string} characters"
            if why:
                raise SpecError(f"{where}: {_field([*path, key])}: {why}")
        if isinstance(container, dict):
            for key in container:
                if not isinstance(key, str) or len(key) > limits.max_string:
                    raise SpecError(f"{where}: {_field(list(path))}: a key is not a short string")
    return obj


def loads_json(text: str | bytes, where: str, limits: Limits = SPEC_LIMITS) -> Any:
    """Parse one JSON document within `limits` (NaN, Infinity, 1e400 and giant integers are
    rejected with their field)."""
    try:
        obj = json.loads(text, parse_constant=_parse_constant)
    except RecursionError:
        raise SpecError(
            f"{where}: nested too deeply (more than {limits.max_depth} levels)"
        ) from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: not valid JSON: {e}") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise SpecError(f"{where}: not valid JSON: an integer out of range ({e})"[:300]) from None
    return check_values(obj, where, limits)


def loads_toml(text: str, where: str, limits: Limits = SPEC_LIMITS) -> dict[str, Any]:
    """Parse one TOML document within `limits`."""
    try:
        obj = tomllib.loads(text, parse_float=_parse_float)
    except RecursionError:
        raise SpecError(
            f"{where}: nested too deeply (more than {limits.max_depth} levels)"
        ) from None
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise SpecError(f"{where}: not valid TOML: {e}") from None
    return typing.cast(dict[str, Any], check_values(obj, where, limits))


def parse_document(name: str, data: bytes, limits: Limits = SPEC_LIMITS) -> dict[str, Any]:
    """A JSON or TOML document (by the suffix of `name`) given as bytes, as a dict."""
    if len(data) > limits.max_bytes:
        raise SpecError(f"{name}: {len(data)} bytes is over the {limits.max_bytes}-byte limit")
    suffix = Path(name).suffix.lower()
    if suffix == ".toml":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        doc: Any = loads_toml(text, name, limits)
    elif suffix == ".json":
        doc = loads_json(data, name, limits)
    else:
        raise SpecError(f"{name}: unsupported file type {suffix or '(none)'!r}; use .json or .toml")
    if not isinstance(doc, dict):
        raise SpecError(f"{name}: expected an object at the top level, got {type(doc).__name__}")
    return doc


# ---- bounded files ----------------------------------------------------------------------------
def _open_binary(p: Path) -> IO[bytes]:
    if not p.is_file():
        raise SpecError(f"{p}: no such file" if not p.exists() else f"{p}: not a regular file")
    try:
        fh: IO[bytes] = open(p, "rb")  # noqa: SIM115 - handed to the caller
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror or e}") from None
    if p.name.lower().endswith(".gz"):
        return typing.cast(IO[bytes], gzip.GzipFile(fileobj=fh, mode="rb"))
    return fh


_READ_ERRORS = (OSError, EOFError, zlib.error)
_CHUNK_BYTES = 1 << 20


def _read_error(p: Path, e: BaseException) -> SpecError:
    if isinstance(e, gzip.BadGzipFile | EOFError | zlib.error):
        return SpecError(f"{p}: not a valid gzip file ({e or 'truncated'})")
    return SpecError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}")


def read_bytes_bounded(path: str | os.PathLike[str], limits: Limits = SPEC_LIMITS) -> bytes:
    """The bytes of a file (decompressed for .gz, streamed), at most limits.max_bytes."""
    p = Path(path)
    fh = _open_binary(p)
    try:
        with fh:
            data = fh.read(limits.max_bytes + 1)
    except _READ_ERRORS as e:
        raise _read_error(p, e) from None
    if len(data) > limits.max_bytes:
        raise SpecError(
            f"{p}: more than {limits.max_bytes} bytes (decompressed); is it the right file?"
        )
    return data


def iter_lines(
    path: str | os.PathLike[str], limits: Limits = TRACE_LIMITS
) -> Iterator[tuple[int, str]]:
    """(line number from 1, text without the newline) of a text file, .gz streamed in chunks;
    SpecError past limits.max_bytes decompressed or limits.max_lines lines, at a line over
    limits.max_line_bytes, at bad gzip or UTF-8. Opening errors come on the first next()."""
    p = Path(path)
    fh = _open_binary(p)
    total = lineno = 0
    pending = b""
    with fh:
        while True:
            try:
                chunk = fh.read(_CHUNK_BYTES)
            except _READ_ERRORS as e:
                raise _read_error(p, e) from None
            total += len(chunk)
            if total > limits.max_bytes:
                raise SpecError(f"{p}: more than {limits.max_bytes} bytes (decompressed); split it")
            if not chunk:
                lines = [pending] if pending else []
            else:
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                if len(pending) > limits.max_line_bytes:
                    raise SpecError(
                        f"{p}:{lineno + len(lines) + 1}: line longer than {limits.max_line_bytes} bytes"
                    )
            if lineno + len(lines) > limits.max_lines:
                raise SpecError(f"{p}: more than {limits.max_lines} lines")
            for raw in lines:
                lineno += 1
                if len(raw) > limits.max_line_bytes:
                    raise SpecError(f"{p}:{lineno}: line longer than {limits.max_line_bytes} bytes")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SpecError(
                        f"{p}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})"
                    ) from None
                yield lineno, text
            if not chunk:
                return


def load_document(path: str | os.PathLike[str], limits: Limits = SPEC_LIMITS) -> dict[str, Any]:
    """A JSON or TOML file (by suffix) as a dict, read within `limits`."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise SpecError(f"{p}: unsupported file type {suffix or '(none)'!r}; use .json or .toml")
    return parse_document(str(p), read_bytes_bounded(p, limits), limits)


def help_field(default: Any = dataclasses.MISSING, *, help: str) -> Any:
    """A dataclass field with a one-line help string (the CLI and error messages read it)."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def read_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a JSON or TOML spec file (by suffix) into a dict, within SPEC_LIMITS; errors name
    the file, the field and the problem."""
    return load_document(path, SPEC_LIMITS)


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
        if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_ABS_INT:
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{where}: expected an integer, got {value!r}")
        if abs(value) > MAX_ABS_INT:
            raise SpecError(f"{where}: integer out of range (|x| <= 2**53), got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value) or abs(value) > MAX_ABS_FLOAT:
            raise SpecError(f"{where}: expected a finite number (|x| <= 1e30), got {value!r}")
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


def names_a_file(name: str) -> bool:
    """Whether `name` is read as a file path rather than a preset name (by load_spec; a
    document from elsewhere, e.g. an upload, must not make the reader open such a path)."""
    return name.lower().endswith((".json", ".toml")) or os.sep in name or "/" in name


def load_spec(
    cls: type[T], name_or_path: str | os.PathLike[str], presets: Mapping[str, T], kind: str
) -> T:
    """A preset name, or the path of a JSON/TOML file with the fields of dataclass `cls`."""
    s = str(name_or_path)
    if names_a_file(s):
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
    try:
        text = json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError as e:  # NaN or infinity: not JSON, and never what a reader expects
        raise SpecError(f"{path}: refusing to write a non-finite number ({e})") from None
    write_text_atomic(path, text + "\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically (write_bytes_atomic)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename). An
    existing file keeps its mode; a new one gets the usual 0666 & ~umask. On any failure the
    temp file is removed and `path` is untouched."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = p.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

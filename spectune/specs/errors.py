"""One error type for bad user input, so the CLI can turn it into a clear message and exit 2."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class SpecError(ValueError):
    """A spec, policy, trace or argument is malformed. The message says what, where and how to fix."""


def closest_names(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` entries of `choices` that look most like `name` (for 'did you mean' hints)."""
    choices = list(choices)
    low = name.lower()
    contains = [c for c in choices if low in c.lower() or c.lower() in low]
    similar = difflib.get_close_matches(low, choices, n=n, cutoff=0.4)
    return list(dict.fromkeys(contains + similar))[:n]


def unknown_name_error(kind: str, name: str, choices: Iterable[str]) -> SpecError:
    """The error for an unknown preset: names the closest presets and lists all of them."""
    choices = sorted(choices)
    near = closest_names(name, choices)
    hint = f" Did you mean {', '.join(repr(c) for c in near)}?" if near else ""
    return SpecError(
        f"unknown {kind} {name!r}.{hint} Known {kind} presets: {', '.join(choices)}; "
        f"or pass the path of a JSON/TOML file."
    )


_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^/\s]*@")
_QUERY_SECRET = re.compile(r"([?&;](?:password|passwd|pwd|secret|token|api_key)=)[^&;\s'\"]*", re.I)


def mask_secrets(text: str) -> str:
    """`text` with the passwords of URLs (scheme://user:PASSWORD@host) and secret query
    parameters (?password=...) replaced by ***, so messages and files never show them."""
    return _QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))

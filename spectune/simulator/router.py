"""Routing arriving requests over replicas: round-robin, or least outstanding (fewest requests
queued or running; ties go to the lowest index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from spectune.specs import SpecError

ROUTERS = ("rr", "least")


class Routable(Protocol):
    @property
    def outstanding(self) -> int: ...


class Router:
    def __init__(self, kind: str, replicas: Sequence[Routable]):
        if kind not in ROUTERS:
            raise SpecError(f"unknown router {kind!r}; use one of {', '.join(ROUTERS)}")
        self.kind = kind
        self.replicas = replicas
        self._next = 0

    def pick(self) -> int:
        """Index of the replica the next request goes to."""
        n = len(self.replicas)
        if n == 1:
            return 0
        if self.kind == "rr":
            i = self._next
            self._next = (i + 1) % n
            return i
        loads = [r.outstanding for r in self.replicas]
        return loads.index(min(loads))

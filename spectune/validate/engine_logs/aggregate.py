"""Merging the observations of one configuration, so a long log costs memory per configuration,
not per line.

A server that runs for days prints a decode or stats line every few seconds: hundreds of
thousands of observations that repeat a few dozen (configuration, batch size) pairs.
`aggregate` folds a stream of observations into one per group, keyed by file, format, process,
stated configuration, batch size and concurrency (and whether it speculates), holding one
accumulator per group:

- throughput, accept rate: the mean over the group's observations (each a logging interval of
  the same length, or a benchmark run);
- accept length and per-position rates: weighted by drafts where the observations count them,
  else the plain mean;
- draft, accepted and emitted token counts, drafts, completed requests: summed;
- SGLang's `#token` (KV tokens of the running requests): the mean, kept in `extra`;
- everything else: the group's first observation (its file and line name the merged record),
  with ("intervals", n) added to `extra`.

Groups are emitted in the order their first observation arrived.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from spectune.validate.engine_logs.base import EngineObservation


@dataclass
class _Group:
    first: EngineObservation
    n: int = 0
    tps: list[float] = field(default_factory=lambda: [0.0, 0.0])  # sum, count
    rate: list[float] = field(default_factory=lambda: [0.0, 0.0])
    length: list[float] = field(default_factory=lambda: [0.0, 0.0])  # weighted sum, weight
    pos: list[float] = field(default_factory=list)  # weighted sums per position
    pos_w: list[float] = field(default_factory=list)
    kv: list[float] = field(default_factory=lambda: [0.0, 0.0])
    sums: dict[str, int] = field(default_factory=dict)

    def add(self, o: EngineObservation) -> None:
        self.n += 1
        w = float(o.drafts or o.draft_tokens or 1)
        if o.gen_tokens_per_s is not None:
            self.tps[0] += o.gen_tokens_per_s
            self.tps[1] += 1
        if o.accept_rate is not None:
            self.rate[0] += o.accept_rate
            self.rate[1] += 1
        if o.accept_length is not None:
            self.length[0] += w * o.accept_length
            self.length[1] += w
        for i, a in enumerate(o.per_position_accept):
            if i == len(self.pos):
                self.pos.append(0.0)
                self.pos_w.append(0.0)
            self.pos[i] += w * a
            self.pos_w[i] += w
        kv = dict(o.extra).get("#token")
        if kv is not None and kv.isdigit():
            self.kv[0] += float(kv)
            self.kv[1] += 1
        for name in ("drafts", "draft_tokens", "accepted_tokens", "emitted_tokens", "completed"):
            v = getattr(o, name)
            if v is not None:
                self.sums[name] = self.sums.get(name, 0) + int(v)

    def merged(self) -> EngineObservation:
        if self.n == 1:
            return self.first
        extra = [(k, v) for k, v in self.first.extra if k != "#token"]
        if self.kv[1]:
            extra.append(("#token", str(round(self.kv[0] / self.kv[1]))))
        extra.append(("intervals", str(self.n)))
        return replace(
            self.first,
            gen_tokens_per_s=self.tps[0] / self.tps[1] if self.tps[1] else None,
            accept_rate=self.rate[0] / self.rate[1] if self.rate[1] else None,
            accept_length=self.length[0] / self.length[1] if self.length[1] else None,
            per_position_accept=tuple(s / w for s, w in zip(self.pos, self.pos_w, strict=True)),
            extra=tuple(extra),
            **{k: self.sums.get(k) for k in self.sums},  # type: ignore[arg-type]
        )


def aggregate(observations: Iterable[EngineObservation]) -> list[EngineObservation]:
    """One observation per (file, format, process, configuration, batch, concurrency,
    speculating) group of `observations`, consumed as a stream (module docstring)."""
    groups: dict[tuple[object, ...], _Group] = {}
    for o in observations:
        key = (o.file, o.format, o.process, o.config, o.batch, o.concurrency, o.speculative)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(o)
        g.add(o)
    return [g.merged() for g in groups.values()]

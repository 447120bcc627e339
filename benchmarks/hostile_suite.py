"""Hostile-input suite: every `spectune` subcommand fed what a careless or hostile user would give
it (malformed, deeply nested, huge or non-finite documents; gzip bombs, truncated and garbage
gzip; out-of-range and non-finite option values; output paths that cannot be written; secrets
in storage URLs), each case run as its own subprocess.

Per case it records the exit code, whether stderr holds a Python traceback, whether the error
is one line (spectune's warning lines aside) naming the file, field or option at fault, whether
a secret leaked, the wall time, and the peak RSS of the child (os.wait4's rusage, i.e.
resource.getrusage of that child). A case passes when it exits 2 with such a line, no
traceback, no secret, and a peak RSS at most --limit-mb above the baseline (`spectune presets`,
which imports every subcommand). GPU-only commands (execute, calibrate without --from-run) must
fail the same way on a machine without a GPU.

    python benchmarks/hostile_suite.py [--jobs 2] [--only TEXT] [--limit-mb 256] [--failures]

Prints a table per subcommand, the failing cases, and one JSON line last.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECRET = "hunter2-s3cret"
TRACEBACK = "Traceback (most recent call last)"
TORCH_COMMANDS = ("execute", "calibrate", "record-traces")
"""Commands that import torch to look for a GPU: their baseline is `import torch`'s."""
MiB = 1 << 20
BOMB_BYTES = 256 * MiB  # decompressed size of each gzip bomb (4x the trace readers' limit)


@dataclass(frozen=True)
class Case:
    """One hostile invocation: `spectune <argv>`; the error must name one of `names`."""

    name: str
    argv: tuple[str, ...]
    names: tuple[str, ...]
    timeout_s: float = 180.0

    @property
    def command(self) -> str:
        return self.argv[0]


@dataclass
class Outcome:
    case: str
    command: str
    rc: int
    traceback: bool
    one_line: bool
    named: bool
    leaked: bool
    rss_mb: float
    wall_s: float
    timed_out: bool
    message: str
    passed: bool = False
    why: list[str] = field(default_factory=list)
    above_mb: float = 0.0  # peak RSS above the command's baseline


# ---- fixtures ---------------------------------------------------------------------------------
class Files:
    """Writes the hostile files under one temporary folder and names them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.outputs = root / "outputs"
        self.outputs.mkdir(parents=True, exist_ok=True)

    def out(self, name: str) -> str:
        """An output path no case may leave a file at (every case fails)."""
        return str(self.outputs / name)

    def text(self, name: str, text: str) -> str:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        return str(p)

    def raw(self, name: str, data: bytes) -> str:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return str(p)

    def json(self, name: str, obj: Any) -> str:
        return self.text(name, json.dumps(obj))

    def gz(self, name: str, data: bytes) -> str:
        return self.raw(name, gzip.compress(data))

    def bomb(self, name: str, unit: bytes, total: int = BOMB_BYTES, head: bytes = b"") -> str:
        """A gzip file of `head` then `unit` repeated to `total` decompressed bytes."""
        p = self.root / name
        reps = max(1, (1 << 20) // len(unit))
        chunk = unit * reps
        with gzip.open(p, "wb", compresslevel=6) as fh:
            fh.write(head)
            written = 0
            while written < total:
                fh.write(chunk)
                written += len(chunk)
        return str(p)

    def folder(self, name: str, files: dict[str, Any]) -> str:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        for fname, content in files.items():
            if isinstance(content, bytes):
                (d / fname).write_bytes(content)
            elif isinstance(content, str):
                (d / fname).write_text(content)
            else:
                (d / fname).write_text(json.dumps(content))
        return str(d)


def _raw_json(obj: dict[str, Any], key: str, literal: str) -> str:
    """json.dumps(obj) with obj[key] written as `literal` (e.g. NaN, 1e400, a 400-digit int)."""
    marker = "__HOSTILE__"
    return json.dumps({**obj, key: marker}).replace(f'"{marker}"', literal)


DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "9" * 400


def spec_variants(base: dict[str, Any], num: str, pos: str, required: str) -> dict[str, str]:
    """name -> JSON/TOML text of a spec with one hostile change; `num` names a numeric field,
    `pos` a field that must be positive, `required` one without a default."""
    out = {
        "deep.json": json.dumps(base)[:-1] + f', "x": {DEEP}}}',
        "deep-value.json": _raw_json(base, num, DEEP),
        "hugeint.json": _raw_json(base, num, HUGE_INT),
        "bigfloat.json": _raw_json(base, num, "1e400"),
        "nan.json": _raw_json(base, num, "NaN"),
        "inf.json": _raw_json(base, num, "Infinity"),
        "neginf.json": _raw_json(base, num, "-Infinity"),
        "negative.json": _raw_json(base, pos, "-1"),
        "zero.json": _raw_json(base, pos, "0"),
        "tiny.json": _raw_json(base, pos, "1e-300"),
        "huge.json": _raw_json(base, pos, "1e29"),
        "string.json": _raw_json(base, num, '"fast"'),
        "list.json": _raw_json(base, num, "[1, 2]"),
        "longstring.json": _raw_json(base, "name", json.dumps("x" * 100_000)),
        "unknown.json": json.dumps({**base, "warp_factor": 9}),
        "missing.json": json.dumps({k: v for k, v in base.items() if k != required}),
        "array.json": "[1, 2, 3]",
        "scalar.json": '"h100"',
        "empty.json": "",
        "truncated.json": json.dumps(base)[: len(json.dumps(base)) // 2],
        "nan.toml": f'name = "x"\n{num} = nan\n',
        "deep.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n",
        "hugeint.toml": f'name = "x"\n{num} = {HUGE_INT}\n',
        "bad.toml": "name = \n",
    }
    if not required:
        del out["missing.json"]
    return out


def policy_doc() -> dict[str, Any]:
    return json.loads((ROOT / "measurements" / "h200" / "policy-planned.json").read_text())


def measurement_doc() -> dict[str, Any]:
    return json.loads((ROOT / "measurements" / "h200" / "execute-static.json").read_text())


def calibration_run_doc() -> dict[str, Any]:
    return json.loads((ROOT / "measurements" / "h200" / "calibrate-run.json").read_text())


def trace_lines(n: int = 40) -> list[str]:
    with gzip.open(ROOT / "data" / "traces" / "smollm2-mtbench.jsonl.gz", "rt") as fh:
        return [next(fh) for _ in range(n)]


# ---- cases ------------------------------------------------------------------------------------
def spec_cases(f: Files) -> Iterator[Case]:
    from spectune.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS
    from spectune.specs.calibration import Calibration

    def plain(obj: Any) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(obj)))

    kinds = {  # base document, a numeric field, a positive field, a required field
        "gpu": (
            plain(HARDWARE_PRESETS["h100-sxm"]),
            "hbm_bytes_per_s",
            "hbm_bytes_per_s",
            "sm_count",
        ),
        "model": (plain(MODEL_PRESETS["llama-3.1-8b"]), "hidden", "layers", "vocab"),
        "workload": (
            plain(WORKLOAD_PRESETS["mt-bench"]),
            "temperature",
            "output_len_mean_tokens",
            "name",
        ),
        "calibration": (
            {"schema": "spectune.calibration/v1", **plain(Calibration())},
            "step_overhead_s",
            "gemm_tile_m",
            "",  # every field has a default
        ),
    }
    uses = {
        "gpu": [("cost", "--gpu"), ("simulate", "--gpu"), ("plan", "--gpu")],
        "model": [
            ("cost", "--target"),
            ("simulate", "--drafter"),
            ("plan", "--target"),
            ("cost", "--intermediate"),
        ],
        "workload": [("tree", "--workload"), ("simulate", "--workload"), ("plan", "--workload")],
        "calibration": [("cost", "--calibration"), ("plan", "--calibration")],
    }
    for kind, (base, num, pos, required) in kinds.items():
        variants = spec_variants(base, num, pos, required)
        paths = {v: f.text(f"spec-{kind}/{v}", text) for v, text in variants.items()}
        paths["binary.json"] = f.raw(f"spec-{kind}/binary.json", os.urandom(4096))
        paths["folder.json"] = str(f.root / f"spec-{kind}" / "folder.json")
        (f.root / f"spec-{kind}" / "folder.json").mkdir(exist_ok=True)
        paths["missing-file.json"] = str(f.root / f"spec-{kind}" / "nope.json")
        paths["spec.yaml"] = f.text(f"spec-{kind}/spec.yaml", "name: x\n")
        for variant, path in paths.items():
            for cmd, opt in uses[kind]:
                extra = ["--trials", "2", "--quiet", "--out", f.out("unused.json")]
                argv = [cmd, opt, path, *(extra if cmd == "plan" else [])]
                if cmd == "simulate":
                    argv += ["--requests", "5", "--quiet"]
                # a spec that is fine by the reader but wrong where it is used names the field
                yield Case(f"{cmd} {opt} {kind}/{variant}", tuple(argv), (Path(path).name,))


def policy_cases(f: Files) -> Iterator[Case]:
    base = policy_doc()
    b0 = base["buckets"][0]
    pol = b0["policy"] or {"builder": "static", "depth": 3, "topk": 2, "budget": 4}

    def with_bucket(**change: Any) -> dict[str, Any]:
        b = {**b0, **change}
        return {**base, "buckets": [b, *base["buckets"][1:]]}

    texts = {
        "deep.json": json.dumps(base)[:-1] + f', "x": {DEEP}}}',
        "nan-predicted.json": json.dumps(
            with_bucket(predicted={"tokens_per_s": 1.0, "speedup": 1.0, "accepted_len": 1.0})
        ).replace('"speedup": 1.0', '"speedup": NaN', 1),
        "hugeint-batch.json": json.dumps(with_bucket(batch=[1, 7])).replace(
            "[1, 7]", f"[1, {HUGE_INT}]", 1
        ),
        "huge-budget.json": json.dumps(with_bucket(policy={**pol, "budget": 7777})).replace(
            "7777", HUGE_INT
        ),
        "string-depth.json": json.dumps(with_bucket(policy={**pol, "depth": "5"})),
        "extra-key.json": json.dumps(with_bucket(policy={**pol, "warp": 1})),
        "nan-prune.json": json.dumps(with_bucket(policy={**pol, "prune_threshold": 0.5})).replace(
            '"prune_threshold": 0.5', '"prune_threshold": NaN', 1
        ),
        "no-buckets.json": json.dumps({**base, "buckets": []}),
        "buckets-string.json": json.dumps({**base, "buckets": "all"}),
        "target-list.json": json.dumps({**base, "target": ["a"]}),
        "wrong-schema.json": json.dumps({**base, "schema": "nope/v9"}),
        "array.json": "[]",
        "empty.json": "",
        "reversed-range.json": json.dumps(with_bucket(batch=[9, 1])),
    }
    paths = {v: f.text(f"policy/{v}", t) for v, t in texts.items()}
    paths["binary.json"] = f.raw("policy/binary.json", os.urandom(2048))
    for variant, path in paths.items():
        name = (Path(path).name,)
        yield Case(
            f"simulate --policy {variant}",
            ("simulate", "--policy", path, "--requests", "5", "--quiet"),
            name,
        )
        yield Case(
            f"export {variant}",
            ("export", path, "--engine", "sglang", "--out", f.out("export-unused")),
            name,
        )
        yield Case(
            f"execute --policy {variant}",
            ("execute", "--policy", path, "--out", f.out("unused-m.json")),
            name,
        )


def trace_cases(f: Files) -> Iterator[Case]:
    lines = trace_lines()
    header, steps = lines[0], lines[1:]
    step = json.loads(steps[0])

    def with_step(**change: Any) -> str:
        return header + json.dumps({**step, **change}) + "\n"

    t = {
        "truncated.jsonl.gz": gzip.compress("".join(lines).encode())[:-200],
        "garbage.jsonl.gz": b"\x1f\x8b\x08\x00" + os.urandom(4000),
        "not-gzip.jsonl.gz": b"plain text, not gzip\n",
        "binary-in-gzip.jsonl.gz": gzip.compress(os.urandom(8000)),
        "binary.jsonl": os.urandom(8000),
        "deep-header.jsonl": (DEEP + "\n").encode(),
        "hugeint-token.jsonl": with_step(tokens=[0] * len(step["tokens"]))
        .replace('"tokens": [0', f'"tokens": [{HUGE_INT}', 1)
        .encode(),
        "big-matchlen.jsonl": with_step(match_len=[2**40] * len(step["match_len"])).encode(),
        "nan-logprob.jsonl": with_step(logprobs=[-0.5] * len(step["logprobs"]))
        .replace("-0.5", "NaN", 1)
        .encode(),
        "string-step.jsonl": with_step(step="three").encode(),
        "empty.jsonl": b"",
        "header-only.jsonl": header.encode(),
        "wrong-schema.jsonl": (json.dumps({"schema": "other/v1"}) + "\n").encode(),
        "array-line.jsonl": (header + "[1, 2, 3]\n").encode(),
        "huge-parents.jsonl": with_step(parents=[-1, *([0] * 200_000)]).encode(),
        "longline.jsonl": (header + "[" + "1," * (3 * MiB) + "1]\n").encode(),
    }
    paths = {v: f.raw(f"trace/{v}", data) for v, data in t.items()}
    paths["bomb.jsonl.gz"] = f.bomb("trace/bomb.jsonl.gz", steps[0].encode(), head=header.encode())
    paths["zero-bomb.jsonl.gz"] = f.bomb("trace/zero-bomb.jsonl.gz", b"\0" * 4096)
    paths["newline-bomb.jsonl.gz"] = f.bomb(
        "trace/newline-bomb.jsonl.gz", b"\n" * 4096, head=header.encode()
    )
    paths["missing.jsonl"] = str(f.root / "trace" / "nope.jsonl")
    for variant, path in paths.items():
        name = (Path(path).name,)
        yield Case(
            f"fit-workload {variant}", ("fit-workload", path, "--out", f.out("unused-w.json")), name
        )
        yield Case(
            f"execute --acceptance-trace {variant}",
            (
                "execute",
                "--policy",
                "dynamic-topk:5,4,8",
                "--acceptance-trace",
                path,
                "--out",
                f.out("unused-m.json"),
            ),
            name,
        )


def arrival_cases(f: Files) -> Iterator[Case]:
    head = "arrival_s,prompt_tokens,output_tokens\n"
    t = {
        "truncated.csv.gz": gzip.compress((head + "0.1,10,10\n" * 1000).encode())[:-100],
        "garbage.csv.gz": b"\x1f\x8b\x08\x00" + os.urandom(4000),
        "not-gzip.csv.gz": b"arrival_s,prompt_tokens,output_tokens\n",
        "binary.csv": os.urandom(4000),
        "nan.csv": (head + "0.1,10,10\nnan,10,10\n").encode(),
        "inf.csv": (head + "0.1,10,inf\n").encode(),
        "bigfloat.csv": (head + "1e400,10,10\n").encode(),
        "hugeint.csv": (head + f"0.1,{HUGE_INT},10\n").encode(),
        "negative.csv": (head + "-5,10,10\n").encode(),
        "zero-tokens.csv": (head + "0.1,0,10\n").encode(),
        "fraction-tokens.csv": (head + "0.1,10.5,10\n").encode(),
        "no-column.csv": b"time,foo\n1,2\n",
        "ragged.csv": (head + "0.1,10\n").encode(),
        "empty.csv": b"",
        "header-only.csv": head.encode(),
        "longline.csv": (head + "1" * (5 * MiB) + "\n").encode(),
        "deep.jsonl": (DEEP + "\n").encode(),
        "array-line.jsonl": b"[1, 2, 3]\n",
        "nan.jsonl": b'{"arrival_s": NaN, "prompt_tokens": 10, "output_tokens": 10}\n',
        "hugeint.jsonl": (
            '{"arrival_s": 0, "prompt_tokens": ' + HUGE_INT + ', "output_tokens": 10}\n'
        ).encode(),
        "string-cell.jsonl": b'{"arrival_s": "soon", "prompt_tokens": 10, "output_tokens": 10}\n',
        "trace.txt": (head + "0.1,10,10\n").encode(),
    }
    paths = {v: f.raw(f"arrivals/{v}", data) for v, data in t.items()}
    paths["bomb.csv.gz"] = f.bomb("arrivals/bomb.csv.gz", b"0.5,100,100\n", head=head.encode())
    paths["bomb.jsonl.gz"] = f.bomb(
        "arrivals/bomb.jsonl.gz",
        b'{"arrival_s": 0.5, "prompt_tokens": 100, "output_tokens": 100}\n',
    )
    paths["zero-bomb.csv.gz"] = f.bomb(
        "arrivals/zero-bomb.csv.gz", b"\0" * 4096, head=head.encode()
    )
    paths["rows.csv"] = f.raw("arrivals/rows.csv", (head + "0.5,9,9\n" * 1_000_001).encode())
    paths["missing.csv"] = str(f.root / "arrivals" / "nope.csv")
    for variant, path in paths.items():
        yield Case(
            f"simulate --trace {variant}",
            ("simulate", "--trace", path, "--quiet"),
            (Path(path).name,),
        )


def check_cases(f: Files) -> Iterator[Case]:
    m = measurement_doc()
    run0 = m["runs"][1]
    cal = calibration_run_doc()

    def runs(change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        return {**m, "runs": [change(dict(r)) for r in m["runs"]]}

    docs: dict[str, Any] = {
        "nan-speedups": json.dumps(runs(lambda r: {**r, "speedup": 1.5})).replace(
            '"speedup": 1.5', '"speedup": NaN', 11
        ),
        "no-runs": {**m, "runs": []},
        "no-hardware": {k: v for k, v in m.items() if k != "hardware"},
        "zero-speedup": runs(lambda r: {**r, "speedup": 0}),
        "zero-step": runs(lambda r: {**r, "phases_ms": {**r["phases_ms"], "step": 0}}),
        "inf-ar-step": json.dumps(runs(lambda r: {**r, "ar_step_ms": 1.25})).replace(
            "1.25", "Infinity"
        ),
        "bad-policy-key": runs(
            lambda r: {**r, "policy": {**(r["policy"] or run0["policy"]), "warp": 1}}
        ),
        "policy-string": runs(lambda r: {**r, "policy": "fast"}),
        "negative-batch": runs(lambda r: {**r, "batch": -4}),
        "context-string": {**m, "context": "4k"},
        "no-phases": runs(lambda r: {k: v for k, v in r.items() if k != "phases_ms"}),
        "deep": json.dumps(m)[:-1] + f', "x": {DEEP}}}',
        "hugeint": json.dumps(m).replace('"context": 4096', f'"context": {HUGE_INT}'),
        "binary": os.urandom(3000),
        "zero-seconds-run": {**cal, "verify": [{**cal["verify"][0], "seconds": 0}]},
        "missing-seconds-run": {**cal, "verify": [{"batch": 1, "tokens": 1, "context": 1}]},
        "run-no-rows": {**cal, "verify": [], "gemm": []},
        "bad-calibration": {
            "schema": "spectune.calibration/v1",
            "hardware": "h200",
            "launch_s": "fast",
        },
    }
    for variant, doc in docs.items():
        folder = f.folder(f"check/{variant}", {f"{variant}.json": doc})
        yield Case(f"check {variant}", ("check", folder), (f"{variant}.json",))
    empty = f.folder("check/empty", {})
    yield Case("check empty folder", ("check", empty), ("empty",))
    yield Case("check missing folder", ("check", str(f.root / "check" / "nope")), ("nope",))
    yield Case("check a file", ("check", f.text("check/file.json", "{}")), ("file.json",))


def calibrate_cases(f: Files) -> Iterator[Case]:
    cal = calibration_run_doc()
    m = measurement_doc()
    out = f.out("unused-cal.json")
    docs: dict[str, Any] = {
        "binary.json": os.urandom(2000),
        "wrong-schema.json": {**cal, "schema": "spectune.measurement/v1"},
        "array.json": [cal],
        "deep.json": DEEP,
        "nan.json": json.dumps(cal).replace(str(cal["verify"][0]["seconds"]), "NaN", 1),
        "no-rows.json": {**cal, "verify": [], "gemm": []},
        "zero-seconds.json": {**cal, "verify": [{**r, "seconds": 0.0} for r in cal["verify"]]},
        "string-batch.json": {**cal, "verify": [{**cal["verify"][0], "batch": "one"}]},
        "no-hardware.json": {k: v for k, v in cal.items() if k != "hardware"},
        "hugeint.json": json.dumps(cal).replace('"batch": 1', f'"batch": {HUGE_INT}', 1),
    }
    for variant, doc in docs.items():
        if isinstance(doc, bytes):
            path = f.raw(f"calibrate/{variant}", doc)
        elif isinstance(doc, str):
            path = f.text(f"calibrate/{variant}", doc)
        else:
            path = f.json(f"calibrate/{variant}", doc)
        yield Case(
            f"calibrate --from-run {variant}",
            ("calibrate", "--from-run", path, "--out", out),
            (variant,),
        )
    good = f.json("calibrate/good-run.json", cal)
    bad_m = f.text(
        "calibrate/nan-measurement.json",
        json.dumps(m).replace(str(m["runs"][0]["speedup"]), "NaN", 1),
    )
    yield Case(
        "calibrate --measurements nan",
        ("calibrate", "--from-run", good, "--measurements", bad_m, "--out", out),
        ("nan-measurement.json",),
    )
    empty_runs = f.json("calibrate/no-runs-measurement.json", {**m, "runs": []})
    yield Case(
        "calibrate --measurements no runs",
        ("calibrate", "--from-run", good, "--measurements", empty_runs, "--out", out),
        ("no-runs-measurement.json",),
    )
    yield Case(
        "calibrate --from-run missing",
        ("calibrate", "--from-run", str(f.root / "nope.json"), "--out", out),
        ("nope.json",),
    )


FIT_ENGINE = ("engine.log", "--engine", "vllm", "--target", "llama-3.1-8b", "--drafter", "none",
              "--gpu", "h100-sxm", "--out", "OUT")  # fmt: skip
# Options with a numeric range: (command, option, kind, lo, hi, argv prefix that makes the rest valid)
NUMERIC: list[tuple[str, str, str, float, float, tuple[str, ...]]] = [
    ("plan", "--tp", "int", 1, 64, ()),
    ("plan", "--slo-tpot-ms", "float+", 0, 1e7, ()),
    ("plan", "--slo-ttft-ms", "float+", 0, 1e7, ()),
    ("plan", "--trials", "int", 1, 100_000, ()),
    ("plan", "--seed", "int", 0, 2**32 - 1, ()),
    ("plan", "--min-gain", "float", 0, 10, ()),
    ("plan", "--workers", "int", 0, 256, ()),
    ("plan", "--max-step-ms", "float+", 0, 1e7, ()),
    ("plan", "--batch-edges", "ints", 1, 1 << 16, ()),
    ("plan", "--context-edges", "ints", 1, 1 << 24, ()),
    ("plan", "--heartbeat-s", "int", 1, 3600, ()),
    ("worker", "--heartbeat-s", "int", 1, 3600, ("--study", "x")),
    ("simulate", "--tp", "int", 1, 64, ()),
    ("simulate", "--qps", "floats+", 0, 1e6, ()),
    ("simulate", "--concurrency", "ints", 1, 100_000, ()),
    ("simulate", "--burstiness", "float+", 0, 100, ()),
    ("simulate", "--requests", "int", 1, 50_000, ()),
    ("simulate", "--think-ms", "float", 0, 8.64e7, ()),
    ("simulate", "--replicas", "int", 1, 1024, ()),
    ("simulate", "--max-batch", "int", 1, 1 << 16, ()),
    ("simulate", "--max-batch-tokens", "int", 1, 1 << 24, ()),
    ("simulate", "--slo-ttft-ms", "float+", 0, 1e7, ()),
    ("simulate", "--slo-tpot-ms", "float+", 0, 1e7, ()),
    ("simulate", "--seed", "int", 0, 2**32 - 1, ()),
    ("capacity", "--tp", "int", 1, 64, ()),
    ("capacity", "--slo-ttft-ms", "float+", 0, 1e7, ()),
    ("capacity", "--slo-tpot-ms", "float+", 0, 1e7, ()),
    ("capacity", "--requests", "int", 1, 50_000, ()),
    ("capacity", "--start-qps", "float+", 0, 1e6, ()),
    ("capacity", "--max-qps", "float+", 0, 1e6, ()),
    ("capacity", "--tolerance", "float+", 0, 0.5, ()),
    ("capacity", "--replicas", "int", 1, 1024, ()),
    ("capacity", "--max-batch", "int", 1, 1 << 16, ()),
    ("capacity", "--seed", "int", 0, 2**32 - 1, ()),
    ("cost", "--tp", "int", 1, 64, ()),
    ("cost", "--batch", "ints", 1, 1 << 16, ()),
    ("cost", "--tokens", "ints", 1, 1 << 16, ()),
    ("cost", "--context", "ints", 0, 1 << 24, ()),
    ("tree", "--budget", "int", 2, 1024, ()),
    ("tree", "--depth", "int", 1, 64, ()),
    ("tree", "--topk", "int", 1, 64, ()),
    ("tree", "--prune-threshold", "float", 0, 0.999999, ()),
    ("tree", "--graft-budget", "int", 0, 1024, ()),
    ("tree", "--seed", "int", 0, 2**32 - 1, ()),
    ("tree", "--chain", "int", 1, 64, ()),
    ("tree", "--accept", "floats", 0, 1, ()),
    ("export", "--context", "int", 0, 1 << 24, ("POLICY", "--engine", "sglang")),
    ("execute", "--batch", "ints", 1, 4096, ("--policy", "off")),
    ("execute", "--context", "int", 1, 1 << 20, ("--policy", "off")),
    ("execute", "--steps", "int", 1, 100_000, ("--policy", "off")),
    ("execute", "--warmup", "int", 0, 100_000, ("--policy", "off")),
    ("execute", "--tp", "int", 1, 64, ("--policy", "off")),
    ("calibrate", "--batch", "ints", 1, 4096, ("--out", "OUT")),
    ("calibrate", "--tokens", "ints", 1, 1024, ("--out", "OUT")),
    ("calibrate", "--context", "ints", 1, 1 << 20, ("--out", "OUT")),
    ("calibrate", "--tp", "int", 1, 64, ("--out", "OUT")),
    ("execute", "--repeat", "int", 1, 50, ("--policy", "off")),
    ("calibrate", "--spec-steps", "int", 1, 10_000, ("--out", "OUT")),
    ("calibrate", "--spec-batches", "ints", 1, 4096, ("--out", "OUT")),
    ("check", "--speedup-tol", "float", 0, 10, ()),
    ("check", "--mape-tol", "float", 0, 10, ()),
    ("check", "--engine-tol", "float", 0, 10, ()),
    ("check", "--accept-tol", "float", 0, 10, ()),
    ("fit-engine", "--tp", "int", 1, 64, FIT_ENGINE),
    ("fit-engine", "--batch", "int", 1, 1 << 20, FIT_ENGINE),
    ("fit-engine", "--input-len", "int", 1, 1 << 24, FIT_ENGINE),
    ("fit-engine", "--output-len", "int", 1, 1 << 24, FIT_ENGINE),
    ("fit-workload", "--folds", "int", 0, 100, ("TRACE", "--out", "OUT")),
    ("fit-workload", "--budgets", "ints", 2, 1024, ("TRACE", "--out", "OUT")),
    ("record-traces", "--count", "int", 1, 100_000, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--stride", "int", 1, 100_000, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--skip", "int", 0, 100_000, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--new-tokens", "int", 1, 4096, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--exit-layer", "int", 1, 30, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--max-depth", "int", 1, 64, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--max-topk", "int", 1, 64, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--pool-size", "int", 2, 1024, ("mt-bench", "--out", "OUT")),
    ("record-traces", "--deadline-s", "float+", 0, 1e7, ("mt-bench", "--out", "OUT")),
    ("dashboard", "--port", "int", 1, 65535, ()),
]


def bad_values(kind: str, lo: float, hi: float) -> list[str]:
    """Values outside an option's range: non-finite, just outside, absurd, not a number."""
    vals = ["nan", "inf", "abc", ""]
    integer = kind.startswith("int")
    below = lo - 1 if integer else (lo if kind.endswith("+") else lo - 1e-3)
    above = hi + 1 if integer else hi * 2 + 1
    vals += [
        str(int(below)) if integer else repr(below),
        str(int(above)) if integer else repr(above),
    ]
    vals.append(HUGE_INT if integer else "1e400")
    if integer:
        vals.append("2.5")
    if kind in ("ints", "floats", "floats+"):
        vals += [f"1,{vals[0]}", ",".join(["1"] * 65)]
    return vals


def numeric_cases(f: Files) -> Iterator[Case]:
    policy = f.json("numeric/policy.json", policy_doc())
    trace = f.text("numeric/trace.jsonl", "".join(trace_lines()))
    subst = {"POLICY": policy, "TRACE": trace, "OUT": f.out("unused.json")}
    for cmd, opt, kind, lo, hi, prefix in NUMERIC:
        pre = [subst.get(a, a) for a in prefix]
        for v in bad_values(kind, lo, hi):
            yield Case(f"{cmd} {opt} {v[:24]!r}", (cmd, *pre, f"{opt}={v}"), (opt,))


def length_cases(f: Files) -> Iterator[Case]:
    for opt in ("--prompt-tokens", "--output-tokens"):
        for v in (
            "100~nan",
            "100~inf",
            "nan",
            "inf~1",
            "-5",
            "0",
            HUGE_INT,
            "1e400~1",
            "abc",
            "100~-1",
            "100~1e9",
        ):
            yield Case(
                f"simulate {opt} {v[:16]}",
                ("simulate", f"{opt}={v}", "--requests", "5", "--quiet"),
                (v[:10], "length", "mean", "coefficient"),
            )
    for pol in (
        "dynamic-topk:5,4,8,nan",
        "dynamic-topk:5,4,8,inf",
        f"static:5,4,{HUGE_INT}",
        "dynamic-topk:5,4,8,0.1,9999",
        "static:5,4",
        "dynamic-topk:-1,4,8",
        "tree:5,4,8",
    ):
        yield Case(
            f"simulate --policy {pol[:24]}",
            ("simulate", "--policy", pol, "--requests", "5", "--quiet"),
            ("policy", "field", pol[:9]),
        )
    yield Case(
        "simulate --lengths bogus",
        ("simulate", "--lengths", "bogus", "--requests", "5"),
        ("bogus",),
    )
    yield Case(
        "simulate drafter none with policy",
        ("simulate", "--drafter", "none", "--requests", "5"),
        ("drafter",),
    )
    yield Case("tree --accept sums past 1", ("tree", "--accept", "0.9,0.9"), ("--accept",))
    yield Case("tree --builder unknown", ("tree", "--builder", "magic"), ("--builder",))
    yield Case(
        "tree graft past budget",
        ("tree", "--budget", "4", "--graft-budget", "9"),
        ("graft_budget",),
    )
    yield Case(
        "execute bad --also",
        ("execute", "--policy", "off", "--also", "static:1", "--out", f.out("u.json")),
        ("static:1",),
    )
    yield Case(
        "execute without a GPU",
        ("execute", "--policy", "dynamic-topk:5,4,8", "--batch", "1", "--out", f.out("u.json")),
        ("GPU", "CUDA"),
    )
    yield Case("calibrate without a GPU", ("calibrate", "--out", f.out("u.json")), ("GPU", "CUDA"))
    yield Case("export unknown engine", ("export", "x.json", "--engine", "tgi"), ("--engine",))
    yield Case("cost unknown gpu", ("cost", "--gpu", "h100"), ("h100",))
    yield Case("cost long preset name", ("cost", "--gpu", "x" * 5000), ("GPU",))
    yield Case("plan unknown objective", ("plan", "--objective", "speed"), ("--objective",))


def out_cases(f: Files) -> Iterator[Case]:
    folder = f.root / "out" / "a-folder"
    folder.mkdir(parents=True, exist_ok=True)
    a_file = f.text("out/a-file.txt", "x")
    bad_files = {
        "folder": str(folder),
        "under-a-file": a_file + "/out.json",
        "long-name": str(f.root / "out" / ("n" * 300 + ".json")),
        "empty": "",
        "sysfs": "/sys/spectune-hostile.json",
        "procfs": "/proc/spectune-hostile.json",
    }
    bad_folders = {
        "a-file": a_file,
        "under-a-file": a_file + "/x",
        "long-name": bad_files["long-name"],
        "empty": "",
        "sysfs": "/sys/spectune-export",
    }
    trace = f.text("out/trace.jsonl", "".join(trace_lines()))
    policy = f.json("out/policy.json", policy_doc())
    run = f.json("out/run.json", calibration_run_doc())
    for what, path in bad_files.items():
        names = ("--out", "--chrome-trace", "--raw-out", "--samples")
        yield Case(f"plan --out {what}", ("plan", "--trials", "2", "--quiet", "--out", path), names)
        yield Case(f"execute --out {what}", ("execute", "--policy", "off", "--out", path), names)
        yield Case(
            f"calibrate --out {what}", ("calibrate", "--from-run", run, "--out", path), names
        )
        yield Case(
            f"calibrate --raw-out {what}",
            ("calibrate", "--raw-out", path, "--out", f.out("u.json")),
            names,
        )
        yield Case(f"fit-workload --out {what}", ("fit-workload", trace, "--out", path), names)
        yield Case(
            f"simulate --chrome-trace {what}",
            ("simulate", "--requests", "50", "--quiet", "--chrome-trace", path),
            names,
        )
        yield Case(
            f"record-traces --out {what}",
            ("record-traces", "mt-bench", "--out", path),
            (*names, "torch", "gguf"),
        )
        yield Case(
            f"record-traces --samples {what}",
            ("record-traces", "mt-bench", "--out", f.out("u.jsonl"), "--samples", path),
            (*names, "torch", "gguf"),
        )
    for what, path in bad_folders.items():
        yield Case(
            f"export --out {what}",
            ("export", policy, "--engine", "sglang", "--out", path),
            ("--out",),
        )


def secret_cases(f: Files) -> Iterator[Case]:
    pg = f"postgresql://user:{SECRET}@127.0.0.1:1/db"
    out = f.out("unused-p.json")
    yield Case(
        "plan --storage postgres password",
        ("plan", "--trials", "2", "--quiet", "--out", out, "--storage", pg),
        ("--storage",),
    )
    yield Case(
        "plan --workers --storage postgres password",
        ("plan", "--trials", "2", "--quiet", "--workers", "2", "--out", out, "--storage", pg),
        ("--storage",),
    )
    yield Case(
        "plan --storage sqlite password query",
        (
            "plan",
            "--trials",
            "2",
            "--quiet",
            "--out",
            out,
            "--storage",
            f"sqlite:////nonexistent/x.db?password={SECRET}",
        ),
        ("--storage",),
    )
    yield Case(
        "plan --storage redis password",
        ("plan", "--trials", "2", "--quiet", "--out", out, "--storage", f"redis://u:{SECRET}@h/0"),
        ("--storage",),
    )
    yield Case(
        "worker --storage postgres password",
        ("worker", "--study", "x", "--storage", pg),
        ("--storage",),
    )
    yield Case("worker without storage", ("worker", "--study", "x"), ("storage",))


def sidecar_doc() -> dict[str, Any]:
    """A well-formed vLLM export sidecar (what `spectune export --engine vllm` writes)."""
    return {
        "schema": "spectune.export/v1",
        "engine": "vllm",
        "profile": "vllm",
        "versions": "0.33",
        "launch": ["vllm", "serve", "m", "--max-num-seqs", "64"],
        "source": {
            "target": "llama-3.1-8b",
            "drafter": "eagle3-llama-3.1-8b",
            "hardware": "h100-sxm",
            "tp": 1,
            "workload": "mt-bench",
        },
        "approximations": [],
        "config": {
            "method": "eagle3",
            "model": "m",
            "num_speculative_tokens": 4,
            "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 0]],
        },
    }


def export_cases(f: Files) -> Iterator[Case]:
    """Export sidecars as `simulate --policy` / `capacity --policy` (planner.export.runs), and
    bad --csv / --plot paths (checked before the work)."""
    base = sidecar_doc()
    cfg = base["config"]
    variants = {
        "string-k": {**cfg, "num_speculative_tokens_per_batch_size": [[1, 8, "4"]]},
        "huge-k": {**cfg, "num_speculative_tokens": HUGE_INT},
        "gap": {**cfg, "num_speculative_tokens_per_batch_size": [[1, 4, 4], [9, 64, 2]]},
        "from-2": {**cfg, "num_speculative_tokens_per_batch_size": [[2, 8, 4]]},
        "ranges-object": {**cfg, "num_speculative_tokens_per_batch_size": {"1": 4}},
        "tree-garbage": {**cfg, "speculative_token_tree": "__import__('os')"},
        "config-list": [1, 2],
    }
    docs = {k: {**base, "config": v} for k, v in variants.items()}
    docs["no-source"] = {k: v for k, v in base.items() if k != "source"}
    docs["tp-string"] = {**base, "source": {**base["source"], "tp": "1"}}
    docs["sglang-bad-adaptive"] = {
        **base,
        "engine": "sglang",
        "profile": "sglang",
        "config": {
            "server_args": {
                "speculative_num_steps": 4,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 5,
            },
            "adaptive": {"one": {"candidate_steps": [4]}},
            "max_running_requests": 64,
        },
    }
    docs["unknown-engine"] = {**base, "engine": "magic"}
    for variant, doc in docs.items():
        path = f.text(
            f"sidecar/{variant}.spectune.json", json.dumps(doc).replace(f'"{HUGE_INT}"', HUGE_INT)
        )
        name = (Path(path).name,)
        for cmd in ("simulate", "capacity"):
            yield Case(
                f"{cmd} --policy sidecar {variant}",
                (cmd, "--policy", path, "--requests", "5", "--quiet"),
                name,
            )
    a_file = f.text("out/csv-a-file.txt", "x")
    for opt in ("--csv", "--plot"):
        bad = a_file + "/x.png"
        for argv in (("cost",), ("simulate", "--requests", "5", "--quiet"), ("plan", "--quiet")):
            yield Case(f"{argv[0]} {opt} under a file", (*argv, opt, bad), (opt,))
    yield Case("cost --plot not png", ("cost", "--plot", f.out("x.jpg")), ("--plot",))


FAMILIES = (
    spec_cases,
    policy_cases,
    export_cases,
    trace_cases,
    arrival_cases,
    check_cases,
    calibrate_cases,
    numeric_cases,
    length_cases,
    out_cases,
    secret_cases,
)


# ---- running ----------------------------------------------------------------------------------
def run_one(
    argv: list[str], timeout_s: float, cwd: Path, env: dict[str, str]
) -> tuple[int, str, float, float, bool]:
    """(exit code, stderr, peak RSS MB of the child, wall s, timed out) of one subprocess."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd, env=env
        )
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    timed_out = proc.returncode < 0
    return proc.returncode, stderr, usage.ru_maxrss / 1024, wall, timed_out


def judge(
    case: Case, rc: int, stderr: str, rss_mb: float, wall: float, timed_out: bool, limit_mb: float
) -> Outcome:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if not (ln.startswith("spectune ") and ": warning: " in ln)]
    message = errors[-1] if errors else ""
    o = Outcome(
        case=case.name,
        command=case.command,
        rc=rc,
        traceback=TRACEBACK in stderr,
        one_line=len(errors) == 1 and message.startswith("spectune ") and " error: " in message,
        named=any(n and n.lower() in message.lower() for n in case.names),
        leaked=SECRET in stderr,
        rss_mb=rss_mb,
        wall_s=wall,
        timed_out=timed_out,
        message=message[:300],
    )
    checks = {
        f"exit {rc}": rc == 2,
        "traceback": not o.traceback,
        f"{len(errors)} error lines": o.one_line,
        "does not name " + "/".join(case.names)[:60]: o.named,
        "leaks the secret": not o.leaked,
        f"RSS {rss_mb:.0f} MB over the {limit_mb:.0f} MB limit": rss_mb <= limit_mb,
        "timed out": not timed_out,
    }
    o.why = [k for k, ok in checks.items() if not ok]
    o.passed = not o.why
    return o


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    ap.add_argument(
        "--limit-mb", type=float, default=256.0, help="peak RSS allowed above the baseline"
    )
    ap.add_argument("--failures", action="store_true", help="print every failing case")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))  # fixtures read the presets of this checkout
    tmp = Path(tempfile.mkdtemp(prefix="spectune-hostile-"))
    try:
        files = Files(tmp)
        cases = [c for fam in FAMILIES for c in fam(files) if args.only in c.name]
        if args.list:
            for c in cases:
                print(c.name)
            return 0
        work = tmp / "cwd"
        work.mkdir()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}
        env.pop("SPECTUNE_STORAGE", None)
        py = [sys.executable, "-m", "spectune"]
        base_rc, _, base_mb, _, _ = run_one([*py, "presets", "--json"], 120, work, env)
        torch_code = "import torch, spectune.cli; spectune.cli.build_parser()"
        torch_rc, _, torch_mb, _, _ = run_one([sys.executable, "-c", torch_code], 120, work, env)
        if base_rc != 0 or torch_rc != 0:
            print("a baseline (`spectune presets`, `import torch`) failed", file=sys.stderr)
            return 1

        done = [0]
        lock = threading.Lock()

        def go(c: Case) -> Outcome:
            rc, stderr, mb, wall, to = run_one([*py, *c.argv], c.timeout_s, work, env)
            base = torch_mb if c.command in TORCH_COMMANDS else base_mb
            o = judge(c, rc, stderr, mb, wall, to, base + args.limit_mb)
            o.above_mb = mb - base
            with lock:
                done[0] += 1
                if done[0] % 50 == 0 or not o.passed:
                    mark = "ok" if o.passed else "FAIL " + ", ".join(o.why)
                    print(f"[{done[0]}/{len(cases)}] {c.name}: {mark}", file=sys.stderr, flush=True)
            return o

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(go, cases))
        elapsed = time.monotonic() - t0
        left = sorted(str(p.relative_to(tmp)) for d in (work, files.outputs) for p in d.rglob("*"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    by_cmd: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_cmd.setdefault(o.command, []).append(o)
    head = f"{'command':<14} {'cases':>5} {'pass':>5} {'exit 2':>6} {'trace':>5} {'1 line':>6} {'named':>5} {'leak':>4} {'+MB max':>7} {'max s':>6}"
    print(head)
    print("-" * len(head))
    for cmd, os_ in sorted(by_cmd.items()):
        print(
            f"{cmd:<14} {len(os_):>5} {sum(o.passed for o in os_):>5} {sum(o.rc == 2 for o in os_):>6} "
            f"{sum(o.traceback for o in os_):>5} {sum(o.one_line for o in os_):>6} "
            f"{sum(o.named for o in os_):>5} {sum(o.leaked for o in os_):>4} "
            f"{max(0.0, *(o.above_mb for o in os_)):>7.0f} {max(o.wall_s for o in os_):>6.1f}"
        )
    failed = [o for o in outcomes if not o.passed]
    shown = failed if args.failures else failed[:25]
    if failed:
        print(
            f"\n{len(failed)} failing cases{'' if args.failures else ' (first 25; --failures for all)'}:"
        )
        for o in shown:
            print(f"  {o.case}: {', '.join(o.why)} | {o.message[:160]}")
    if left:
        print(f"\nfiles left in the working folder: {', '.join(left[:10])}")
    summary = {
        "bench": "hostile_suite",
        "cases": len(outcomes),
        "commands": len(by_cmd),
        "passed": len(outcomes) - len(failed),
        "failed": len(failed),
        "tracebacks": sum(o.traceback for o in outcomes),
        "exit_2": sum(o.rc == 2 for o in outcomes),
        "one_line": sum(o.one_line for o in outcomes),
        "named": sum(o.named for o in outcomes),
        "leaks": sum(o.leaked for o in outcomes),
        "timeouts": sum(o.timed_out for o in outcomes),
        "baseline_rss_mb": round(base_mb, 1),
        "torch_baseline_rss_mb": round(torch_mb, 1),
        "max_rss_mb": round(max(o.rss_mb for o in outcomes), 1),
        "max_rss_above_baseline_mb": round(max(o.above_mb for o in outcomes), 1),
        "rss_limit_above_baseline_mb": args.limit_mb,
        "children_max_rss_mb": round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
        ),
        "max_wall_s": round(max(o.wall_s for o in outcomes), 2),
        "files_left": len(left),
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(summary))
    return 0 if not failed and not left else 1


if __name__ == "__main__":
    sys.exit(main())

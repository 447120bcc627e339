"""The tensor-parallel group of one host: its collectives, how its ranks are started, and the
timing of its collectives against message size (what `spectune calibrate` fits the cost model's
interconnect terms to).

A TP forward needs three collectives (spectune.executor.tp):
- all-reduce (sum) of a row-parallel output [T, hidden] after the attention output and the MLP
  down projections: 2 per layer, T * hidden * 2 bytes each in bf16. A ring moves
  2 * (tp - 1) / tp of the message over each link (NCCL's ring all-reduce; nccl-tests
  PERFORMANCE.md defines bus bandwidth with the same factor);
- all-gather of the vocabulary shards of the logits [L, vocab / tp] -> [L, vocab]: (tp - 1) / tp
  of L * vocab * 2 bytes per link;
- broadcast, which the executor does not need: every rank runs the same tree building,
  verification and acceptance on identical (all-gathered) logits with the same random stream,
  so their results agree without a message (SGLang likewise samples on every TP rank with one
  seed). The sweep still times a broadcast of the accepted tokens, the message that replication
  saves.

On CUDA the collectives are NCCL's through torch.distributed; they are captured in CUDA graphs
(NCCL >= 2.9.6 allows capture: PyTorch docs, "CUDA semantics", CUDA Graphs with
DistributedDataParallel). On CPU the gloo backend runs the same code (the tests).
NVLink SHARP (NCCL_NVLS_ENABLE) is left to the caller's environment; the GPU script turns it off.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

# message sizes of the sweep, bytes: 4 KiB .. 128 MiB by 2x (a 70B verify's all-reduce is
# T * 8192 * 2 bytes: 16 KiB at T = 1, 64 MiB at T = 4096)
SWEEP_BYTES = tuple(4096 << i for i in range(16))
SWEEP_OPS = ("all_reduce", "rs_ag", "all_gather", "broadcast")
# An all-reduce of a forward follows the row-parallel GEMM that writes its message; timed that
# way it costs less than back to back when small (0.60-0.77x at 8-512 KiB on 4x H200, tp 2 and
# 4: benchmarks/results/tp_h200x4/inplace_tp*.json) and alike from a few MiB on. The sweep times
# all-reduces of up to IN_PLACE_MAX_BYTES in place: `inner` x (GEMM [T, h/tp] x [h/tp, h] into
# the message, all-reduce) minus `inner` x the GEMM alone, h = IN_PLACE_HIDDEN, with `inner`
# weight copies so that L2 does not hold them (a projection's weights stream from HBM).
IN_PLACE_MAX_BYTES = 8 << 20
IN_PLACE_HIDDEN = 4096
T = TypeVar("T")

# torch >= 2.10 names the flat-tensor collectives *_single (the *_tensor names are deprecated)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class TPGroup:
    """One rank's view of a tensor-parallel group (the default process group, or a subgroup of
    its first `world` ranks). rank 0 writes results; every rank runs the same calls."""

    rank: int
    world: int
    device: torch.device
    group: Any = None  # a torch.distributed ProcessGroup (None: the default group)

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place; returns x. (One ring all-reduce: 2*(tp-1)/tp of
        x's bytes per link.)"""
        if self.world > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., w] on each rank -> [..., world * w], rank r's shard at columns [r*w, (r+1)*w)
        (the vocab-parallel logits). Bytes per link: (tp-1)/tp of the gathered tensor."""
        if self.world == 1:
            return x
        lead, w = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, w).contiguous()
        out = torch.empty((self.world * flat.shape[0], w), dtype=x.dtype, device=x.device)
        _all_gather(out, flat, group=self.group)  # [world * rows, w], rank-major
        return out.view(self.world, -1, w).permute(1, 0, 2).reshape(*lead, self.world * w)

    def broadcast_(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.world > 1:
            dist.broadcast(x, src, group=self.group)
        return x

    def broadcast_object(self, obj: T) -> T:
        """rank 0's `obj` (any picklable value) on every rank: host-side decisions (timed
        choices) that must agree so that the ranks' graphs hold the same collectives."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def reduce_scatter_all_gather_(self, x: torch.Tensor) -> torch.Tensor:
        """The same sum as all_reduce_ as a reduce-scatter then an all-gather of x [rows, ...]
        (rows divisible by world): what sequence-parallel layers run instead of one all-reduce,
        timed against it by the sweep."""
        if self.world == 1:
            return x
        part = torch.empty((x.shape[0] // self.world, *x.shape[1:]), dtype=x.dtype, device=x.device)
        _reduce_scatter(part, x, group=self.group)
        _all_gather(x, part, group=self.group)
        return x

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.group)

    def subgroup(self, world: int) -> TPGroup | None:
        """The group of ranks 0..world-1 (every rank must call this; ranks outside get None)."""
        if world == self.world:
            return self
        g = dist.new_group(list(range(world)))
        return TPGroup(self.rank, world, self.device, g) if self.rank < world else None


GLOO_TIMEOUT = datetime.timedelta(minutes=3)
"""How long gloo ranks wait for each other (rendezvous and collectives) before failing."""


def free_port() -> int:
    """An unused TCP port on loopback for the ranks' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_rank(rank: int, world: int, port: int, backend: str) -> TPGroup:
    """Join the group (backend 'nccl': one GPU per rank, cuda:rank; 'gloo': CPU)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    if backend == "nccl":
        # collectives are captured in CUDA graphs: one GPU per process (NCCL's guide, "Using
        # NCCL with CUDA Graphs": global capture mode is then compatible) and c10d's async
        # error handling off, as PyTorch's CUDA-semantics notes ask before capturing
        # collectives ("Usage with DistributedDataParallel")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        try:  # device_id (torch >= 2.3) binds the communicator to this GPU up front
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        except TypeError:
            dist.init_process_group("nccl", rank=rank, world_size=world)
    else:
        device = torch.device("cpu")
        # a bounded rendezvous: a rank that never arrives fails the group instead of hanging it
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=GLOO_TIMEOUT)
    return TPGroup(rank, world, device)


def _entry(
    rank: int, fn: Callable[..., Any], world: int, port: int, backend: str, args: Any
) -> None:
    if rank:  # rank 0 speaks for the group; the others' errors still reach stderr
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    group = init_rank(rank, world, port, backend)
    try:
        fn(group, *args)
    finally:
        group.barrier()
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], world: int, args: Sequence[Any] = (), backend: str = "") -> None:
    """Run fn(group, *args) on `world` ranks of this host (spawned processes; fn must be a
    module-level function). backend '' : NCCL when CUDA has `world` GPUs, else gloo on CPU."""
    import torch.multiprocessing as mp

    if not backend:
        backend = (
            "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
        )
    if backend == "nccl" and torch.cuda.device_count() < world:
        from spectune.specs import SpecError

        raise SpecError(f"tp {world} needs {world} GPUs; this host has {torch.cuda.device_count()}")
    mp.spawn(_entry, args=(fn, world, free_port(), backend, tuple(args)), nprocs=world, join=True)


# ---- the sweep -----------------------------------------------------------------------------------
def _op(group: TPGroup, name: str, x: torch.Tensor) -> Callable[[], object]:
    if name == "all_reduce":
        return lambda: group.all_reduce_(x)
    if name == "rs_ag":
        return lambda: group.reduce_scatter_all_gather_(x)
    if name == "all_gather":
        shard = x[: x.shape[0] // group.world]
        out = torch.empty_like(x)
        return lambda: _all_gather(out, shard, group=group.group)
    if name == "broadcast":
        return lambda: group.broadcast_(x)
    raise ValueError(name)


def collective_sweep(
    group: TPGroup,
    sizes: Sequence[int] = SWEEP_BYTES,
    ops: Sequence[str] = SWEEP_OPS,
    reps: int = 10,
    inner: int = 20,
) -> list[dict[str, Any]]:
    """Median seconds of one collective per (op, message bytes) on this group, `inner` calls
    captured in one CUDA graph per timed replay (the launch pattern of a captured forward);
    on CPU, eager. Every rank must call it; rank 0's rows are the result. Row: op, tp, bytes
    (the full message: all_gather's gathered size), seconds, algbw_gb_s (bytes / s),
    busbw_gb_s (nccl-tests' bus bandwidth: algbw x 2(tp-1)/tp for all-reduce, (tp-1)/tp for
    all-gather and reduce-scatter + all-gather counted as one all-reduce, 1 for broadcast),
    pattern ('in_place': an all-reduce of at most IN_PLACE_MAX_BYTES after the GEMM that writes
    it, the GEMM's own time taken off; 'back_to_back'), seconds_back_to_back (every row)."""
    from spectune.kernels.timing import graph_time

    rows = []
    tp = group.world
    factor = {"all_reduce": 2 * (tp - 1) / tp, "rs_ag": 2 * (tp - 1) / tp,
              "all_gather": (tp - 1) / tp, "broadcast": 1.0}  # fmt: skip
    for op in ops:
        for nbytes in sizes:
            n = max(tp, nbytes // 2 // (tp * 64) * tp * 64)  # bf16 elements, rows of 64
            x = torch.zeros((n // 64, 64), dtype=torch.bfloat16, device=group.device)
            call = _op(group, op, x)

            def block(call: Callable[[], object] = call) -> None:
                for _ in range(inner):
                    call()

            group.barrier()
            swept = graph_time(block, group.device, reps) / inner
            size = x.numel() * 2
            t, pattern = swept, "back_to_back"
            if op == "all_reduce" and size <= IN_PLACE_MAX_BYTES:
                in_place, _ = in_place_all_reduce(group, x.numel(), reps, inner)
                if in_place > 0:  # a difference of two medians; <= 0 only from noise
                    t, pattern = in_place, "in_place"
            rows.append(
                {
                    "op": op,
                    "tp": tp,
                    "bytes": size,
                    "seconds": t,
                    "algbw_gb_s": size / t / 1e9,
                    "busbw_gb_s": size / t / 1e9 * factor[op],
                    "pattern": pattern,
                    "seconds_back_to_back": swept,
                }
            )
            del x
    return rows


def in_place_all_reduce(
    group: TPGroup, numel: int, reps: int, inner: int, hidden: int = IN_PLACE_HIDDEN
) -> tuple[float, float]:
    """(seconds of one all-reduce of `numel` bf16 values right after the row-parallel GEMM that
    writes them, seconds of that GEMM alone): median of `inner` x (GEMM, all-reduce) less
    median of `inner` x GEMM, per call. GEMM [T, h/tp] x [h/tp, h], h = `hidden`,
    T = ceil(numel / h); weights h * h/tp * 2 bytes per copy (16 MiB at h = 4096, tp = 2), one
    copy per call so that L2 does not hold them. Every rank must call it."""
    from spectune.kernels.timing import graph_time

    dev, tp, h = group.device, group.world, hidden
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows = -(-numel // h)
    a = torch.randn(rows, h // tp, device=dev, dtype=dtype)
    ws = [torch.randn(h, h // tp, device=dev, dtype=dtype) * 0.02 for _ in range(inner)]
    y = torch.empty(rows, h, device=dev, dtype=dtype)
    msg = y.view(-1)[:numel]

    def gemm() -> None:
        for w in ws:
            torch.matmul(a, w.t(), out=y)

    def both() -> None:
        for w in ws:
            torch.matmul(a, w.t(), out=y)
            group.all_reduce_(msg)

    group.barrier()
    alone = graph_time(gemm, dev, reps)
    group.barrier()
    return (graph_time(both, dev, reps) - alone) / inner, alone / inner

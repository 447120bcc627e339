"""Nsight Compute target: batch-1 tree attention launches (the latency-bound shapes).

Compiles and warms every case outside the profiled range, then runs each once between
cudaProfilerStart / Stop, so `ncu --profile-from-start off` sees exactly these launches (ncu
flushes the caches before each one by default, so each starts from a cold L2, like gpu_us).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python benchmarks/profile_batch1.py

Cases: the default config at N = 16 and 64 (context 4096, Llama-3.1-8B attention, bf16),
N = 16 at 13 splits with half partials and with a 4-warp merge, and a streaming read of the
same K/V bytes. With `--cache-control none` the merge kernels read the partials the attention
kernel left in L2, as in a real call.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from probe_batch1 import DIM, HKV, HQ, _read_kernel

from spectune.kernels import TreeAttentionConfig, make_tree_attention_inputs, tree_attention


def main() -> None:
    cases = []
    for n in (16, 64):
        inp = make_tree_attention_inputs([4096], [n], HQ, HKV, DIM, torch.bfloat16, "cuda", seed=n)
        cases.append((f"default N={n}", inp, n, None, None))
        if n == 16:
            cfg = TreeAttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=4, pdl=True)
            cases.append(
                ("N=16 splits=13 half partials", inp, n, replace(cfg, half_partials=True), 13)
            )
            cases.append(("N=16 splits=13 merge 4 warps", inp, n, replace(cfg, merge_warps=4), 13))
    kv = torch.cat([cases[0][1].k_cache.reshape(-1), cases[0][1].v_cache.reshape(-1)])
    out = torch.empty(264, device="cuda", dtype=torch.float32)
    per = kv.numel() // 264 // 8192 * 8192

    def read() -> None:
        _read_kernel[(264,)](kv, out, per, BLOCK=8192, num_warps=8, num_stages=4)

    def run(case: tuple) -> None:  # type: ignore[type-arg]
        _, inp, n, cfg, s = case
        tree_attention(*inp.args(), max_q_len=n, max_kv_len=4096 + n, config=cfg, num_splits=s)

    for _ in range(3):
        for c in cases:
            run(c)
        read()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for c in cases:
        print("case", c[0], flush=True)
        run(c)
        torch.cuda.synchronize()
    print("case read", flush=True)
    read()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()

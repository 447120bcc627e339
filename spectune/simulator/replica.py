"""One server replica: admission under KV capacity, continuous batching with a maximum batch
size and a per-iteration token budget, chunked prefill, preemption by recomputation, and a
speculative (or plain) decode step per iteration.

One SimPy event per iteration: the replica plans the iteration (numpy over its running batch),
waits the iteration's priced time, then applies its outcome. Scheduling follows the common
engine shape (vLLM/SGLang): decoding sequences first, each charging its verify tokens (1 plus
its draft tree) to the token budget; what is left goes to prefill chunks in admission order.
A request is admitted (FCFS) when a batch slot is free and the cache has room for its whole
prompt; when growing sequences outrun the cache, the most recently admitted are preempted and
later recompute their prompt and output so far.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from spectune.planner.capacity import KVBudget
from spectune.simulator.iterations import IterationLog
from spectune.simulator.requests import Requests
from spectune.simulator.speculation import Speculator
from spectune.simulator.steptime import StepPricer
from spectune.specs import TreePolicy

MAX_FAST_OUTCOMES = 1 << 16  # outcomes drawn per fast-forward (iterations x batch)


class Replica:
    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        reqs: Requests,
        kv: KVBudget,
        *,
        max_batch: int,
        max_batch_tokens: int,
        pricer: StepPricer,
        speculator: Speculator,
        rng: np.random.Generator,
        log: IterationLog,
        on_finish: Callable[[int], None] | None = None,
        fast_forward: bool = True,
        horizon: Callable[[], float] | None = None,
    ):
        self.env = env
        self.index = index
        self.reqs = reqs
        self.kv = kv
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        self.pricer = pricer
        self.spec = speculator
        self.rng = rng
        self.log = log
        self.on_finish = on_finish
        self.fast_forward = fast_forward
        # time of the next event that can touch this replica (an arrival it may be routed);
        # by default the next event of any kind
        self.horizon = horizon if horizon is not None else env.peek
        self._last_dt = 0.0  # length of the last iteration (to size fast-forwards)
        # the running batch, in admission order: request ids and local copies of their state
        # (written back to `reqs` when a request finishes or is preempted)
        self.running = np.zeros(0, dtype=np.int64)
        self.prompt = np.zeros(0, dtype=np.int64)
        self.output = np.zeros(0, dtype=np.int64)
        self.out = np.zeros(0, dtype=np.int64)
        self.comp = np.zeros(0, dtype=np.int64)
        self.waiting: deque[int] = deque()
        self._idle: simpy.Event | None = None
        self.process = env.process(self.run())

    # ---- router side ------------------------------------------------------------------------
    def submit(self, rid: int) -> None:
        self.reqs.replica[rid] = self.index
        self.waiting.append(rid)
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    @property
    def outstanding(self) -> int:
        return int(self.running.size) + len(self.waiting)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if not self.running.size and not self.waiting:
                self._idle = env.event()
                yield self._idle
                self._idle = None
            if self.waiting and self.running.size < self.max_batch:
                self._admit()
            in_system = self.running.size + len(self.waiting)
            if self.fast_forward and not self.waiting and self.running.size:
                ahead = self._fast_forward(in_system, self.horizon() - env.now)
                if ahead > 0:
                    yield env.timeout(ahead)
                    continue
            plan = self._plan()
            t0 = env.now
            yield env.timeout(plan[-1].total_s)
            self._commit(plan, t0, in_system)

    def _admit(self) -> None:
        r = self.reqs
        bs = self.kv.block_size
        free = self.max_batch - self.running.size
        used = int(((self.prompt + self.out + (bs - 1)) // bs).sum())  # whole prompts reserved
        take: list[int] = []
        while self.waiting and len(take) < free:
            rid = self.waiting[0]
            need = int(-(-(r.prompt[rid] + r.out[rid] + 1) // bs))
            if used + need > self.kv.blocks and (self.running.size or take):
                break
            used += need
            take.append(self.waiting.popleft())
        if take:
            ids = np.array(take, dtype=np.int64)
            self.running = np.concatenate([self.running, ids])
            self.prompt = np.concatenate([self.prompt, r.prompt[ids]])
            self.output = np.concatenate([self.output, r.output[ids]])
            self.out = np.concatenate([self.out, r.out[ids]])
            self.comp = np.concatenate([self.comp, r.computed[ids]])

    def _fast_forward(self, in_system: int, limit_s: float) -> float:
        """Run, in one vectorised pass, the decode iterations that nothing can interrupt: every
        sequence decoding, nobody waiting, no request finishing, the KV cache sufficing, the
        policy unchanged, and all of it ending before the next event elsewhere (`limit_s`
        ahead). Outcomes and step times of K iterations are drawn and priced at once, exactly
        as K single iterations would be. Returns the simulated seconds (0: nothing to skip)."""
        out, comp, b = self.out, self.comp, int(self.running.size)
        if not ((self.prompt + out - comp == 1).all() and (out >= 1).all()):
            return 0.0
        if self._last_dt <= 0.0 or limit_s < 2.0 * self._last_dt:
            return 0.0  # the next event elsewhere comes within about one iteration
        steps = min(
            int((self.output - out).min()),
            MAX_FAST_OUTCOMES // b,
            int(min(1.25 * limit_s / self._last_dt, 1e9)) + 2,  # about what fits before the limit
        )
        if steps < 2:
            return 0.0
        comp_sum = float(comp.sum())
        policy = self.spec.policy_for(b, comp_sum / b)
        if policy is not None and self.spec.shares(policy, b):
            return 0.0  # shared-budget outcomes come in whole batches
        if policy is not None:
            nodes, acc = self.spec.draw(policy, self.rng, steps * b)
            nodes = nodes.reshape(steps, b)
            acc = acc.reshape(steps, b)
            emitted = acc + 1
        else:
            emitted = np.ones((steps, b), dtype=np.int64)
        cum = np.cumsum(emitted, axis=0)
        reached = ((out + cum) >= self.output).any(axis=1)
        k = int(np.argmax(reached)) if reached.any() else steps  # steps before a finish
        if k < 1:
            return 0.0
        per_step = cum[:k].sum(axis=1)
        ctx = (comp_sum + np.r_[0, per_step[:-1]]) / b  # mean context entering each step
        if policy is not None and not isinstance(self.spec.policy, TreePolicy):
            k = self._same_policy_steps(policy, b, ctx[:k])
            if k < 1:
                return 0.0
            ctx = ctx[:k]
        if policy is not None:
            tree_sum = nodes[:k].sum(axis=1)
            acc_sum = acc[:k].sum(axis=1)
            draft, fwd, ext, ovh = self.pricer.decode_spec_many(b, policy, tree_sum, acc_sum, ctx)
            dt = draft + fwd + ext + ovh
            fed_sum = tree_sum
        else:
            fwd = self.pricer.decode_off_many(b, ctx)
            dt = fwd
            draft = ext = ovh = np.zeros(k)
            fed_sum = np.full(k, b)
        end = np.cumsum(dt)
        k = int(np.searchsorted(end, limit_s, side="left"))  # iterations ending before limit
        if k < 1:
            return 0.0
        # KV: the last iteration holds its cached tokens plus its verify tokens
        bs = self.kv.block_size
        last_fed = nodes[k - 1] if policy is not None else 1
        base = comp + (cum[k - 2] if k > 1 else 0)
        if int(((base + last_fed + (bs - 1)) // bs).sum()) > self.kv.blocks:
            return 0.0
        gained = cum[k - 1]
        self.out = out + gained
        self.comp = comp + gained
        lg = self.log
        pol = -1
        if policy is not None:
            lg.spec_verifies += k * b
            lg.spec_tree_tokens += int(tree_sum[:k].sum())
            lg.spec_accepted += int(acc_sum[:k].sum())
            pol = lg.policy_index(_policy_text(policy))
        t0 = self.env.now
        start = t0 + np.r_[0.0, end[: k - 1]]
        made = np.r_[per_step[0], np.diff(per_step[:k])] if k > 1 else per_step[:1]
        n = k
        lg.rows.extend(
            zip(
                [self.index] * n,
                start.tolist(),
                dt[:k].tolist(),
                [b] * n,
                [0] * n,
                [in_system] * n,
                fed_sum[:k].tolist(),
                made.tolist(),
                draft[:k].tolist(),
                fwd[:k].tolist(),
                ext[:k].tolist(),
                ovh[:k].tolist(),
                [0] * n,
                [pol] * n,
                strict=True,
            )
        )
        self._last_dt = float(dt[k - 1])
        return float(end[k - 1])

    def _same_policy_steps(self, policy: TreePolicy, b: int, ctx: np.ndarray) -> int:
        """How many of the steps (mean contexts `ctx`, increasing) keep `policy` (bisection)."""
        if self.spec.policy_for(b, float(ctx[-1])) == policy:
            return int(ctx.size)
        lo, hi = 0, int(ctx.size) - 1  # ctx[lo] keeps it (it is the current step), ctx[hi] not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.spec.policy_for(b, float(ctx[mid])) == policy:
                lo = mid
            else:
                hi = mid
        return lo + 1

    def _keep(self, keep: np.ndarray) -> None:
        self.running = self.running[keep]
        self.prompt = self.prompt[keep]
        self.output = self.output[keep]
        self.out = self.out[keep]
        self.comp = self.comp[keep]

    def _plan(self) -> tuple[Any, ...]:
        out, comp = self.out, self.comp
        need = self.prompt + out - comp
        dec = (need == 1) & (out >= 1)
        n_dec = int(np.count_nonzero(dec))
        all_dec = n_dec == out.size
        ctx_dec = comp if all_dec else comp[dec]
        ctx_mean = float(ctx_dec.sum()) / n_dec if n_dec else 0.0
        policy = self.spec.policy_for(n_dec, ctx_mean) if n_dec else None
        if policy is not None:
            tree, acc = self.spec.draw(policy, self.rng, n_dec)
        else:
            tree = np.ones(n_dec, dtype=np.int64)
            acc = np.zeros(n_dec, dtype=np.int64)
        if all_dec:
            fed = tree
        else:
            fed = np.zeros(out.size, dtype=np.int64)
            fed[dec] = tree
            pre = ~dec
            left = max(0, self.max_batch_tokens - int(tree.sum()))
            want = need[pre]
            before = np.cumsum(want) - want
            fed[pre] = np.clip(left - before, 0, want)
        # KV for this iteration: cached tokens plus the fed ones (a tree's nodes are written
        # before the rejected ones are dropped); preempt the newest requests until it fits.
        bs = self.kv.block_size
        after = (comp + fed + (bs - 1)) // bs
        preempted = 0
        if int(after.sum()) > self.kv.blocks:
            keep = np.cumsum(after) <= self.kv.blocks
            keep[0] = True  # the oldest request always fits (checked before the run)
            drop = ~keep
            preempted = int(np.count_nonzero(drop))
            r = self.reqs
            ids = self.running[drop]
            r.out[ids] = out[drop]
            r.computed[ids] = 0
            r.preemptions[ids] += 1
            self.waiting.extendleft(ids[::-1].tolist())
            acc_full = np.zeros(out.size, dtype=np.int64)
            acc_full[dec] = acc
            self._keep(keep)
            out, comp, fed, dec = self.out, self.comp, fed[keep], dec[keep]
            acc = acc_full[keep][dec]
            tree = fed[dec]
            n_dec = int(np.count_nonzero(dec))
            all_dec = n_dec == out.size
            ctx_dec = comp if all_dec else comp[dec]
            ctx_mean = float(ctx_dec.sum()) / n_dec if n_dec else 0.0
        pre_fed = None if all_dec else fed[~dec]
        if pre_fed is not None and pre_fed.any():
            live = pre_fed > 0
            cost = self.pricer.mixed(
                policy, tree, ctx_dec, int(acc.sum()), pre_fed[live], comp[~dec][live]
            )
        elif policy is not None and n_dec:
            cost = self.pricer.decode_spec(n_dec, policy, int(tree.sum()), int(acc.sum()), ctx_mean)
        else:
            cost = self.pricer.decode_off(n_dec, ctx_mean)
        return dec, all_dec, fed, acc, policy, preempted, cost

    def _commit(self, plan: tuple[Any, ...], t0: float, in_system: int) -> None:
        dec, all_dec, fed, acc, policy, preempted, cost = plan
        now = self.env.now
        self._last_dt = now - t0
        out, comp = self.out, self.comp
        new_comp = comp + fed
        if all_dec:
            gen = np.ones(out.size, dtype=np.int64)
        else:
            gen = (new_comp >= self.prompt + out).astype(np.int64)  # caught up: one token
        n_dec = acc.size
        if policy is not None and n_dec:
            emitted = acc + 1
            lg = self.log
            lg.spec_verifies += n_dec
            lg.spec_tree_tokens += int(fed.sum()) if all_dec else int(fed[dec].sum())
            lg.spec_accepted += int(acc.sum())
            if all_dec:
                new_comp = comp + emitted  # the root and the accepted path stay cached
                gen = emitted
            else:
                new_comp[dec] = comp[dec] + emitted
                gen[dec] = emitted
        gen = np.minimum(gen, self.output - out)
        new_out = out + gen
        self.comp = new_comp
        self.out = new_out
        r = self.reqs
        first = out == 0
        if first.any():
            first &= gen > 0
            r.first_token_s[self.running[first]] = now
        done = new_out >= self.output
        n_done = int(np.count_nonzero(done))
        if n_done:
            ids = self.running[done]
            r.finish_s[ids] = now
            r.out[ids] = new_out[done]
            r.computed[ids] = new_comp[done]
            self._keep(~done)
        self.log.rows.append(
            (
                self.index,
                t0,
                now - t0,
                n_dec,
                0 if all_dec else int(np.count_nonzero(fed[~dec])),
                in_system,
                int(fed.sum()),
                int(gen.sum()),
                cost.draft_s,
                cost.forward_s,
                cost.extend_s,
                cost.overhead_s,
                preempted,
                -1 if policy is None else self.log.policy_index(_policy_text(policy)),
            )
        )
        if n_done and self.on_finish is not None:
            self.on_finish(n_done)


_POLICY_TEXT: dict[Any, str] = {}


def _policy_text(policy: Any) -> str:
    """The policy's label (TreePolicy.label), cached per policy: the log names each once."""
    s = _POLICY_TEXT.get(policy)
    if s is None:
        s = _POLICY_TEXT[policy] = policy.label
    return s

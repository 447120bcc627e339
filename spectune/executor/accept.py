"""The accept and compact phases: greedy verification of each tree, then its accepted K/V moved.

accept   the longest root path of each tree whose every token equals the target token drawn
         after its parent (plus the bonus token: the target token after the path's last node),
         by spectune.kernels' walk_tree or the torch `greedy_accept`;
compact  the accepted path's K/V (tree node path[b, j] at context + path[b, j]) moved to the
         contiguous positions context + j, in every layer at once, by spectune.kernels'
         compact_kv or the torch `compact_kv`.
Both are fixed-shape device work (one CUDA graph each); the next step's root token is the bonus.

`accept_by_rule` verifies the same [B, N] trees by a rule of specs.tree.VERIFY_RULES from the
target's and drafter's probability rows (spectune.kernels' verify_rule: token-level recursive
rejection, Traversal Verification, SpecTr, greedy) and returns what PathAcceptor keeps. In the
spec loop a policy with verify='traversal' runs it on `synthetic_rows` (the synthetic
acceptances as distributions over N + 1 local tokens, one-hot top-k drafts); the other rules run
the walk kernel (walk_tree), and each for a reason:
- token: on top-k drafts the token-level rule is the walk over target samples (module
  docstring of kernels.verify), and the synthetic target tokens are those samples;
- greedy: verify_rule's greedy rule is walk_tree over the argmax tokens, and the synthetic
  target tokens stand for that argmax. Taking the argmax of `synthetic_rows` instead would
  accept the likeliest child every step, not the acceptance model's draws;
- spectr: SpecTr verifies i.i.d. drafts, every child of a node drawn from one draft row q it
  needs; the synthetic source gives each node an acceptance probability, not that q, and on
  its one-hot rows the SpecTr kernel would run another (lossy) scheme. Its acceptance stays the
  planner's (planner.acceptance.rules) and its kernel time is benchmarks/bench_kernels.py's.
"""

from __future__ import annotations

import torch

from spectune.executor.model import KVCache
from spectune.executor.tree_build import TreeBatch
from spectune.kernels.kv_compact import compact_kv as kernel_compact_kv
from spectune.kernels.verify import verify_rule, walk_tree


def greedy_accept(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    depth: torch.Tensor,
    mask: torch.Tensor,
    target: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch greedy verification (the fallback of kernels.walk_tree).

    parents, tokens, depth, target: int64[B, N]; mask: bool[B, N, N] ancestor matrix.
    Returns (accepted draft tokens int64[B], path int64[B, max_depth+1] root first, padded with
    the last accepted node, bonus token int64[B])."""
    b, n = parents.shape
    match = tokens == torch.gather(target, 1, parents.clamp(min=0))
    match[:, 0] = True
    # every node on the path matches its parent's target
    ok = ~(mask & ~match[:, None, :]).any(dim=-1)
    best = torch.where(ok, depth, -1).argmax(dim=1)  # deepest accepted node (lowest index on ties)
    num = torch.gather(depth, 1, best[:, None])[:, 0]
    on_path = torch.gather(mask, 1, best[:, None, None].expand(b, 1, n))[:, 0]  # [B, N]
    path = best[:, None].expand(b, max_depth + 2).clone()
    dest = torch.where(on_path, depth, max_depth + 1)
    path.scatter_(1, dest, torch.arange(n, device=parents.device).expand(b, n))
    bonus = torch.gather(target, 1, best[:, None])[:, 0]
    return num, path[:, : max_depth + 1], bonus


def accept_by_rule(
    rule: str,
    tree: TreeBatch,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    seed: int,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accepted draft tokens int64[B], path int64[B, max_depth+1] root first, padded with the
    last accepted node, bonus token int64[B]) of one verification by `rule`.

    target_probs: float32[B, N, V] the target's distribution after each node; draft_probs:
    float32[B, N, V] the distribution each node's token was drawn from (one-hot rows for top-k
    drafts); tree: parents, tokens, depth int64[B, N] (local tokens < V)."""
    b, n = tree.parents.shape
    v = target_probs.shape[-1]
    dev = tree.parents.device
    qo = torch.arange(b + 1, dtype=torch.int32, device=dev) * n
    acc, bonus = verify_rule(
        rule,
        tree.tokens.reshape(-1).contiguous(),
        tree.parents.to(torch.int32).reshape(-1).contiguous(),
        qo,
        target_probs.reshape(b * n, v).float().contiguous(),
        draft_probs.reshape(b * n, v).float().contiguous(),
        seed,
    )
    last = acc.long()
    num = torch.gather(tree.depth, 1, last[:, None])[:, 0]
    # the path, deepest first: max_depth parent gathers, then placed by depth
    path = last[:, None].expand(b, max_depth + 1).clone()
    cur = last
    for _ in range(max_depth + 1):
        d = torch.gather(tree.depth, 1, cur[:, None])[:, 0]
        path.scatter_(1, d[:, None], cur[:, None])
        cur = torch.gather(tree.parents, 1, cur[:, None])[:, 0].clamp(min=0)
    on = torch.arange(max_depth + 1, device=dev)[None, :] <= num[:, None]
    path = torch.where(on, path, last[:, None])
    return num, path, bonus


def synthetic_rows(tree: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens int64[B, N], target rows float32[B, N, N + 1], draft rows float32[B, N, N + 1])
    of the synthetic acceptances: node j is local token j; the target's row after node i puts
    accept[j] on each child j of i and the rest on token N (no child matches); each node's draft
    row is one-hot at its own token (top-k drafts). The target-only walk on these rows accepts
    as draw_target_tokens does."""
    b, n = tree.parents.shape
    dev = tree.parents.device
    j = torch.arange(n, device=dev)
    p = torch.zeros((b, n * (n + 1)), dtype=torch.float32, device=dev)
    idx = tree.parents.clamp(min=0) * (n + 1) + j
    p.scatter_add_(1, idx, torch.where(j > 0, tree.accept.float(), 0.0))
    p = p.view(b, n, n + 1)
    p[..., n] = (1.0 - p[..., :n].sum(-1)).clamp(min=0.0)
    q = torch.nn.functional.one_hot(j, n + 1).float().expand(b, n, n + 1).contiguous()
    return j.expand(b, n).contiguous(), p, q


def compact_kv(cache: KVCache, batch: int, context: int, path: torch.Tensor) -> None:
    """Move the K/V of the accepted path (tree nodes path[b, j] at context + path[b, j]) to
    context + j, in every layer at once. Bytes: 2 * layers * 2 * B * (d+1) * KVH * D * elem."""
    kv = cache.kv[:, :, :batch]  # [L, 2, B, cap, KVH, D]
    lyr, two, b, _, kvh, d = kv.shape
    a = path.shape[1]
    idx = (context + path)[None, None, :, :, None, None].expand(lyr, two, b, a, kvh, d)
    moved = torch.gather(kv, 3, idx)
    kv[:, :, :, context : context + a].copy_(moved)


def walk_kernel_works(device: torch.device) -> bool:
    """Whether kernels.walk_tree compiles and agrees with the torch walk on a small tree here."""
    par = torch.tensor([[-1, 0, 0, 1]], device=device)
    tok = torch.tensor([[9, 1, 2, 3]], device=device)
    tgt = torch.tensor([[1, 3, 0, 0]], device=device)
    try:
        res = walk_tree(
            tok.reshape(-1),
            par.to(torch.int32).reshape(-1),
            torch.tensor([0, 4], dtype=torch.int32, device=device),
            tgt.reshape(-1),
            max_nodes=4,
        )
    except Exception:  # a kernel that fails to build: the torch walk stands in
        return False
    return int(res.num_accepted[0]) == 2 and int(res.next_token[0]) == 0


class PathAcceptor:
    """Accept and compact for B trees of N slots, depth <= `depth`, at `context`.

    Outputs (persistent): path int64[B, depth+1] (accepted nodes, root first, padded with the
    last accepted node), num_acc int64[B] (accepted draft tokens), their int32 copies for the
    compaction kernel; the bonus token goes to `root_token` int64[B] (the next step's root).
    use_kernels: walk_tree (where it builds and agrees here) and compact_kv from
    spectune.kernels, else the torch functions above.
    """

    def __init__(
        self,
        tree: TreeBatch,
        target_tok: torch.Tensor,
        root_token: torch.Tensor,
        cache: KVCache,
        context: int,
        depth: int,
        use_kernels: bool,
        rule: str = "token",
    ):
        self.rule = rule
        self.tree, self.target_tok, self.root_token = tree, target_tok, root_token
        self.cache, self.context, self.depth = cache, context, depth
        b, n = tree.tokens.shape
        self.batch, self.nodes = b, n
        dev = root_token.device
        self.use_kernels = use_kernels
        self.walk = use_kernels and walk_kernel_works(dev)
        self.path = torch.zeros((b, depth + 1), dtype=torch.int64, device=dev)
        self.num_acc = torch.zeros((b,), dtype=torch.int64, device=dev)
        self.path32 = torch.zeros((b, depth + 1), dtype=torch.int32, device=dev)
        self.num_acc32 = torch.zeros((b,), dtype=torch.int32, device=dev)
        cap = cache.capacity
        # the compaction kernel's layout: sequence b's cache row starts at slot b * capacity
        self.kv_indptr = torch.arange(b, dtype=torch.int32, device=dev) * cap
        self.prefix = torch.full((b,), context, dtype=torch.int32, device=dev)

    def accept(self) -> None:
        t, b, d = self.tree, self.batch, self.depth
        if self.rule == "traversal" and self.use_kernels:
            tokens, p, q = synthetic_rows(t)
            local = TreeBatch(t.parents, tokens, t.depth, t.accept, t.lo, t.mask)
            num, path, _ = accept_by_rule("traversal", local, p, q, 7, d)
            last = torch.gather(path, 1, num[:, None])
            self.num_acc.copy_(num)
            self.path.copy_(path)
            # the bonus: the target token after the last accepted node (it matches no child)
            self.root_token.copy_(torch.gather(self.target_tok, 1, last)[:, 0])
            self.path32.copy_(path)
            self.num_acc32.copy_(num)
            return
        if self.walk:
            n = self.nodes
            qo = torch.arange(b + 1, dtype=torch.int32, device=self.root_token.device) * n
            res = walk_tree(
                t.tokens.reshape(-1).contiguous(),
                t.parents.to(torch.int32).reshape(-1).contiguous(),
                qo,
                self.target_tok.reshape(-1).contiguous(),
                max_nodes=n,
            )
            path = res.accepted_nodes[:, : d + 1].long()
            if path.shape[1] < d + 1:  # a path never holds more nodes than the tree
                path = torch.nn.functional.pad(path, (0, d + 1 - path.shape[1]), value=-1)
            num = res.num_accepted.long()
            last = torch.gather(path, 1, num[:, None])
            self.path.copy_(torch.where(path >= 0, path, last))
            self.num_acc.copy_(num)
            self.root_token.copy_(res.next_token)
            self.path32.copy_(self.path)
            self.num_acc32.copy_(num)
            return
        num, path, bonus = greedy_accept(t.parents, t.tokens, t.depth, t.mask, self.target_tok, d)
        self.num_acc.copy_(num)
        self.path.copy_(path)
        self.root_token.copy_(bonus)
        self.path32.copy_(path)
        self.num_acc32.copy_(num)

    def compact(self) -> None:
        if not self.use_kernels:
            compact_kv(self.cache, self.batch, self.context, self.path)
            return
        kv = self.cache.kv[:, :, : self.batch]  # [L, 2, B, cap, KVH, D]
        lyr, _, b, cap, kvh, d = kv.shape
        kernel_compact_kv(
            kv[:, 0].reshape(lyr, b * cap, kvh, d),
            kv[:, 1].reshape(lyr, b * cap, kvh, d),
            self.kv_indptr,
            self.prefix,
            self.path32,
            self.num_acc32,
        )

"""Verifiers: the verify phase of a speculative step (target forward over this step's trees).

- DenseVerifier (dense.py): every slot of the B x N trees, one fixed shape;
- RaggedVerifier (ragged.py): only the kept nodes of pruned trees, packed per token bucket.
base.py holds the interface and the outputs both write ([B, N] layout).
"""

from __future__ import annotations

from spectune.executor.verifiers.base import Verifier
from spectune.executor.verifiers.dense import DenseVerifier
from spectune.executor.verifiers.ragged import RaggedVerifier, route_buckets

__all__ = ["DenseVerifier", "RaggedVerifier", "Verifier", "route_buckets"]

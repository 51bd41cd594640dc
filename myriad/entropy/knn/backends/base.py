"""The interface every neighbour-search backend implements, and the options they read.

A backend is a stateless object with two entry points: :meth:`SearchBackend.search` (one query
set against one reference set) and :meth:`SearchBackend.grouped` (each point among its own
group). The default ``search`` is a template: fetch candidate indices (:meth:`candidates`),
recompute their exact distances and sort by them (:func:`~myriad.entropy.knn.neighbors.rerank`),
then drop each point from its own list by index; a backend overrides only the steps it does
differently. The default ``grouped`` runs one search per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.neighbors import Neighbors, drop_self, oversample, rerank
from myriad.entropy.knn.selection import faiss_available


@dataclass(frozen=True)
class SearchOptions:
    """The settings of :class:`~myriad.entropy.knn.KNNSearch` that backends read (documented
    there)."""

    memory_budget: int
    pq_k_factor: int
    ivf_nlist: int | None
    ivf_nprobe: int | None
    hnsw_m: int
    hnsw_ef_search: int | None
    seed: int


class SearchBackend:
    """One way of finding k nearest neighbours.

    Class attributes:
        name: the ``backend=`` string that selects it.
        approximate: may miss true neighbours (rows it leaves short go through :meth:`repair`).
        needs_faiss: raises ``ImportError`` with the install hint when faiss is missing.
        centred: inputs are centred by the reference mean before the search. Backends that rank
            by the ``|q|^2 + |r|^2 - 2 q.r`` expansion need it for data far from the origin;
            distances are translation invariant.
        expansion: ranks with that expansion, whose float32 rounding can swap near-tied
            neighbours, so it fetches ``2k`` candidates that are then re-ranked exactly.
        returns_self: a self-query returns each point among its own results (removed by index
            afterwards, so one more candidate is fetched).
    """

    name: ClassVar[str]
    approximate: ClassVar[bool] = False
    needs_faiss: ClassVar[bool] = False
    centred: ClassVar[bool] = True
    expansion: ClassVar[bool] = False
    returns_self: ClassVar[bool] = True

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The (centred) points in the dtype this backend computes in; default unchanged."""
        return x

    def candidates(
        self, q: torch.Tensor, r: torch.Tensor, kk: int, self_query: bool, options: SearchOptions
    ) -> torch.Tensor:
        """``[Nq, kk]`` int64 candidate rows of ``r`` on ``q``'s device, in no guaranteed order
        (-1 where an approximate index found fewer)."""
        raise NotImplementedError(f"backend {self.name!r} does not return candidates")

    def repair(self, q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, kk: int) -> torch.Tensor:
        """Candidate rows with missing entries (-1) replaced by exact results; exact backends
        never leave any, so the default returns ``idx`` unchanged."""
        return idx

    def ranked(
        self, q: torch.Tensor, r: torch.Tensor, kk: int, self_query: bool, options: SearchOptions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``kk`` neighbours per query, ``(distances, indices)`` ``[Nq, kk]`` sorted by exact
        distance (each point possibly among its own results when ``returns_self``)."""
        idx = self.repair(q, r, self.candidates(q, r, kk, self_query, options), kk)
        # Ranking by recomputed distances before dropping the point itself keeps the k nearest.
        return rerank(q, r, idx, options.memory_budget)

    def search(
        self, q: torch.Tensor, r: torch.Tensor, k: int, self_query: bool, options: SearchOptions
    ) -> Neighbors:
        """k nearest neighbours of ``q [Nq, p]`` in ``r [Nr, p]`` (``r is q`` for a self-query,
        each point excluded by index); inputs already centred and prepared."""
        if self.needs_faiss and not faiss_available():
            raise ImportError(
                f"backend {self.name!r} needs faiss: pip install faiss-cpu "
                "(or faiss-gpu, see docs/install.md), or use backend='torch'"
            )
        n_avail = r.shape[0] - (1 if self_query else 0)
        drop = self_query and self.returns_self
        kk = oversample(k, n_avail) if self.expansion else k
        if drop:
            kk += 1
        dist, idx = self.ranked(q, r, kk, self_query, options)
        if drop:
            dist, idx = drop_self(dist, idx, torch.arange(q.shape[0], device=q.device))
        return Neighbors(dist[:, :k].contiguous(), idx[:, :k].contiguous())

    def grouped(
        self, x: torch.Tensor, k: int, layout: GroupLayout, options: SearchOptions
    ) -> Neighbors:
        """k nearest neighbours of each row of ``x [N, p]`` among its own group.

        Default: one search per group. faiss has no batched multi-index query, and shifting
        groups apart along an extra coordinate (as the kd-tree does) would destroy the float32
        precision of the ``|q|^2 + |r|^2 - 2 q.r`` distances.
        """
        n = x.shape[0]
        dist = torch.empty(n, k, dtype=torch.float32, device=x.device)
        idx = torch.empty(n, k, dtype=torch.int64, device=x.device)
        xs = layout.sort(x)
        for s, m in zip(layout.starts.tolist(), layout.sizes.tolist()):
            block = xs[s : s + m]
            if self.centred:
                block = (block - block.mean(dim=0)).contiguous()
            block = self.prepare(block)
            nb = self.search(block, block, k, True, options)
            dist[s : s + m] = nb.distances
            idx[s : s + m] = nb.indices + s
        return layout.unsort(dist, idx)

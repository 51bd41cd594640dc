"""``"torch"``: exact brute force on any device, in tiles whose distance block stays within
``memory_budget`` bytes, so no ``N x N`` matrix is ever formed beyond that budget. Per-group
search is one batched block-diagonal kernel over all groups (no loop over groups)."""

from __future__ import annotations

from typing import ClassVar

import torch

from myriad.entropy.knn.backends.base import SearchBackend, SearchOptions
from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.neighbors import Neighbors, oversample, rerank


def block_search(
    q: torch.Tensor,
    r: torch.Tensor,
    r_sq: torch.Tensor,
    k: int,
    self_query: bool,
    memory_budget: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched exact top-k: ``q [G, Nq, p]`` against ``r [G, Nr, p]`` for each of G groups.

    ``r_sq [G, Nr]`` holds ``|r|^2`` with ``+inf`` on padding columns, which are then never
    selected. Distances in the tile are ``|r|^2 - 2 q.r`` (the per-row constant ``|q|^2`` does not
    change the ranking). On a self-query the diagonal is set to ``+inf``, which excludes each
    point by index. Tiles of ``[G', Bq, Br]`` stay within ``memory_budget`` bytes (the tile and
    one temporary); reference chunks are merged with a running top-k when one row does not fit.

    Returns ``[G, Nq, k]`` selection scores and local indices (int64).
    """
    g_total, nq, _ = q.shape
    nr = r.shape[1]
    esize = q.element_size()
    per_elem = 2 * esize
    br = nr if nr * per_elem <= memory_budget else max(k, memory_budget // per_elem)
    rows_budget = max(1, memory_budget // (br * per_elem))
    bq = min(nq, rows_budget)
    bg = max(1, min(g_total, rows_budget // max(1, bq)))
    out_v = torch.empty(g_total, nq, k, dtype=q.dtype, device=q.device)
    out_i = torch.empty(g_total, nq, k, dtype=torch.int64, device=q.device)
    inf = float("inf")
    for g0 in range(0, g_total, bg):
        g1 = min(g_total, g0 + bg)
        for s in range(0, nq, bq):
            e = min(nq, s + bq)
            best_v: torch.Tensor | None = None
            best_i: torch.Tensor | None = None
            for c0 in range(0, nr, br):
                c1 = min(nr, c0 + br)
                tile = torch.baddbmm(
                    r_sq[g0:g1, None, c0:c1],
                    q[g0:g1, s:e],
                    r[g0:g1, c0:c1].transpose(1, 2),
                    alpha=-2.0,
                )
                if self_query:
                    # Element (i, j) is the point itself when s + i == c0 + j.
                    tile.diagonal(offset=s - c0, dim1=1, dim2=2).fill_(inf)
                kc = min(k, c1 - c0)
                v, i = torch.topk(tile, kc, dim=2, largest=False, sorted=False)
                i = i + c0
                if best_v is None or best_i is None:
                    best_v, best_i = v, i
                else:
                    v = torch.cat([best_v, v], dim=2)
                    i = torch.cat([best_i, i], dim=2)
                    kk = min(k, v.shape[2])
                    best_v, pos = torch.topk(v, kk, dim=2, largest=False, sorted=False)
                    best_i = i.gather(2, pos)
            # The reference tiles cover nr >= 1 rows, so the loop above ran at least once.
            assert best_v is not None and best_i is not None
            out_v[g0:g1, s:e] = best_v
            out_i[g0:g1, s:e] = best_i
    return out_v, out_i


class TorchBackend(SearchBackend):
    """Tiled brute force in torch; masks each point itself on the tile diagonal."""

    name: ClassVar[str] = "torch"
    expansion: ClassVar[bool] = True
    returns_self: ClassVar[bool] = False

    def candidates(
        self, q: torch.Tensor, r: torch.Tensor, kk: int, self_query: bool, options: SearchOptions
    ) -> torch.Tensor:
        r_sq = r.square().sum(dim=1)
        _, idx = block_search(q[None], r[None], r_sq[None], kk, self_query, options.memory_budget)
        return idx[0]

    def grouped(
        self, x: torch.Tensor, k: int, layout: GroupLayout, options: SearchOptions
    ) -> Neighbors:
        """Block-diagonal brute force: groups padded to ``[M, n_max, p]``, batched matmuls."""
        n, p = x.shape
        m_groups = layout.num_groups
        n_max = layout.max_size
        sizes = layout.sizes.to(x.device)
        if layout.equal_blocks:
            padded = x.reshape(m_groups, n_max, p)
            valid: torch.Tensor | None = None
        else:
            gid = layout.group_ids()
            pos = layout.position_in_group()
            padded = x.new_zeros(m_groups, n_max, p)
            padded[gid, pos] = x
            valid = torch.zeros(m_groups, n_max, dtype=torch.bool, device=x.device)
            valid[gid, pos] = True
        mean = padded.sum(dim=1) / sizes[:, None].to(x.dtype)
        padded = (padded - mean[:, None, :]).contiguous()
        sq = padded.square().sum(dim=2)
        if valid is not None:
            sq = sq.masked_fill(~valid, float("inf"))
        kk = oversample(k, layout.min_size - 1)
        _, local = block_search(padded, padded, sq, kk, True, options.memory_budget)
        starts = layout.starts.to(x.device)
        if layout.order is None:  # equal blocks: the rows are already in group order
            flat = (local + starts[:, None, None]).reshape(n, kk)
        else:
            gid = layout.group_ids()
            pos = layout.position_in_group()
            # local index j of group g -> the j-th point of g in sorted order -> row of x
            sorted_rows = local[gid, pos] + starts[gid][:, None]
            flat = layout.order[sorted_rows]
        dist, idx = rerank(x, x, flat, options.memory_budget)
        return Neighbors(dist[:, :k].contiguous(), idx[:, :k].contiguous())

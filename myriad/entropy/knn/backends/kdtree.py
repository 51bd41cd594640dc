"""``"kdtree"``: scipy ``cKDTree`` (``workers=-1``). Exact; the fastest choice on CPU in low
dimension. The tree's distances come from float64 coordinate differences, so they are returned
as they are (no re-ranking) and the data is not centred.

Two things keep large low-dimensional searches fast without changing their results
(benchmarks/results/knn_share.json, docs/pretrain.md):

- the tree holds the distinct points only (:mod:`~myriad.entropy.knn.multiset`): a cluster of
  identical states would otherwise be one leaf that every query reaching it scans whole;
- queries are answered in the leaf order of a kd-tree (:func:`spatial_order`), so consecutive
  queries descend to the same leaves, whose points stay in cache.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from myriad.entropy.knn.backends.base import SearchBackend, SearchOptions
from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.multiset import DistinctRows, expand_cross, expand_self
from myriad.entropy.knn.neighbors import Neighbors, drop_self

#: Per-group search: one tree per group is faster than one tree over groups shifted apart
#: (0.10 vs 0.13 CPU-s at 2-D, 0.19 vs 0.33 at 4-D, 16 groups) while the per-call overhead is
#: small; beyond this many groups the single shifted tree is used.
KDTREE_LOOP_MAX_GROUPS = 64
#: From this many queries up they are answered in spatial order; below, the points of a search
#: fit in cache whatever the order, and ordering a separate query set costs a tree build.
KDTREE_ORDER_MIN_QUERIES = 4096


def spatial_order(points: np.ndarray) -> np.ndarray:
    """The rows of ``points [n, p]`` in the leaf order of a kd-tree over them (``[n]`` int64).

    The sliding-midpoint tree without node compaction is the cheapest to build; only its order
    is used.
    """
    from scipy.spatial import cKDTree

    tree = cKDTree(points, balanced_tree=False, compact_nodes=False)
    return np.asarray(tree.indices, dtype=np.int64)


def tree_query(
    ref: np.ndarray, qry: np.ndarray | None, kk: int, *, ordered: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The ``kk`` nearest rows of ``ref [Nr, p]`` for each query.

    Args:
        ref: float64 reference points.
        qry: float64 query points ``[Nq, p]``; None for ``ref`` itself (each point among its own
            results).
        kk: results per query.
        ordered: answer the queries in spatial order (from ``KDTREE_ORDER_MIN_QUERIES`` up).

    Returns:
        ``(dist, idx, order)``: ``dist [Nq, kk]`` float32 and ``idx [Nq, kk]`` int64 rows of
        ``ref``, row ``j`` answering query ``order[j]`` (``order`` None: query ``j``).
    """
    from scipy.spatial import cKDTree

    # The sliding-midpoint tree builds in about half the time of the median-split one and
    # answers the low-dimensional states of a rollout as fast.
    tree = cKDTree(ref, balanced_tree=False)
    points = ref if qry is None else qry
    order: np.ndarray | None = None
    if ordered and len(points) >= KDTREE_ORDER_MIN_QUERIES:
        order = np.asarray(tree.indices, dtype=np.int64) if qry is None else spatial_order(points)
        points = points[order]
    found_d, found_i = tree.query(points, k=kk, workers=-1)
    dist = np.asarray(found_d, dtype=np.float32).reshape(len(points), kk)
    idx = np.asarray(found_i, dtype=np.int64).reshape(len(points), kk)
    return dist, idx, order


class KDTreeBackend(SearchBackend):
    """Exact search with scipy's ``cKDTree``.

    Class attributes:
        merge_duplicates: search among the distinct points and expand copies afterwards.
        ordered: answer queries in spatial order (from ``KDTREE_ORDER_MIN_QUERIES`` queries).
    """

    name: ClassVar[str] = "kdtree"
    centred: ClassVar[bool] = False
    merge_duplicates: ClassVar[bool] = True
    ordered: ClassVar[bool] = True

    def self_neighbours(self, points: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(distances [n, k], indices [n, k])`` of each row of ``points [n, p]`` (float64)
        among the others, in row order."""
        n = points.shape[0]
        if self.merge_duplicates:
            distinct = DistinctRows.find(points)
            if k + 1 <= distinct.num_distinct < n:
                dist, idx, order = tree_query(distinct.points, None, k + 1, ordered=self.ordered)
                row_of = np.arange(len(idx))
                if order is not None:
                    row_of = np.empty_like(order)
                    row_of[order] = np.arange(len(order))
                found = expand_self(dist, idx, row_of, distinct, k)
                if found is not None:
                    return found
        dist, idx, order = tree_query(points, None, k + 1, ordered=self.ordered)
        # Row j answers point order[j]: the point itself is dropped by that index.
        own = order if order is not None else np.arange(n)
        d_t, i_t = drop_self(torch.from_numpy(dist), torch.from_numpy(idx), torch.from_numpy(own))
        return _in_row_order(d_t.numpy(), i_t.numpy(), order)

    def cross_neighbours(
        self, queries: np.ndarray, ref: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(distances [Nq, k], indices [Nq, k])``: the ``k`` nearest rows of ``ref [Nr, p]``
        for each row of ``queries [Nq, p]`` (float64), in query order."""
        if self.merge_duplicates:
            distinct = DistinctRows.find(ref)
            if k <= distinct.num_distinct < ref.shape[0]:
                found = tree_query(distinct.points, queries, k, ordered=self.ordered)
                return expand_cross(*_in_row_order(*found), distinct, k)
        return _in_row_order(*tree_query(ref, queries, k, ordered=self.ordered))

    def search(
        self, q: torch.Tensor, r: torch.Tensor, k: int, self_query: bool, options: SearchOptions
    ) -> Neighbors:
        ref = r.detach().to("cpu", torch.float64).numpy()
        if self_query:
            dist, idx = self.self_neighbours(ref, k)
        else:
            dist, idx = self.cross_neighbours(q.detach().to("cpu", torch.float64).numpy(), ref, k)
        return Neighbors(
            torch.from_numpy(np.ascontiguousarray(dist)).to(q.device),
            torch.from_numpy(np.ascontiguousarray(idx)).to(q.device),
        )

    def grouped(
        self, x: torch.Tensor, k: int, layout: GroupLayout, options: SearchOptions
    ) -> Neighbors:
        """Per-group kd-tree search, with tree distances (exact, float64 differences) as output.

        Up to ``KDTREE_LOOP_MAX_GROUPS`` groups: one self-query per group (:meth:`self_neighbours`,
        measured faster). Beyond: one tree over all groups, each shifted along an extra
        coordinate by more than the data's diameter, so no neighbour list can cross groups;
        inside a group the shift cancels exactly.
        """
        n = x.shape[0]
        pts = layout.sort(x).detach().to("cpu", torch.float64).numpy()
        if layout.num_groups <= KDTREE_LOOP_MAX_GROUPS:
            dist = np.empty((n, k), dtype=np.float32)
            idx = np.empty((n, k), dtype=np.int64)
            for s, m in zip(layout.starts.tolist(), layout.sizes.tolist()):
                d, i = self.self_neighbours(pts[s : s + m], k)
                dist[s : s + m] = d
                idx[s : s + m] = i + s
        else:
            span = float(np.linalg.norm(pts.max(axis=0) - pts.min(axis=0)))
            gid = np.repeat(np.arange(layout.num_groups), layout.sizes.numpy())
            aug = np.concatenate([pts, (gid * (2.0 * span + 1.0))[:, None]], axis=1)
            dist, idx = self.self_neighbours(aug, k)
        # Rows are in group-sorted order here; indices are rows of that order.
        return layout.unsort(
            torch.from_numpy(np.ascontiguousarray(dist)).to(x.device),
            torch.from_numpy(np.ascontiguousarray(idx)).to(x.device),
        )


def _in_row_order(
    dist: np.ndarray, idx: np.ndarray, order: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Results whose row ``j`` answers query ``order[j]`` -> row ``i`` answering query ``i``."""
    if order is None:
        return dist, idx
    out_d = np.empty_like(dist)
    out_i = np.empty_like(idx)
    out_d[order] = dist
    out_i[order] = idx
    return out_d, out_i

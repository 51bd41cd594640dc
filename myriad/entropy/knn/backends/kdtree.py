"""``"kdtree"``: pykdtree's ``KDTree`` (queries spread over the cores with OpenMP). Exact; the
fastest choice on CPU in low dimension. The tree's distances come from float64 coordinate
differences, so they are returned as they are (no re-ranking) and the data is not centred.

Three things keep large low-dimensional searches fast without changing their results
(benchmarks/results/knn_share_pykdtree.json, docs/pretrain.md):

- the tree holds the distinct points only (:mod:`~myriad.entropy.knn.multiset`): a cluster of
  identical states would otherwise be one leaf that every query reaching it scans whole;
- queries are answered in Z order (:func:`~myriad.entropy.knn.multiset.spatial_order`), so
  consecutive queries descend to the same leaves, whose points stay in cache;
- queries go in chunks of ``QUERY_CHUNK`` rows, whose float64 results are small enough for the
  allocator to reuse one chunk's memory for the next instead of mapping fresh pages.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from myriad.entropy.knn.backends.base import SearchBackend, SearchOptions
from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.multiset import DistinctRows, expand_cross, expand_self, spatial_order
from myriad.entropy.knn.neighbors import Neighbors, drop_self
from myriad.utils.threads import openmp_threads, search_threads

#: Per-group search: one tree per group is faster than one tree over groups shifted apart
#: (0.10 vs 0.13 CPU-s at 2-D, 0.19 vs 0.33 at 4-D, 16 groups) while the per-call overhead is
#: small; beyond this many groups the single shifted tree is used.
KDTREE_LOOP_MAX_GROUPS = 64
#: From this many queries up they are answered in spatial order; below, the points of a search
#: fit in cache whatever the order.
KDTREE_ORDER_MIN_QUERIES = 4096
#: Queries per call of the tree: the float64 distances of 65,536 queries with k + 1 = 11 take
#: 5.8 MB.
QUERY_CHUNK = 1 << 16


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
    from pykdtree.kdtree import KDTree

    tree = KDTree(ref)
    points = ref if qry is None else qry
    order: np.ndarray | None = None
    if ordered and len(points) >= KDTREE_ORDER_MIN_QUERIES:
        order = spatial_order(points)
        points = points[order]
    n = len(points)
    dist = np.empty((n, kk), dtype=np.float32)
    idx = np.empty((n, kk), dtype=np.int64)
    for s in range(0, n, QUERY_CHUNK):
        e = min(n, s + QUERY_CHUNK)
        found_d, found_i = tree.query(points[s:e], k=kk)
        dist[s:e] = found_d.reshape(e - s, kk)
        idx[s:e] = found_i.reshape(e - s, kk)
    return dist, idx, order


class KDTreeBackend(SearchBackend):
    """Exact search with pykdtree's ``KDTree``.

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
            if k + 1 <= distinct.num_distinct <= n:
                # The distinct points are in Z order already.
                dist, idx, _ = tree_query(distinct.points, None, k + 1, ordered=False)
                found = expand_self(dist, idx, distinct, k)
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
            if k <= distinct.num_distinct <= ref.shape[0]:
                found = tree_query(distinct.points, queries, k, ordered=self.ordered)
                return expand_cross(*_in_row_order(*found), distinct, k)
        return _in_row_order(*tree_query(ref, queries, k, ordered=self.ordered))

    def search(
        self, q: torch.Tensor, r: torch.Tensor, k: int, self_query: bool, options: SearchOptions
    ) -> Neighbors:
        ref = r.detach().to("cpu", torch.float64).numpy()
        with openmp_threads(search_threads()):
            if self_query:
                dist, idx = self.self_neighbours(ref, k)
            else:
                queries = q.detach().to("cpu", torch.float64).numpy()
                dist, idx = self.cross_neighbours(queries, ref, k)
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
        with openmp_threads(search_threads()):
            dist, idx = self._grouped(
                layout.sort(x).detach().to("cpu", torch.float64).numpy(), k, layout
            )
        # Rows are in group-sorted order here; indices are rows of that order.
        return layout.unsort(
            torch.from_numpy(np.ascontiguousarray(dist)).to(x.device),
            torch.from_numpy(np.ascontiguousarray(idx)).to(x.device),
        )

    def _grouped(
        self, pts: np.ndarray, k: int, layout: GroupLayout
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`grouped` on the group-sorted float64 points ``[N, p]``."""
        n = pts.shape[0]
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
        return dist, idx


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

"""Neighbour search among the distinct points of a set with repeated points.

Bounded environments stack states exactly (a point mass pushed into a corner stops at the same
position every time): a rollout of the maze holds clusters of thousands of identical states. A
kd-tree cannot split identical points, so such a cluster becomes one leaf that every query
reaching it scans whole. Searching the distinct points instead and expanding each neighbour by
its number of copies gives the same neighbours at a fraction of the cost.

- :func:`spatial_key` / :func:`spatial_order`: the Z order (Morton code) of points, which keeps
  points near in space near in memory: queries answered in that order reuse the tree nodes the
  previous ones brought into cache.
- :class:`DistinctRows`: the distinct rows of ``[N, p]`` points in Z order, their copy counts
  and where the copies are.
- :func:`expand_self`: a self-query's ``k`` nearest neighbours of every row (itself excluded by
  index) from the ``k + 1`` nearest distinct points of each distinct point.
- :func:`expand_cross`: the ``k`` nearest reference rows of each query from its ``k`` nearest
  distinct reference points.

Distances are those of the distinct points, so they are exactly those of a search over all rows;
indices differ only in which of several copies tied at the same distance are listed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The multipliers of the splitmix64 finaliser, which mixes every input bit into every output bit.
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_TOP_BIT = np.uint64(1 << 63)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on ``uint64`` values (products wrap modulo 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


def row_hash(points: np.ndarray) -> np.ndarray:
    """``[N]`` uint64 hash of the bits of each row of ``points [N, p]`` (float64): equal rows
    hash equal, different rows almost never do."""
    bits = np.ascontiguousarray(points, dtype=np.float64).view(np.uint64)
    key = _mix(bits[:, 0])
    for j in range(1, bits.shape[1]):
        key = _mix(key ^ bits[:, j])
    return key


def _spread_table(dims: int) -> np.ndarray:
    """``[256]`` uint64: bit ``b`` of each byte value moved to bit ``b * dims``."""
    values = np.arange(256, dtype=np.uint64)
    table = np.zeros(256, dtype=np.uint64)
    for b in range(8):
        table |= ((values >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * dims)
    return table


def spatial_key(points: np.ndarray) -> np.ndarray:
    """``[N]`` uint64 Morton code of ``points [N, p]``: each coordinate quantised to
    ``min(64 // p, 16)`` bits over the points' range, the bits of the coordinates interleaved.

    Equal rows get equal keys; different rows share a key only when they fall in one cell of
    that resolution (the order among them is then another sort's business).
    """
    n, p = points.shape
    bits = min(64 // p, 16) if p > 0 else 0
    key = np.zeros(n, dtype=np.uint64)
    if n == 0 or bits == 0:
        return key
    # One reduction per column: numpy reduces a narrow [N, p] array along axis 0 ten times
    # slower.
    lo = np.array([points[:, j].min() for j in range(p)])
    span = np.array([points[:, j].max() for j in range(p)]) - lo
    top = float(2**bits - 1)
    scale = np.divide(top, span, out=np.zeros_like(span), where=span > 0)
    # Only the order depends on the key: an overflowing span (coordinates near the float64
    # limit) leaves a coarser order, not a wrong result.
    with np.errstate(over="ignore", invalid="ignore"):
        cells = np.minimum((points - lo) * scale, top)
    cells[~np.isfinite(cells)] = 0.0
    # The little-endian bytes of each 16-bit cell index, spread by a table lookup each.
    cell_bytes = cells.astype("<u2").view(np.uint8).reshape(n, p, 2)
    table = _spread_table(p)
    for j in range(p):
        for b in range((bits + 7) // 8):
            key |= np.take(table, cell_bytes[:, j, b]) << np.uint64(8 * b * p + j)
    return key


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``[N]`` int64 stable argsort of uint64 ``keys`` (torch's radix sort: about 4x numpy's
    stable sort at 500k keys)."""
    # Flipping the top bit makes the int64 view order like the unsigned values.
    signed = (keys ^ _TOP_BIT).view(np.int64)
    return torch.from_numpy(signed).argsort(stable=True).numpy()


def spatial_order(points: np.ndarray) -> np.ndarray:
    """``[N]`` int64: the rows of ``points [N, p]`` in Z order (ties in row order)."""
    return stable_argsort(spatial_key(points))


@dataclass(frozen=True)
class DistinctRows:
    """The distinct rows of a point set, in Z order.

    Attributes:
        points: ``[U, p]`` the distinct rows (float64), in Z order (:func:`spatial_order`).
        inverse: ``[N]`` int64 distinct id of each row.
        counts: ``[U]`` int64 copies of each distinct row.
        starts: ``[U]`` int64 offset of each distinct row's copies in ``rows``.
        rows: ``[N]`` int64 row ids grouped by distinct point: the copies of ``u`` are
            ``rows[starts[u] : starts[u] + counts[u]]``, in row order.
    """

    points: np.ndarray
    inverse: np.ndarray
    counts: np.ndarray
    starts: np.ndarray
    rows: np.ndarray

    @property
    def num_distinct(self) -> int:
        return int(self.points.shape[0])

    @staticmethod
    def find(x: np.ndarray) -> DistinctRows:
        """The distinct rows of ``x [N, p]`` (compared in float64).

        Rows are sorted by their Z-order key and, among equal keys, by a hash of their bits
        (two stable sorts), and equal neighbours in that order are merged: copies of a point
        are adjacent, and the distinct points come out in Z order, the order the tree answers
        them fastest in. Two different rows with the same key and hash interleaved in the sort
        would leave a point listed as two distinct rows, which the callers detect
        (:func:`expand_self`) or which does not matter (:func:`expand_cross`).
        """
        # Adding 0.0 turns -0.0 into 0.0, so equal values have equal bits.
        pts = np.ascontiguousarray(x, dtype=np.float64) + 0.0
        n = pts.shape[0]
        order = stable_argsort(row_hash(pts))
        order = order[stable_argsort(spatial_key(pts)[order])]
        grouped = pts[order]
        new = np.ones(n, dtype=bool)
        new[1:] = (grouped[1:] != grouped[:-1]).any(axis=1)
        starts = np.flatnonzero(new)
        counts = np.diff(starts, append=n)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.cumsum(new) - 1
        return DistinctRows(grouped[starts], inverse, counts, starts, order)

    def first_rows(self) -> np.ndarray:
        """``[U]`` the first row holding each distinct point."""
        return self.rows[self.starts]

    def copy_rank(self, rows: np.ndarray) -> np.ndarray:
        """The rank of each of ``rows`` among the copies of its point."""
        where = np.empty_like(self.rows)
        where[self.rows] = np.arange(len(self.rows))
        return where[rows] - self.starts[self.inverse[rows]]


def _slots(counts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Output column ``t < k`` of a row whose neighbour slots hold ``counts [R, c]`` copies each:
    ``(slot [R, k], copy [R, k])``, the slot it falls in and its rank among that slot's copies."""
    cum = counts.cumsum(axis=1)
    col = np.arange(k)
    # Slot of column t: the number of slots that end at or before t.
    slot = (cum[:, None, :] <= col[None, :, None]).sum(axis=2)
    before = np.where(slot > 0, np.take_along_axis(cum, np.maximum(slot - 1, 0), axis=1), 0)
    return slot, col[None, :] - before


def expand_self(
    dist: np.ndarray, idx: np.ndarray, distinct: DistinctRows, k: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """k nearest neighbours of every row, itself excluded by index, from a self-query of the
    distinct points.

    Args:
        dist: ``[U, k + 1]`` float32 ascending distances from distinct point ``u`` (row ``u``)
            to its ``k + 1`` nearest distinct points, itself first.
        idx: ``[U, k + 1]`` int64 their distinct ids.
        distinct: the distinct rows.
        k: neighbours per row.

    Returns:
        ``(distances [N, k], indices [N, k])`` in row order, or None when some distinct point
        was not listed first among its own results (a point listed twice, see
        :meth:`DistinctRows.find`): the caller then searches all rows.
    """
    if not np.array_equal(idx[:, 0], np.arange(distinct.num_distinct)):
        return None
    # Most rows have no copies and neither have their neighbours: then column j + 1 of their
    # point's result is their j-th neighbour. torch's row gathers run several times faster than
    # numpy's here, and spread over the threads.
    d_t, i_t = torch.from_numpy(dist), torch.from_numpy(idx)
    inverse = torch.from_numpy(distinct.inverse)
    out_d = d_t[:, 1:].index_select(0, inverse).numpy()
    first_rows = torch.from_numpy(distinct.first_rows())
    out_i = first_rows[i_t[:, 1:].index_select(0, inverse)].numpy()
    has_copies = torch.from_numpy(distinct.counts != 1)
    mixed = torch.nonzero(has_copies[i_t].any(dim=1)).flatten().numpy()
    if len(mixed) == 0:
        return out_d, out_i
    counts = distinct.counts[idx[mixed]]  # [R, k + 1] copies behind each listed point
    counts[:, 0] -= 1  # the copies of the point itself, without the querying row
    slot, copy = _slots(counts, k)
    point = np.take_along_axis(idx[mixed], slot, axis=1)
    position = distinct.starts[point] + copy  # in distinct.rows, before skipping the row itself
    # The rows whose point is one of `mixed`, and their rank among the copies of their point:
    # in slot 0 the copies from that rank on move up by one.
    which = np.full(distinct.num_distinct, -1, dtype=np.int64)
    which[mixed] = np.arange(len(mixed))
    rows = np.flatnonzero(which[distinct.inverse] >= 0)
    j = which[distinct.inverse[rows]]
    rank = distinct.copy_rank(rows)
    skip = (slot[j] == 0) & (copy[j] >= rank[:, None])
    out_d[rows] = np.take_along_axis(dist[mixed], slot, axis=1)[j]
    out_i[rows] = distinct.rows[position[j] + skip]
    return out_d, out_i


def expand_cross(
    dist: np.ndarray, idx: np.ndarray, distinct: DistinctRows, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest reference rows of each query from its ``k`` nearest distinct reference points.

    Args:
        dist: ``[Nq, k]`` float32 ascending distances to the nearest distinct points.
        idx: ``[Nq, k]`` int64 their distinct ids.
        distinct: the distinct rows of the reference set.
        k: neighbours per query.

    Returns:
        ``(distances [Nq, k], indices [Nq, k])``, indices rows of the reference set.
    """
    counts = distinct.counts[idx]
    out_d = dist.copy()
    out_i = distinct.first_rows()[idx]
    mixed = np.flatnonzero((counts != 1).any(axis=1))
    if len(mixed) == 0:
        return out_d, out_i
    slot, copy = _slots(counts[mixed], k)
    point = np.take_along_axis(idx[mixed], slot, axis=1)
    out_d[mixed] = np.take_along_axis(dist[mixed], slot, axis=1)
    out_i[mixed] = distinct.rows[distinct.starts[point] + copy]
    return out_d, out_i

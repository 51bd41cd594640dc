"""The 4-bit product quantiser behind the ``"faiss-pq"`` backend.

Up to 128 features there is one sub-quantizer per feature: its 16 levels are a 1-D k-means
(Lloyd-Max) fitted here for every feature at once (:func:`feature_levels`), and the codes are
found by bisection (:func:`feature_codes`) in the byte layout of faiss's ``IndexPQ``, which then
packs and scans them. Above 128 features, pairs of features share a sub-quantizer trained by faiss
(:func:`pq_subquantizers`).
"""

from __future__ import annotations

import numpy as np
import torch

#: Points the ``"faiss-pq"`` quantisation levels are fitted on (128 per level).
PQ_TRAIN_POINTS = 2048
#: Lloyd iterations at most when fitting them (they usually settle in 20-40).
PQ_LLOYD_MAX_ITERS = 100
#: Rows encoded at a time by :func:`feature_codes`.
PQ_ENCODE_CHUNK_ROWS = 65536


def pq_subquantizers(dim: int) -> tuple[int, int]:
    """``(M, padded_dim)`` of the 4-bit fast-scan code used by ``"faiss-pq"``.

    One sub-quantizer per feature (16 levels each) up to 128 features; above that, pairs of
    features, which halves the scan (one table lookup per sub-quantizer and point) but lowers the
    recall (0.88 instead of 0.99 at p = 65, N = 3,000).
    """
    if dim <= 128:
        return dim, dim
    m = (dim + 1) // 2
    return m, 2 * m


def feature_levels(
    points: torch.Tensor, levels: int = 16, max_iters: int = PQ_LLOYD_MAX_ITERS
) -> torch.Tensor:
    """Per-feature 1-D k-means (Lloyd-Max) quantisation levels, for all features at once.

    Each feature's levels minimise the mean squared error of rounding that feature to its nearest
    level. On sorted samples the nearest level splits the samples at level midpoints, so one
    Lloyd step is a ``searchsorted`` and two prefix-sum lookups for every feature together.
    Starts from the quantiles at ``(j + 1/2) / levels`` and stops when no level moves.

    Args:
        points: samples ``[n, p]``.
        levels: levels per feature.
        max_iters: Lloyd iterations at most.

    Returns:
        ``[p, levels]`` float32 levels (non-decreasing along each row).
    """
    xs = points.detach().to("cpu", torch.float64).sort(dim=0).values.T.contiguous()  # [p, n]
    p, n = xs.shape
    prefix = torch.cat([xs.new_zeros(p, 1), xs.cumsum(dim=1)], dim=1)  # [p, n + 1]
    start = ((torch.arange(levels, dtype=torch.float64) + 0.5) * n / levels).long()
    centres = xs[:, start.clamp_max(n - 1)]
    first = torch.zeros(p, 1, dtype=torch.long)
    last = torch.full((p, 1), n, dtype=torch.long)
    for _ in range(max_iters):
        cuts = torch.searchsorted(xs, (centres[:, 1:] + centres[:, :-1]) / 2)  # [p, levels - 1]
        edges = torch.cat([first, cuts, last], dim=1)
        count = edges.diff(dim=1)
        total = prefix.gather(1, edges[:, 1:]) - prefix.gather(1, edges[:, :-1])
        # An empty level (a constant or a very discrete feature) keeps its value.
        moved = torch.where(count > 0, total / count.clamp_min(1), centres)
        if torch.equal(moved, centres):
            break
        centres = moved
    # Sorted, so that codes can be found by bisection even if an empty level fell out of order.
    return centres.sort(dim=1).values.to(torch.float32)


def feature_codes(
    x: torch.Tensor, levels: torch.Tensor, chunk_rows: int = PQ_ENCODE_CHUNK_ROWS
) -> np.ndarray:
    """faiss ``IndexPQ`` codes of ``x [n, p]`` for one 4-bit sub-quantizer per feature.

    The code of a value is the index of its nearest level (the lower one on a tie, as in faiss),
    i.e. the number of level midpoints below it. faiss packs two 4-bit codes per byte, the first
    feature in the low nibble.

    Args:
        x: points ``[n, p]``.
        levels: ``[p, 16]`` non-decreasing levels per feature (:func:`feature_levels`).
        chunk_rows: rows encoded at a time (bounds the temporaries to a few bytes per value of
            one chunk).

    Returns:
        ``[n, ceil(p / 2)]`` uint8 codes.
    """
    n, p = x.shape
    midpoints = (levels[:, 1:] + levels[:, :-1]) / 2  # [p, 15]
    out = np.empty((n, (p + 1) // 2), dtype=np.uint8)
    for start in range(0, n, chunk_rows):
        block = x[start : start + chunk_rows]
        codes = torch.searchsorted(midpoints, block.T.contiguous(), out_int32=True)
        codes = codes.T.to(torch.uint8)
        if p % 2:
            codes = torch.cat([codes, codes.new_zeros(codes.shape[0], 1)], dim=1)
        out[start : start + chunk_rows] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).numpy()
    return out

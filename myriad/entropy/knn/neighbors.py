"""The result of a neighbour search, input checks, and the steps every backend shares.

Every backend returns :class:`Neighbors`. The helpers here turn a backend's candidate indices
into that result: :func:`rerank` recomputes exact distances for the chosen pairs and sorts by
them, :func:`drop_self` removes each point from its own list by index, :func:`oversample` says
how many candidates an expansion-based backend fetches.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class Neighbors(NamedTuple):
    """k nearest neighbours of each query point.

    Attributes:
        distances: ``[Nq, k]`` float32 Euclidean distances (not squared), ascending per row.
        indices: ``[Nq, k]`` int64 indices into the reference set (for grouped queries: into the
            full point set, so ``x[indices]`` are the neighbours).
    """

    distances: torch.Tensor
    indices: torch.Tensor


def check_points(x: torch.Tensor, name: str) -> None:
    """Raise ``TypeError``/``ValueError`` (with the fix) unless ``x`` is a finite float ``[N, p]``
    tensor with ``p >= 1``; ``name`` is how the message calls it."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [N, p], got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [N, p], got {tuple(x.shape)}; reshape it first")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {x.dtype}; call .float() first")
    if x.shape[1] == 0:
        raise ValueError(f"{name} has 0 features (shape {tuple(x.shape)}); need p >= 1")
    if bool(torch.isfinite(x).all()):
        return
    bad = ~torch.isfinite(x).all(dim=1)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()[:5].tolist()
        raise ValueError(
            f"{name} has {int(bad.sum())} rows with NaN or inf (first rows: {rows}); "
            "drop or clip those rows first"
        )


def check_k(k: int, n_available: int, what: str) -> None:
    """Raise ``ValueError`` unless ``1 <= k <= n_available`` (``what`` names the candidate set)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > n_available:
        fix = "provide more points"
        if n_available >= 1:
            fix = f"use k <= {n_available} or {fix}"
        raise ValueError(f"k={k} but {what} has only {n_available} candidate neighbours; {fix}")


def drop_self(
    dist: torch.Tensor, idx: torch.Tensor, self_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove each row's own index from ``[n, c]`` sorted results, leaving ``c - 1`` columns.

    When the point is not among its results (more than ``c - 1`` exact duplicates tied at
    distance 0, or an approximate index that missed it), the last column is dropped instead: the
    remaining ones are then still neighbours other than the point itself.
    """
    n = idx.shape[0]
    # Exact search ranks a point first among its own results unless it has duplicates at
    # distance 0: those rows alone go through the general path, the rest lose their first column
    # (a gather over every row is a visible part of a low-dimensional kd-tree search).
    first = idx[:, 0] == self_index
    if bool(first.all()):
        return dist[:, 1:], idx[:, 1:]
    if n > 0 and bool(first.any()):
        rows = torch.nonzero(~first).flatten()
        out_d, out_i = dist[:, 1:].clone(), idx[:, 1:].clone()
        out_d[rows], out_i[rows] = drop_self(dist[rows], idx[rows], self_index[rows])
        return out_d, out_i
    return drop_self_anywhere(dist, idx, self_index)


def drop_self_anywhere(
    dist: torch.Tensor, idx: torch.Tensor, self_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`drop_self` for rows whose own index may sit in any column: one gather over every
    row of ``[n, c]`` (the last column is dropped where the index is absent)."""
    n, c = idx.shape
    is_self = idx == self_index[:, None]
    found = is_self.any(dim=1)
    pos = torch.where(found, is_self.to(torch.uint8).argmax(dim=1), c - 1)
    # Column j of the output is column j of the input before the dropped one, j + 1 after it.
    cols = torch.arange(c - 1, device=idx.device).expand(n, c - 1)
    cols = cols + (cols >= pos[:, None]).to(cols.dtype)
    return dist.gather(1, cols), idx.gather(1, cols)


def oversample(k: int, n_available: int) -> int:
    """Candidates fetched by the expansion backends: ``2k`` (at most all available points)."""
    return min(2 * k, n_available)


def pair_distances(
    q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, memory_budget: int
) -> torch.Tensor:
    """``||q[n] - r[idx[n, j]]||`` as ``[Nq, k]`` float32, in query chunks within the budget."""
    n, k = idx.shape
    p = q.shape[1]
    out = torch.empty(n, k, dtype=torch.float32, device=q.device)
    rows = max(1, memory_budget // max(1, k * p * q.element_size() * 2))
    for s in range(0, n, rows):
        e = min(n, s + rows)
        diff = r[idx[s:e]] - q[s:e, None, :]
        out[s:e] = torch.linalg.vector_norm(diff, dim=-1).to(torch.float32)
    return out


def rerank(
    q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, memory_budget: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact distances ``[Nq, c]`` for the candidate pairs ``idx [Nq, c]``, each row sorted by
    them (stable), with the indices in the same order."""
    dist = pair_distances(q, r, idx, memory_budget)
    dist, order = dist.sort(dim=1, stable=True)
    return dist, idx.gather(1, order)


def as_numpy32(x: torch.Tensor) -> np.ndarray:
    """A contiguous float32 host copy, the layout faiss reads."""
    return x.detach().to("cpu", torch.float32).contiguous().numpy()

"""k-nearest-neighbour search for entropy estimation: faiss, a kd-tree and a chunked torch kernel.

Every entry point returns :class:`Neighbors`: ``distances [Nq, k]`` float32 **Euclidean** (not
squared) distances in ascending order, and ``indices [Nq, k]`` int64 rows into the reference set,
both on the device of the query tensor.

Self-queries (no separate reference set) exclude each point *by index*, not by distance: a
duplicate of ``x`` is a legitimate neighbour at distance 0, while ``x`` itself never is.

Backends (``backend=``):

``"kdtree"``
    scipy ``cKDTree`` (``workers=-1``). Exact; the fastest choice on CPU in low dimension.
``"faiss"``
    exact brute force. On CUDA tensors with faiss-gpu installed, ``faiss.knn_gpu`` reads the torch
    tensors in place (``faiss.contrib.torch_utils``); otherwise CPU ``faiss.knn``.
``"faiss-pq"``
    approximate, CPU: every query scans *all* points through a 4-bit-per-feature product
    quantisation code (faiss fast scan, SIMD table lookups), and the ``pq_k_factor * (k + 1)``
    best candidates are re-ranked with exact distances. Up to 128 features, the 16 levels of
    each feature are a 1-D k-means fitted here (:func:`feature_levels`) and the codes found by
    bisection (:func:`feature_codes`); faiss packs and scans them. About 3x less work than exact
    brute force, recall >= 0.995 from p = 8 up on Gaussian data (docs/entropy.md); poor in 2-D,
    where the kd-tree is used anyway.
``"faiss-ivf"``
    approximate, CPU: an inverted file (``IndexIVFFlat``) that scans the ``nprobe`` lists nearest
    to each query. Trades a measured recall loss for speed in high dimension.
``"faiss-hnsw"``
    approximate, CPU: an HNSW graph (``IndexHNSWFlat``).
``"torch"``
    exact brute force on any device, in tiles whose distance block stays within
    ``memory_budget`` bytes, so no ``N x N`` matrix is ever formed beyond that budget.
``"auto"``
    :func:`select_backend`: by device, size and dimension (rule and measurements in
    docs/entropy.md).

Distances are recomputed from the coordinates of the selected pairs (``||q - r||``), so they do
not carry the cancellation error of the ``|q|^2 + |r|^2 - 2 q.r`` expansion that faiss and the
torch kernel use to *select* neighbours. Those two exact backends also fetch ``2k`` candidates
and keep the ``k`` nearest by recomputed distance, so float32 rounding cannot swap a near-tied
k-th neighbour, and inputs are centred before the expansion.

Every backend is deterministic for a given input (the approximate indexes use ``seed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

BACKENDS = ("auto", "faiss", "faiss-pq", "faiss-ivf", "faiss-hnsw", "kdtree", "torch")
APPROXIMATE_BACKENDS = ("faiss-pq", "faiss-ivf", "faiss-hnsw")

#: Default size of one block of pairwise distances in the torch backend (bytes).
DEFAULT_MEMORY_BUDGET = 256 * 2**20

# Auto-selection thresholds, from measurements on a 2-core CPU with Gaussian data at 65,536
# points, k = 10 (docs/entropy.md, `myriad bench knn`):
# the kd-tree is the fastest backend up to this dimension (1.2 CPU-s at p = 6, faiss-pq 1.8)...
KDTREE_MAX_DIM = 6
# ...and still beats exact brute force up to this one (3.8 CPU-s at p = 8, faiss flat 4-6).
KDTREE_EXACT_MAX_DIM = 8
# Up to this many query-reference pairs exact brute force costs under ~0.6 CPU-s: keep it exact.
EXACT_MAX_PAIRS = 2**28
# Per-group search in high dimension on CPU: the batched block-diagonal torch kernel matches or
# beats one faiss call per group up to this group size (and avoids a Python loop).
TORCH_GROUP_MAX_SIZE = 4096
# Per-group kd-tree search: one tree per group is faster than one tree over groups shifted apart
# (0.10 vs 0.13 CPU-s at 2-D, 0.19 vs 0.33 at 4-D, 16 groups) while the per-call overhead is
# small; beyond this many groups the single shifted tree is used.
KDTREE_LOOP_MAX_GROUPS = 64
# Backends that select neighbours with the |q|^2 + |r|^2 - 2 q.r expansion, whose float32
# rounding can swap near-tied neighbours: they fetch extra candidates, re-ranked exactly.
_EXPANSION_BACKENDS = ("faiss", "torch")
# faiss needs about 39 training points per inverted list for k-means.
_IVF_POINTS_PER_LIST = 39


class Neighbors(NamedTuple):
    """k nearest neighbours of each query point.

    Attributes:
        distances: ``[Nq, k]`` float32 Euclidean distances (not squared), ascending per row.
        indices: ``[Nq, k]`` int64 indices into the reference set (for grouped queries: into the
            full point set, so ``x[indices]`` are the neighbours).
    """

    distances: torch.Tensor
    indices: torch.Tensor


# --------------------------------------------------------------------------------------------
# validation


def _check_points(x: torch.Tensor, name: str) -> None:
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


def _check_k(k: int, n_available: int, what: str) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > n_available:
        fix = "provide more points"
        if n_available >= 1:
            fix = f"use k <= {n_available} or {fix}"
        raise ValueError(f"k={k} but {what} has only {n_available} candidate neighbours; {fix}")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kNN backend {backend!r}; choose one of {', '.join(BACKENDS)}")


# --------------------------------------------------------------------------------------------
# backend selection


def faiss_gpu_available() -> bool:
    """Whether faiss was built with GPU support and sees at least one GPU."""
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def select_backend(
    n_query: int,
    n_ref: int,
    dim: int,
    device: torch.device | str = "cpu",
    *,
    allow_approximate: bool = True,
) -> str:
    """The backend ``"auto"`` resolves to for one search of ``n_query`` against ``n_ref`` points.

    Rule (measurements in docs/entropy.md):

    - CUDA: ``"faiss"`` (GPU brute force) when faiss-gpu sees a GPU, else ``"torch"``.
    - CPU, ``dim <= KDTREE_MAX_DIM`` (6): ``"kdtree"``.
    - CPU, ``n_query * n_ref <= EXACT_MAX_PAIRS`` (2^28): exact, ``"kdtree"`` up to
      ``KDTREE_EXACT_MAX_DIM`` (8), else ``"faiss"``.
    - CPU, larger: ``"faiss-pq"`` (exhaustive 4-bit scan + exact re-ranking, measured recall
      >= 0.995 from p = 8 up) when ``allow_approximate``, else the exact choice above.

    Args:
        n_query: number of query points.
        n_ref: number of reference points.
        dim: feature dimension p.
        device: device of the data.
        allow_approximate: whether an approximate index may be chosen.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return "faiss" if faiss_gpu_available() else "torch"
    if device.type != "cpu":
        return "torch"
    if dim <= KDTREE_MAX_DIM:
        return "kdtree"
    exact = "kdtree" if dim <= KDTREE_EXACT_MAX_DIM else "faiss"
    if exact == "faiss" and not _faiss_available():
        exact = "torch"
    if n_query * n_ref <= EXACT_MAX_PAIRS or not allow_approximate or not _faiss_available():
        return exact
    return "faiss-pq"


def select_grouped_backend(
    max_group_size: int,
    dim: int,
    device: torch.device | str = "cpu",
    *,
    allow_approximate: bool = True,
) -> str:
    """The backend ``"auto"`` resolves to for a per-group search whose largest group has
    ``max_group_size`` points: :func:`select_backend` on that group, except that the batched
    block-diagonal torch kernel replaces one faiss call per group on CPU for groups up to
    ``TORCH_GROUP_MAX_SIZE`` (4096) points (measured), and always on CUDA (one batched kernel
    instead of M launches; not measured here, see docs/entropy.md)."""
    if torch.device(device).type == "cuda":
        return "torch"
    backend = select_backend(
        max_group_size, max_group_size, dim, device, allow_approximate=allow_approximate
    )
    if (
        backend == "faiss"
        and torch.device(device).type == "cpu"
        and max_group_size <= TORCH_GROUP_MAX_SIZE
    ):
        return "torch"
    return backend


# --------------------------------------------------------------------------------------------
# shared pieces


def _drop_self(
    dist: torch.Tensor, idx: torch.Tensor, self_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove each row's own index from ``[n, c]`` sorted results, leaving ``c - 1`` columns.

    When the point is not among its results (more than ``c - 1`` exact duplicates tied at
    distance 0, or an approximate index that missed it), the last column is dropped instead: the
    remaining ones are then still neighbours other than the point itself.
    """
    n, c = idx.shape
    is_self = idx == self_index[:, None]
    found = is_self.any(dim=1)
    pos = torch.where(found, is_self.to(torch.uint8).argmax(dim=1), c - 1)
    # Column j of the output is column j of the input before the dropped one, j + 1 after it.
    cols = torch.arange(c - 1, device=idx.device).expand(n, c - 1)
    cols = cols + (cols >= pos[:, None]).to(cols.dtype)
    return dist.gather(1, cols), idx.gather(1, cols)


def _oversample(k: int, n_available: int) -> int:
    """Candidates fetched by the expansion backends: ``2k`` (at most all available points)."""
    return min(2 * k, n_available)


def _pair_distances(
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


def _finish(q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, memory_budget: int) -> Neighbors:
    """Recompute exact distances for the chosen pairs and sort each row by them."""
    dist = _pair_distances(q, r, idx, memory_budget)
    dist, order = dist.sort(dim=1, stable=True)
    return Neighbors(dist, idx.gather(1, order))


def _as_numpy32(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float32).contiguous().numpy()


# --------------------------------------------------------------------------------------------
# backends on one (query, reference) pair; return k (+1 when self) candidates, indices int64 CPU
# or device tensors; distances are recomputed by the caller.


def _kdtree_search(q: torch.Tensor, r: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    from scipy.spatial import cKDTree

    ref = r.detach().to("cpu", torch.float64).numpy()
    qry = ref if q is r else q.detach().to("cpu", torch.float64).numpy()
    tree = cKDTree(ref)
    dist, idx = tree.query(qry, k=kk, workers=-1)
    dist = np.asarray(dist, dtype=np.float32).reshape(len(qry), kk)
    idx = np.asarray(idx, dtype=np.int64).reshape(len(qry), kk)
    return torch.from_numpy(dist), torch.from_numpy(idx)


_GPU_RESOURCES: dict[int, object] = {}
# faiss's GPU k-selection handles at most this many results per query.
_FAISS_GPU_MAX_K = 2048


def _faiss_gpu_resources(device_index: int) -> object:
    import faiss

    res = _GPU_RESOURCES.get(device_index)
    if res is None:
        res = faiss.StandardGpuResources()
        _GPU_RESOURCES[device_index] = res
    return res


def _faiss_flat_search(
    q: torch.Tensor, r: torch.Tensor, kk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    import faiss

    if q.is_cuda and faiss_gpu_available():
        if kk > _FAISS_GPU_MAX_K:
            raise ValueError(
                f"faiss on GPU returns at most {_FAISS_GPU_MAX_K} candidates per query and "
                f"{kk} were needed (2k + 1 for re-ranking); use backend='torch' for this k"
            )
        # The torch bridge hands device pointers to faiss: no host round trip, results stay on
        # the GPU in the current torch stream.
        import faiss.contrib.torch_utils

        device_index = q.device.index if q.device.index is not None else 0
        res = _faiss_gpu_resources(device_index)
        d2, idx = faiss.knn_gpu(
            res,
            q.detach().float().contiguous(),
            r.detach().float().contiguous(),
            kk,
            device=device_index,
        )
        return d2, idx
    qn = _as_numpy32(q)
    rn = qn if q is r else _as_numpy32(r)
    d2, idx = faiss.knn(qn, rn, kk)
    return torch.from_numpy(d2), torch.from_numpy(idx)


@dataclass(frozen=True)
class _ApproxParams:
    pq_k_factor: int
    ivf_nlist: int | None
    ivf_nprobe: int | None
    hnsw_m: int
    hnsw_ef_search: int | None
    seed: int


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


#: Points the ``"faiss-pq"`` quantisation levels are fitted on (128 per level).
PQ_TRAIN_POINTS = 2048
#: Lloyd iterations at most when fitting them (they usually settle in 20-40).
PQ_LLOYD_MAX_ITERS = 100
#: Rows encoded at a time by :func:`feature_codes`.
PQ_ENCODE_CHUNK_ROWS = 65536


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


def _faiss_pq_search(
    q: torch.Tensor, r: torch.Tensor, kk: int, params: _ApproxParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exhaustive 4-bit product-quantisation fast scan, then exact re-ranking.

    Every query scans *all* reference codes (no partition, so no region is skipped) with SIMD
    table lookups, keeps ``k_factor * kk`` candidates and re-ranks them with exact float32
    distances (``IndexRefineFlat``). Errors only arise when a true neighbour's quantised distance
    ranks below ``k_factor * kk`` others.

    Returns squared distances ``[Nq, kk]`` and indices ``[Nq, kk]`` (-1 where fewer were found).
    """
    import faiss

    qn = _as_numpy32(q)
    rn = qn if q is r else _as_numpy32(r)
    n, p = rn.shape
    m, padded = pq_subquantizers(p)
    n_train = min(n, PQ_TRAIN_POINTS)
    train_rows = np.arange(n)
    if n_train < n:
        train_rows = np.sort(np.random.default_rng(params.seed).choice(n, n_train, replace=False))
    if m == p:
        # One feature per sub-quantizer: its optimal levels are a 1-D k-means, fitted here for
        # every feature at once (~10 ms). faiss's trainer runs p separate k-means of 25
        # iterations, each a parallel region: 0.18 s of a 1.5 s search on two cores with
        # OMP_WAIT_POLICY=PASSIVE. Encoding is one searchsorted (faiss's per-value distance
        # calls cost ~0.07 s at 65,536 x 29); faiss packs the codes into its fast-scan layout.
        rt = torch.from_numpy(rn)
        levels = feature_levels(rt[torch.from_numpy(train_rows)])
        flat_pq = faiss.IndexPQ(p, m, 4)
        faiss.copy_array_to_vector(levels.numpy().ravel(), flat_pq.pq.centroids)
        flat_pq.is_trained = True
        flat_pq.add_sa_codes(feature_codes(rt, levels))
        index = faiss.IndexRefineFlat(faiss.IndexPQFastScan(flat_pq), faiss.swig_ptr(rn))
    else:
        if padded != p:
            rn = np.ascontiguousarray(np.pad(rn, ((0, 0), (0, padded - p))))
            qn = rn if q is r else np.pad(qn, ((0, 0), (0, padded - p)))
        index = faiss.IndexRefineFlat(faiss.IndexPQFastScan(padded, m, 4))
        train = rn[train_rows]
        if len(train) < 16:
            # faiss's k-means needs a point per centroid: repeat the few there are.
            train = np.resize(train, (16, padded))
        index.train(train)
        index.add(rn)
    index.k_factor = float(params.pq_k_factor)
    d2, idx = index.search(qn, kk)
    return torch.from_numpy(d2), torch.from_numpy(idx)


def ivf_parameters(
    n_ref: int, nlist: int | None = None, nprobe: int | None = None
) -> tuple[int, int]:
    """Inverted-file size used by ``"faiss-ivf"``: ``(nlist, nprobe)``.

    Defaults: ``nlist = 4 sqrt(n)`` lists (at most ``n / 39`` so k-means has enough points per
    list) and ``nprobe = nlist / 8`` (each query scans about 1/8 of the points). The recall and
    entropy error this gives are measured by ``myriad bench knn`` (docs/entropy.md).
    """
    if nlist is None:
        nlist = round(4 * math.sqrt(n_ref))
        nlist = max(1, min(nlist, n_ref // _IVF_POINTS_PER_LIST))
    nlist = max(1, min(int(nlist), n_ref))
    if nprobe is None:
        nprobe = max(1, nlist // 8)
    return nlist, max(1, min(int(nprobe), nlist))


def _faiss_ivf_search(
    q: torch.Tensor, r: torch.Tensor, kk: int, params: _ApproxParams
) -> tuple[torch.Tensor, torch.Tensor]:
    import faiss

    qn = _as_numpy32(q)
    rn = qn if q is r else _as_numpy32(r)
    n, p = rn.shape
    nlist, nprobe = ivf_parameters(n, params.ivf_nlist, params.ivf_nprobe)
    quantizer = faiss.IndexFlatL2(p)
    index = faiss.IndexIVFFlat(quantizer, p, nlist)
    index.cp.niter = 10
    index.cp.seed = params.seed
    index.cp.max_points_per_centroid = 64
    n_train = min(n, nlist * 64)
    if n_train < n:
        rng = np.random.default_rng(params.seed)
        train = rn[np.sort(rng.choice(n, n_train, replace=False))]
    else:
        train = rn
    index.train(train)
    index.add(rn)
    index.nprobe = nprobe
    d2, idx = index.search(qn, kk)
    return torch.from_numpy(d2), torch.from_numpy(idx)


def _faiss_hnsw_search(
    q: torch.Tensor, r: torch.Tensor, kk: int, params: _ApproxParams
) -> tuple[torch.Tensor, torch.Tensor]:
    import faiss

    qn = _as_numpy32(q)
    rn = qn if q is r else _as_numpy32(r)
    index = faiss.IndexHNSWFlat(rn.shape[1], params.hnsw_m)
    index.hnsw.efConstruction = 40
    index.add(rn)
    index.hnsw.efSearch = params.hnsw_ef_search or max(2 * kk, 32)
    d2, idx = index.search(qn, kk)
    return torch.from_numpy(d2), torch.from_numpy(idx)


def _torch_block_search(
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
            best_v = best_i = None
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
                if best_v is None:
                    best_v, best_i = v, i
                else:
                    v = torch.cat([best_v, v], dim=2)
                    i = torch.cat([best_i, i], dim=2)
                    kk = min(k, v.shape[2])
                    best_v, pos = torch.topk(v, kk, dim=2, largest=False, sorted=False)
                    best_i = i.gather(2, pos)
            out_v[g0:g1, s:e] = best_v
            out_i[g0:g1, s:e] = best_i
    return out_v, out_i


# --------------------------------------------------------------------------------------------
# the search object


@dataclass(frozen=True)
class KNNSearch:
    """k-nearest-neighbour search with a fixed configuration.

    Args:
        backend: ``"auto" | "faiss" | "faiss-pq" | "faiss-ivf" | "faiss-hnsw" | "kdtree" |
            "torch"``.
        memory_budget: bytes one block of pairwise distances may take in the torch backend
            (and the chunk size for recomputing distances).
        allow_approximate: whether ``"auto"`` may pick the approximate ``"faiss-pq"`` (large
            high-dimensional CPU queries).
        pq_k_factor: ``"faiss-pq"`` re-ranks ``pq_k_factor * (k + 1)`` candidates exactly.
        ivf_nlist: inverted lists for ``"faiss-ivf"`` (None: ``4 sqrt(N)``, see
            :func:`ivf_parameters`).
        ivf_nprobe: lists scanned per query (None: ``nlist / 8``).
        hnsw_m: graph degree for ``"faiss-hnsw"``.
        hnsw_ef_search: HNSW search breadth (None: ``max(2 (k + 1), 32)``).
        seed: seed of the sample the ``"faiss-pq"`` levels are fitted on and of the k-means
            that builds the inverted file.
    """

    backend: str = "auto"
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    allow_approximate: bool = True
    pq_k_factor: int = 4
    ivf_nlist: int | None = None
    ivf_nprobe: int | None = None
    hnsw_m: int = 32
    hnsw_ef_search: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _check_backend(self.backend)
        if int(self.memory_budget) <= 0:
            raise ValueError(
                f"memory_budget must be a positive number of bytes, got {self.memory_budget}"
            )

    @property
    def _approx(self) -> _ApproxParams:
        return _ApproxParams(
            self.pq_k_factor,
            self.ivf_nlist,
            self.ivf_nprobe,
            self.hnsw_m,
            self.hnsw_ef_search,
            self.seed,
        )

    def resolve(self, n_query: int, n_ref: int, dim: int, device: torch.device | str) -> str:
        """The concrete backend this configuration uses for a search of the given size."""
        if self.backend != "auto":
            return self.backend
        return select_backend(n_query, n_ref, dim, device, allow_approximate=self.allow_approximate)

    # -- one query set against one reference set -----------------------------------------

    def _candidates(
        self, backend: str, q: torch.Tensor, r: torch.Tensor, kk: int, self_query: bool
    ) -> torch.Tensor:
        """``kk`` candidate indices (int64, on q's device) per query, in no guaranteed order."""
        if backend == "torch":
            r_sq = r.square().sum(dim=1)
            _, idx = _torch_block_search(
                q[None], r[None], r_sq[None], kk, self_query, int(self.memory_budget)
            )
            return idx[0]
        if backend == "faiss":
            _, idx = _faiss_flat_search(q, r, kk)
        elif backend == "faiss-pq":
            _, idx = _faiss_pq_search(q, r, kk, self._approx)
        elif backend == "faiss-ivf":
            _, idx = _faiss_ivf_search(q, r, kk, self._approx)
        elif backend == "faiss-hnsw":
            _, idx = _faiss_hnsw_search(q, r, kk, self._approx)
        else:  # pragma: no cover - guarded by _check_backend
            raise ValueError(backend)
        return idx.to(q.device)

    def _search_centered(
        self, backend: str, q: torch.Tensor, r: torch.Tensor, k: int, self_query: bool
    ) -> Neighbors:
        """Search on centred data (``r is q`` for a self-query)."""
        self._require_faiss(backend)
        n_avail = r.shape[0] - (1 if self_query else 0)
        # The torch kernel masks the diagonal itself; the others return self among the results
        # and drop it by index.
        drop = self_query and backend != "torch"
        kk = _oversample(k, n_avail) if backend in _EXPANSION_BACKENDS else k
        if drop:
            kk += 1
        if backend == "kdtree":
            # The tree's distances are exact (float64 coordinate differences) and sorted.
            dist, idx = _kdtree_search(q, r, kk)
            dist, idx = dist.to(q.device), idx.to(q.device)
        elif backend == "faiss-pq" and q.dtype == torch.float32:
            d2, idx = _faiss_pq_search(q, r, kk, self._approx)
            if bool((idx < 0).any()):
                idx = self._repair_missing(q, r, idx.to(q.device), kk)
                dist, idx = _finish(q, r, idx, int(self.memory_budget))
            else:
                # The refinement stage ranks by sums of squared coordinate differences (not the
                # |q|^2 + |r|^2 - 2 q.r expansion), so its distances are final: recomputing them
                # would cost a fifth of the search.
                dist, idx = d2.clamp_min(0).sqrt().to(q.device), idx.to(q.device)
        else:
            idx = self._candidates(backend, q, r, kk, self_query)
            if backend in APPROXIMATE_BACKENDS:
                idx = self._repair_missing(q, r, idx, kk)
            # Ranking by recomputed distances before dropping keeps the k nearest.
            dist, idx = _finish(q, r, idx, int(self.memory_budget))
        if drop:
            dist, idx = _drop_self(dist, idx, torch.arange(q.shape[0], device=q.device))
        return Neighbors(dist[:, :k].contiguous(), idx[:, :k].contiguous())

    def _repair_missing(
        self, q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, kk: int
    ) -> torch.Tensor:
        """Rows where an approximate index found fewer than ``kk`` points get exact results."""
        bad = (idx < 0).any(dim=1)
        if not bool(bad.any()):
            return idx
        rows = torch.nonzero(bad).flatten()
        _, fixed = _faiss_flat_search(q[rows], r, kk)
        idx = idx.clone()
        idx[rows] = fixed.to(idx.device)
        return idx

    @staticmethod
    def _require_faiss(backend: str) -> None:
        if backend.startswith("faiss") and not _faiss_available():
            raise ImportError(
                f"backend {backend!r} needs faiss: pip install faiss-cpu "
                "(or faiss-gpu, see docs/install.md), or use backend='torch'"
            )

    def __call__(self, x: torch.Tensor, k: int, reference: torch.Tensor | None = None) -> Neighbors:
        """k nearest neighbours of each row of ``x``.

        Args:
            x: query points ``[Nq, p]``.
            k: neighbour count.
            reference: reference points ``[Nr, p]`` on the same device; None: ``x`` itself, with
                each point excluded from its own neighbours by index.

        Returns:
            :class:`Neighbors` with ``distances [Nq, k]`` (float32, Euclidean, not squared) and
            ``indices [Nq, k]`` (int64 rows of the reference set), on ``x``'s device.
        """
        _check_points(x, "x")
        self_query = reference is None
        if self_query:
            ref = x
            _check_k(k, x.shape[0] - 1, "x (excluding each point itself)")
        else:
            if isinstance(reference, torch.Tensor) and reference.device != x.device:
                raise ValueError(
                    f"x is on {x.device} but reference is on {reference.device}; "
                    "move both to one device with .to(device)"
                )
            _check_points(reference, "reference")
            if reference.shape[1] != x.shape[1]:
                raise ValueError(
                    f"x has {x.shape[1]} features but reference has {reference.shape[1]}; "
                    "both must be [*, p] with the same p"
                )
            ref = reference
            _check_k(k, ref.shape[0], "reference")
        backend = self.resolve(x.shape[0], ref.shape[0], x.shape[1], x.device)
        work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        q = x.detach().to(work_dtype)
        r = q if self_query else ref.detach().to(work_dtype)
        if backend != "kdtree":
            # Centring by the reference mean keeps the |q|^2 + |r|^2 - 2 q.r expansion accurate
            # for data far from the origin; distances are translation invariant.
            mean = r.mean(dim=0)
            q = (q - mean).contiguous()
            r = q if self_query else (r - mean).contiguous()
        if backend == "faiss" and q.is_cuda and faiss_gpu_available():
            q = q.float()
            r = q if self_query else r.float()
        return self._search_centered(backend, q, r, k, self_query)

    # -- per group ---------------------------------------------------------------------------

    def grouped(
        self,
        x: torch.Tensor,
        k: int,
        group: torch.Tensor | None = None,
        *,
        num_groups: int | None = None,
    ) -> Neighbors:
        """k nearest neighbours of each point among the points of its own group, all groups at once.

        Groups are given either by ``group [N]`` (int64 ids in ``0..M-1``, any order) or by
        ``num_groups = M`` equal contiguous blocks (the population layout: member ``i`` owns rows
        ``i * N/M .. (i+1) * N/M - 1``). Each point is excluded from its own neighbours by index.

        Args:
            x: points ``[N, p]``.
            k: neighbour count; must be below the smallest group's size.
            group: group id of each point ``[N]``, or None with ``num_groups``.
            num_groups: number of groups M (with ``group``: checked, and used to detect empty
                groups; without: the equal-block layout).

        Returns:
            :class:`Neighbors` ``[N, k]``; indices are rows of ``x`` (not group-local).
        """
        _check_points(x, "x")
        layout = _GroupLayout.build(x, group, num_groups)
        _check_k(k, layout.min_size - 1, "the smallest group (excluding each point itself)")
        p = x.shape[1]
        if self.backend == "auto":
            backend = select_grouped_backend(
                layout.max_size, p, x.device, allow_approximate=self.allow_approximate
            )
        else:
            backend = self.backend
        work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        xw = x.detach().to(work_dtype)
        if backend == "kdtree":
            return self._grouped_kdtree(xw, k, layout)
        if backend == "torch":
            return self._grouped_torch(xw, k, layout)
        return self._grouped_loop(backend, xw, k, layout)

    def _grouped_loop(
        self, backend: str, x: torch.Tensor, k: int, layout: _GroupLayout
    ) -> Neighbors:
        """One search per group. faiss has no batched multi-index query, and shifting groups
        apart along an extra coordinate (as for the kd-tree) would destroy the float32
        precision of faiss's ``|q|^2 + |r|^2 - 2 q.r`` distances; for the kd-tree one tree per
        group measured faster than a shared tree up to ``KDTREE_LOOP_MAX_GROUPS`` groups."""
        n = x.shape[0]
        dist = torch.empty(n, k, dtype=torch.float32, device=x.device)
        idx = torch.empty(n, k, dtype=torch.int64, device=x.device)
        xs = x[layout.order] if layout.order is not None else x
        starts = layout.starts.tolist()
        sizes = layout.sizes.tolist()
        for s, m in zip(starts, sizes):
            block = xs[s : s + m]
            block = (block - block.mean(dim=0)).contiguous()
            if backend == "faiss" and block.is_cuda and faiss_gpu_available():
                block = block.float()
            nb = self._search_centered(backend, block, block, k, True)
            dist[s : s + m] = nb.distances
            idx[s : s + m] = nb.indices + s
        return layout.unsort(dist, idx)

    def _grouped_kdtree(self, x: torch.Tensor, k: int, layout: _GroupLayout) -> Neighbors:
        """Per-group kd-tree search, with tree distances (exact, float64 differences) as output.

        Up to ``KDTREE_LOOP_MAX_GROUPS`` groups: one tree per group (measured faster), with only
        scipy calls inside the loop. Beyond: one tree over all groups, each shifted along an
        extra coordinate by more than the data's diameter, so no neighbour list can cross
        groups; inside a group the shift cancels exactly.
        """
        from scipy.spatial import cKDTree

        n = x.shape[0]
        xs = x[layout.order] if layout.order is not None else x
        pts = xs.detach().to("cpu", torch.float64).numpy()
        if layout.num_groups <= KDTREE_LOOP_MAX_GROUPS:
            dist = np.empty((n, k + 1), dtype=np.float32)
            idx = np.empty((n, k + 1), dtype=np.int64)
            for s, m in zip(layout.starts.tolist(), layout.sizes.tolist()):
                block = pts[s : s + m]
                d, i = cKDTree(block).query(block, k=k + 1, workers=-1)
                dist[s : s + m] = d.reshape(m, k + 1)
                idx[s : s + m] = i.reshape(m, k + 1) + s
        else:
            span = float(np.linalg.norm(pts.max(axis=0) - pts.min(axis=0)))
            gid = np.repeat(np.arange(layout.num_groups), layout.sizes.numpy())
            aug = np.concatenate([pts, (gid * (2.0 * span + 1.0))[:, None]], axis=1)
            d, i = cKDTree(aug).query(aug, k=k + 1, workers=-1)
            dist = d.astype(np.float32).reshape(n, k + 1)
            idx = i.astype(np.int64).reshape(n, k + 1)
        # Rows are in group-sorted order here, so row j's own index is j.
        d_t, i_t = _drop_self(torch.from_numpy(dist), torch.from_numpy(idx), torch.arange(n))
        return layout.unsort(d_t.to(x.device), i_t.to(x.device))

    def _grouped_torch(self, x: torch.Tensor, k: int, layout: _GroupLayout) -> Neighbors:
        """Block-diagonal brute force: groups padded to ``[M, n_max, p]``, batched matmuls."""
        n, p = x.shape
        m_groups = layout.num_groups
        n_max = layout.max_size
        sizes = layout.sizes.to(x.device)
        if layout.equal_blocks:
            padded = x.reshape(m_groups, n_max, p)
            valid = None
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
        kk = _oversample(k, layout.min_size - 1)
        _, local = _torch_block_search(padded, padded, sq, kk, True, int(self.memory_budget))
        starts = layout.starts.to(x.device)
        if layout.equal_blocks:
            flat = (local + starts[:, None, None]).reshape(n, kk)
        else:
            gid = layout.group_ids()
            pos = layout.position_in_group()
            # local index j of group g -> the j-th point of g in sorted order -> row of x
            sorted_rows = local[gid, pos] + starts[gid][:, None]
            flat = layout.order[sorted_rows]
        dist, idx = _finish(x, x, flat, int(self.memory_budget))
        return Neighbors(dist[:, :k].contiguous(), idx[:, :k].contiguous())


@dataclass(frozen=True)
class _GroupLayout:
    """Where each group's points are: sorted order, group starts and sizes."""

    num_groups: int
    sizes: torch.Tensor  # [M] int64, CPU
    starts: torch.Tensor  # [M] int64, CPU (offsets in sorted order)
    order: torch.Tensor | None  # [N] rows of x sorted by group; None when already contiguous
    group: torch.Tensor | None  # [N] group ids on x's device; None for equal blocks
    n: int
    device: torch.device

    @property
    def equal_blocks(self) -> bool:
        return self.group is None

    @property
    def min_size(self) -> int:
        return int(self.sizes.min())

    @property
    def max_size(self) -> int:
        return int(self.sizes.max())

    @staticmethod
    def build(x: torch.Tensor, group: torch.Tensor | None, num_groups: int | None) -> _GroupLayout:
        n = x.shape[0]
        if group is None:
            if num_groups is None:
                raise ValueError(
                    "pass group=[N] group ids or num_groups=M (equal contiguous blocks)"
                )
            if not isinstance(num_groups, int) or num_groups < 1:
                raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
            if n % num_groups != 0:
                raise ValueError(
                    f"{n} points do not split into {num_groups} equal blocks; "
                    "pass group=[N] ids for unequal groups"
                )
            size = n // num_groups
            if size == 0:
                raise ValueError(
                    f"num_groups={num_groups} exceeds the {n} points: groups would be empty; "
                    f"use num_groups <= {n}"
                )
            sizes = torch.full((num_groups,), size, dtype=torch.int64)
            starts = torch.arange(num_groups, dtype=torch.int64) * size
            return _GroupLayout(num_groups, sizes, starts, None, None, n, x.device)
        if not isinstance(group, torch.Tensor) or group.dim() != 1 or group.shape[0] != n:
            raise ValueError(f"group must be a 1-D tensor of {n} group ids (one per point)")
        if group.device != x.device:
            raise ValueError(
                f"x is on {x.device} but group is on {group.device}; "
                "move both to one device with .to(device)"
            )
        if group.is_floating_point() or group.dtype == torch.bool:
            raise ValueError(f"group must hold integer ids, got {group.dtype}; use group.long()")
        group = group.long()
        if n == 0:
            raise ValueError("no points given; pass x with at least one row [N >= 1, p]")
        lo, hi = int(group.min()), int(group.max())
        if lo < 0:
            raise ValueError(f"group ids must be >= 0, got {lo}; number the groups 0..M-1")
        m = hi + 1 if num_groups is None else num_groups
        if hi >= m:
            raise ValueError(f"group id {hi} >= num_groups={m}; ids must lie in 0..num_groups-1")
        sizes = torch.bincount(group, minlength=m).cpu()
        if bool((sizes == 0).any()):
            empty = torch.nonzero(sizes == 0).flatten()[:5].tolist()
            raise ValueError(
                f"groups {empty} have no points; renumber group ids to 0..M-1 without gaps "
                "or drop the empty groups"
            )
        starts = torch.cumsum(sizes, 0) - sizes
        order = torch.argsort(group, stable=True)
        return _GroupLayout(m, sizes, starts, order, group, n, x.device)

    def group_ids(self) -> torch.Tensor:
        """``[N]`` group id of each row of x."""
        if self.group is not None:
            return self.group
        size = self.n // self.num_groups
        return torch.arange(self.n, device=self.device) // size

    def position_in_group(self) -> torch.Tensor:
        """``[N]`` rank of each row of x within its group (in row order)."""
        if self.group is None:
            size = self.n // self.num_groups
            return torch.arange(self.n, device=self.device) % size
        pos_sorted = (
            torch.arange(self.n, device=self.device)
            - self.starts.to(self.device)[self.group[self.order]]
        )
        pos = torch.empty_like(pos_sorted)
        pos[self.order] = pos_sorted
        return pos

    def unsort(self, dist: torch.Tensor, idx_sorted: torch.Tensor) -> Neighbors:
        """Results computed in sorted order -> rows of x, indices -> rows of x."""
        if self.order is None:
            return Neighbors(dist, idx_sorted)
        order = self.order
        out_d = torch.empty_like(dist)
        out_i = torch.empty_like(idx_sorted)
        out_d[order] = dist
        out_i[order] = order[idx_sorted]
        return Neighbors(out_d, out_i)


# --------------------------------------------------------------------------------------------
# functional entry points


def knn(
    x: torch.Tensor,
    k: int,
    reference: torch.Tensor | None = None,
    *,
    backend: str = "auto",
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    allow_approximate: bool = True,
) -> Neighbors:
    """k nearest neighbours of each row of ``x`` in ``reference`` (default: ``x``, self excluded).

    Args:
        x: query points ``[Nq, p]``.
        k: neighbour count.
        reference: ``[Nr, p]`` on the same device, or None for a self-query.
        backend: one of :data:`BACKENDS` (``"auto"`` picks by device, size and dimension).
        memory_budget: bytes per block of pairwise distances in the torch backend.
        allow_approximate: whether ``"auto"`` may choose an approximate index.

    Returns:
        :class:`Neighbors`: ``distances [Nq, k]`` float32 Euclidean (not squared) and
        ``indices [Nq, k]`` int64, on ``x``'s device.
    """
    search = KNNSearch(
        backend=backend, memory_budget=memory_budget, allow_approximate=allow_approximate
    )
    return search(x, k, reference)


def knn_grouped(
    x: torch.Tensor,
    k: int,
    group: torch.Tensor | None = None,
    *,
    num_groups: int | None = None,
    backend: str = "auto",
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    allow_approximate: bool = True,
) -> Neighbors:
    """Per-group k nearest neighbours (each point among its own group only), in one call.

    Args:
        x: points ``[N, p]``.
        k: neighbour count, below the smallest group's size.
        group: ``[N]`` int64 group ids in ``0..M-1``; or None with ``num_groups``.
        num_groups: M; alone it means M equal contiguous blocks of ``N / M`` rows.
        backend: as for :func:`knn`.
        memory_budget: bytes per block of pairwise distances in the torch backend.
        allow_approximate: whether ``"auto"`` may choose an approximate index.

    Returns:
        :class:`Neighbors` ``[N, k]``; indices are rows of ``x``.
    """
    search = KNNSearch(
        backend=backend, memory_budget=memory_budget, allow_approximate=allow_approximate
    )
    return search.grouped(x, k, group, num_groups=num_groups)

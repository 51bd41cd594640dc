"""k-nearest-neighbour search for entropy estimation: faiss, a kd-tree and a chunked torch kernel.

Every entry point returns :class:`Neighbors`: ``distances [Nq, k]`` float32 **Euclidean** (not
squared) distances in ascending order, and ``indices [Nq, k]`` int64 rows into the reference set,
both on the device of the query tensor.

Self-queries (no separate reference set) exclude each point *by index*, not by distance: a
duplicate of ``x`` is a legitimate neighbour at distance 0, while ``x`` itself never is.

Modules:

- :mod:`~myriad.entropy.knn.search`: :class:`KNNSearch`, :func:`knn`, :func:`knn_grouped`.
- :mod:`~myriad.entropy.knn.selection`: the rule ``"auto"`` follows (:func:`select_backend`,
  :func:`select_grouped_backend`) and its measured thresholds.
- :mod:`~myriad.entropy.knn.grouping`: :class:`GroupLayout`, where each group's points are.
- :mod:`~myriad.entropy.knn.neighbors`: :class:`Neighbors`, input checks, exact re-ranking.
- :mod:`~myriad.entropy.knn.pq`: the 4-bit quantiser of ``"faiss-pq"``.
- :mod:`~myriad.entropy.knn.multiset`: search among the distinct points of a set with exact
  duplicates, and the expansion of each neighbour into its copies (the kd-tree's path).
- :mod:`~myriad.entropy.knn.backends`: one module per backend, registered by name in
  :data:`REGISTRY`:

``"kdtree"``
    pykdtree ``KDTree`` (OpenMP queries on every core). Exact; the fastest choice on CPU in low
    dimension. The tree holds the distinct points only (a cluster of identical states would be
    one leaf that every query reaching it scans) and queries are answered in Z order.
``"faiss"``
    exact brute force. On CUDA tensors with faiss-gpu installed, ``faiss.knn_gpu`` reads the torch
    tensors in place (``faiss.contrib.torch_utils``); otherwise CPU ``faiss.knn``.
``"faiss-pq"``
    approximate, CPU: every query scans *all* points through a 4-bit-per-feature product
    quantisation code and the ``pq_k_factor * (k + 1)`` best candidates are re-ranked with exact
    distances. Recall >= 0.995 from p = 8 up on Gaussian data (docs/entropy.md).
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

from myriad.entropy.knn.backends import (
    APPROXIMATE_BACKENDS,
    BACKENDS,
    KDTREE_LOOP_MAX_GROUPS,
    REGISTRY,
    SearchBackend,
    SearchOptions,
    get_backend,
    ivf_parameters,
)
from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.neighbors import Neighbors, check_k, check_points
from myriad.entropy.knn.pq import (
    PQ_ENCODE_CHUNK_ROWS,
    PQ_LLOYD_MAX_ITERS,
    PQ_TRAIN_POINTS,
    feature_codes,
    feature_levels,
    pq_subquantizers,
)
from myriad.entropy.knn.search import DEFAULT_MEMORY_BUDGET, KNNSearch, knn, knn_grouped
from myriad.entropy.knn.selection import (
    EXACT_MAX_PAIRS,
    KDTREE_EXACT_MAX_DIM,
    KDTREE_MAX_DIM,
    TORCH_GROUP_MAX_SIZE,
    faiss_available,
    faiss_gpu_available,
    select_backend,
    select_grouped_backend,
)

__all__ = [
    "APPROXIMATE_BACKENDS",
    "BACKENDS",
    "DEFAULT_MEMORY_BUDGET",
    "EXACT_MAX_PAIRS",
    "KDTREE_EXACT_MAX_DIM",
    "KDTREE_LOOP_MAX_GROUPS",
    "KDTREE_MAX_DIM",
    "PQ_ENCODE_CHUNK_ROWS",
    "PQ_LLOYD_MAX_ITERS",
    "PQ_TRAIN_POINTS",
    "REGISTRY",
    "TORCH_GROUP_MAX_SIZE",
    "GroupLayout",
    "KNNSearch",
    "Neighbors",
    "SearchBackend",
    "SearchOptions",
    "check_k",
    "check_points",
    "faiss_available",
    "faiss_gpu_available",
    "feature_codes",
    "feature_levels",
    "get_backend",
    "ivf_parameters",
    "knn",
    "knn_grouped",
    "pq_subquantizers",
    "select_backend",
    "select_grouped_backend",
]

"""``"faiss-ivf"``: approximate, CPU; an inverted file (``IndexIVFFlat``).

Each query scans the ``nprobe`` lists nearest to it: a measured recall loss traded for speed in
high dimension (``myriad bench knn``, docs/entropy.md).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from myriad.entropy.knn.backends.base import SearchOptions
from myriad.entropy.knn.backends.faiss_flat import ApproximateFaissBackend

#: faiss needs about this many training points per inverted list for k-means.
IVF_POINTS_PER_LIST = 39


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
        nlist = max(1, min(nlist, n_ref // IVF_POINTS_PER_LIST))
    nlist = max(1, min(int(nlist), n_ref))
    if nprobe is None:
        nprobe = max(1, nlist // 8)
    return nlist, max(1, min(int(nprobe), nlist))


class FaissIVFBackend(ApproximateFaissBackend):
    """Inverted file over ``nlist`` k-means cells, ``nprobe`` of them scanned per query."""

    name: ClassVar[str] = "faiss-ivf"

    def build_index(self, points: np.ndarray, kk: int, options: SearchOptions) -> Any:
        import faiss

        n, p = points.shape
        nlist, nprobe = ivf_parameters(n, options.ivf_nlist, options.ivf_nprobe)
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(p), p, nlist)
        index.cp.niter = 10
        index.cp.seed = options.seed
        index.cp.max_points_per_centroid = 64
        n_train = min(n, nlist * 64)
        if n_train < n:
            rng = np.random.default_rng(options.seed)
            train = points[np.sort(rng.choice(n, n_train, replace=False))]
        else:
            train = points
        index.train(train)
        index.add(points)
        index.nprobe = nprobe
        return index

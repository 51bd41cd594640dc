"""``"faiss-hnsw"``: approximate, CPU; a hierarchical navigable small-world graph
(``IndexHNSWFlat``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from myriad.entropy.knn.backends.base import SearchOptions
from myriad.entropy.knn.backends.faiss_flat import ApproximateFaissBackend


class FaissHNSWBackend(ApproximateFaissBackend):
    """HNSW graph of degree ``hnsw_m``, searched ``hnsw_ef_search`` wide (None: ``max(2 kk,
    32)``)."""

    name: ClassVar[str] = "faiss-hnsw"

    def build_index(self, points: np.ndarray, kk: int, options: SearchOptions) -> Any:
        import faiss

        index = faiss.IndexHNSWFlat(points.shape[1], options.hnsw_m)
        index.hnsw.efConstruction = 40
        index.add(points)
        index.hnsw.efSearch = options.hnsw_ef_search or max(2 * kk, 32)
        return index

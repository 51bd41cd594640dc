"""The neighbour-search backends, one module each, registered by name in :data:`REGISTRY`.

Each is a :class:`~myriad.entropy.knn.backends.base.SearchBackend`; :class:`KNNSearch` looks the
chosen name up here, so adding a backend is one module and one entry below.
"""

from __future__ import annotations

from myriad.entropy.knn.backends.base import SearchBackend, SearchOptions
from myriad.entropy.knn.backends.faiss_flat import FaissFlatBackend
from myriad.entropy.knn.backends.faiss_hnsw import FaissHNSWBackend
from myriad.entropy.knn.backends.faiss_ivf import FaissIVFBackend, ivf_parameters
from myriad.entropy.knn.backends.faiss_pq import FaissPQBackend
from myriad.entropy.knn.backends.kdtree import KDTREE_LOOP_MAX_GROUPS, KDTreeBackend
from myriad.entropy.knn.backends.torch_tiles import TorchBackend

#: Backend name -> backend object (the ``backend=`` values other than ``"auto"``).
REGISTRY: dict[str, SearchBackend] = {
    b.name: b
    for b in (
        FaissFlatBackend(),
        FaissPQBackend(),
        FaissIVFBackend(),
        FaissHNSWBackend(),
        KDTreeBackend(),
        TorchBackend(),
    )
}

#: Every accepted ``backend=`` value.
BACKENDS: tuple[str, ...] = ("auto", *REGISTRY)
#: The backends that may miss true neighbours.
APPROXIMATE_BACKENDS: tuple[str, ...] = tuple(n for n, b in REGISTRY.items() if b.approximate)


def get_backend(name: str) -> SearchBackend:
    """The registered backend called ``name``; ``ValueError`` listing the choices otherwise."""
    backend = REGISTRY.get(name)
    if backend is None:
        raise ValueError(f"unknown kNN backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return backend


__all__ = [
    "APPROXIMATE_BACKENDS",
    "BACKENDS",
    "KDTREE_LOOP_MAX_GROUPS",
    "REGISTRY",
    "SearchBackend",
    "SearchOptions",
    "get_backend",
    "ivf_parameters",
]

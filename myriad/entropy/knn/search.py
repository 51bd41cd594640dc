"""The search object, :class:`KNNSearch`, and its functional forms :func:`knn` and
:func:`knn_grouped`: input checks, backend resolution, centring, then the registered backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from myriad.entropy.knn.backends import SearchOptions, get_backend
from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.neighbors import Neighbors, check_k, check_points
from myriad.entropy.knn.selection import select_backend, select_grouped_backend

#: Default size of one block of pairwise distances in the torch backend (bytes).
DEFAULT_MEMORY_BUDGET = 256 * 2**20


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
            :func:`~myriad.entropy.knn.ivf_parameters`).
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
        if self.backend != "auto":
            get_backend(self.backend)  # raises, listing the choices, for an unknown name
        if int(self.memory_budget) <= 0:
            raise ValueError(
                f"memory_budget must be a positive number of bytes, got {self.memory_budget}"
            )

    @property
    def options(self) -> SearchOptions:
        """The settings the backends read."""
        return SearchOptions(
            int(self.memory_budget),
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
        check_points(x, "x")
        self_query = reference is None
        if reference is None:
            ref = x
            check_k(k, x.shape[0] - 1, "x (excluding each point itself)")
        else:
            if isinstance(reference, torch.Tensor) and reference.device != x.device:
                raise ValueError(
                    f"x is on {x.device} but reference is on {reference.device}; "
                    "move both to one device with .to(device)"
                )
            check_points(reference, "reference")
            if reference.shape[1] != x.shape[1]:
                raise ValueError(
                    f"x has {x.shape[1]} features but reference has {reference.shape[1]}; "
                    "both must be [*, p] with the same p"
                )
            ref = reference
            check_k(k, ref.shape[0], "reference")
        backend = get_backend(self.resolve(x.shape[0], ref.shape[0], x.shape[1], x.device))
        work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        q = x.detach().to(work_dtype)
        r = q if self_query else ref.detach().to(work_dtype)
        if backend.centred:
            # Centring by the reference mean keeps the |q|^2 + |r|^2 - 2 q.r expansion accurate
            # for data far from the origin; distances are translation invariant.
            mean = r.mean(dim=0)
            q = (q - mean).contiguous()
            r = q if self_query else (r - mean).contiguous()
        q = backend.prepare(q)
        r = q if self_query else backend.prepare(r)
        return backend.search(q, r, k, self_query, self.options)

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
        check_points(x, "x")
        layout = GroupLayout.build(x, group, num_groups)
        check_k(k, layout.min_size - 1, "the smallest group (excluding each point itself)")
        if self.backend == "auto":
            name = select_grouped_backend(
                layout.max_size, x.shape[1], x.device, allow_approximate=self.allow_approximate
            )
        else:
            name = self.backend
        work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return get_backend(name).grouped(x.detach().to(work_dtype), k, layout, self.options)


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
        backend: one of :data:`~myriad.entropy.knn.BACKENDS` (``"auto"`` picks by device, size
            and dimension).
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

"""``"faiss"``: exact brute force with faiss, on the GPU in place when faiss-gpu sees one.

On CUDA tensors with faiss-gpu installed, ``faiss.knn_gpu`` reads the torch tensors in place
(``faiss.contrib.torch_utils``); otherwise CPU ``faiss.knn``. The same exact search repairs the
rows an approximate faiss index leaves short (:class:`ApproximateFaissBackend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from myriad.entropy.knn.backends.base import SearchBackend, SearchOptions
from myriad.entropy.knn.neighbors import as_numpy32
from myriad.entropy.knn.selection import faiss_gpu_available

if TYPE_CHECKING:
    import faiss

_GPU_RESOURCES: dict[int, faiss.StandardGpuResources] = {}
# faiss's GPU k-selection handles at most this many results per query.
_FAISS_GPU_MAX_K = 2048


def _gpu_resources(device_index: int) -> faiss.StandardGpuResources:
    import faiss

    res = _GPU_RESOURCES.get(device_index)
    if res is None:
        res = faiss.StandardGpuResources()
        _GPU_RESOURCES[device_index] = res
    return res


def flat_search(q: torch.Tensor, r: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``kk`` nearest rows of ``r`` for each row of ``q`` (``r is q``: self-query, each
    point among its own results): squared distances and indices ``[Nq, kk]``, on the GPU for
    CUDA tensors with faiss-gpu, else on the CPU."""
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
        res = _gpu_resources(device_index)
        d2, idx = faiss.knn_gpu(
            res,
            q.detach().float().contiguous(),
            r.detach().float().contiguous(),
            kk,
            device=device_index,
        )
        return d2, idx
    qn = as_numpy32(q)
    rn = qn if q is r else as_numpy32(r)
    d2_cpu, idx_cpu = faiss.knn(qn, rn, kk)
    return torch.from_numpy(d2_cpu), torch.from_numpy(idx_cpu)


def repair_missing(q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, kk: int) -> torch.Tensor:
    """Rows of ``idx [Nq, kk]`` where an approximate index found fewer than ``kk`` points (-1
    entries) get exact results from :func:`flat_search`."""
    bad = (idx < 0).any(dim=1)
    if not bool(bad.any()):
        return idx
    rows = torch.nonzero(bad).flatten()
    _, fixed = flat_search(q[rows], r, kk)
    idx = idx.clone()
    idx[rows] = fixed.to(idx.device)
    return idx


class FaissFlatBackend(SearchBackend):
    """Exact brute force (``faiss.knn`` / ``faiss.knn_gpu``), re-ranked by exact distances."""

    name: ClassVar[str] = "faiss"
    needs_faiss: ClassVar[bool] = True
    expansion: ClassVar[bool] = True

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        # faiss-gpu reads float32 device memory in place.
        return x.float() if x.is_cuda and faiss_gpu_available() else x

    def candidates(
        self, q: torch.Tensor, r: torch.Tensor, kk: int, self_query: bool, options: SearchOptions
    ) -> torch.Tensor:
        _, idx = flat_search(q, r, kk)
        return idx.to(q.device)


class ApproximateFaissBackend(SearchBackend):
    """Base of the approximate faiss indexes: a subclass builds its index over the reference
    points (:meth:`build_index`); rows the index leaves short are searched exactly."""

    approximate: ClassVar[bool] = True
    needs_faiss: ClassVar[bool] = True

    def build_index(self, points: np.ndarray, kk: int, options: SearchOptions) -> Any:
        """A searchable faiss index over ``points [Nr, p]`` float32, for ``kk`` results."""
        raise NotImplementedError(f"backend {self.name!r} builds no index")

    def candidates(
        self, q: torch.Tensor, r: torch.Tensor, kk: int, self_query: bool, options: SearchOptions
    ) -> torch.Tensor:
        qn = as_numpy32(q)
        rn = qn if q is r else as_numpy32(r)
        _, idx = self.build_index(rn, kk, options).search(qn, kk)
        return torch.from_numpy(idx).to(q.device)

    def repair(self, q: torch.Tensor, r: torch.Tensor, idx: torch.Tensor, kk: int) -> torch.Tensor:
        return repair_missing(q, r, idx, kk)

"""Which backend ``"auto"`` picks: by device, size and dimension (docs/entropy.md).

The thresholds come from measurements on a 2-core CPU with Gaussian data at 65,536 points,
k = 10 (``myriad bench knn``, benchmarks/results/knn.json).
"""

from __future__ import annotations

import torch

#: The kd-tree is the fastest backend up to this dimension (1.2 CPU-s at p = 6, faiss-pq 1.8)...
KDTREE_MAX_DIM = 6
#: ...and still beats exact brute force up to this one (3.8 CPU-s at p = 8, faiss flat 4-6).
KDTREE_EXACT_MAX_DIM = 8
#: Up to this many query-reference pairs exact brute force costs under ~0.6 CPU-s: keep it exact.
EXACT_MAX_PAIRS = 2**28
#: CUDA without faiss-gpu: above this many query-reference pairs, low-dimensional searches go to
#: the kd-tree on the host. The torch kernel's brute force took 0.15 s for 65,536 self-queried
#: 2-D states (2^32 pairs) and 24 s for 1,000,000 (2^40) on an H100
#: (benchmarks/results/gpu-nvidia-h100-80gb-hbm3.json); the final evaluation of a pretraining
#: run at 16,384 envs holds 6.5M states, which brute force does not finish in minutes.
CUDA_BRUTE_FORCE_MAX_PAIRS = 2**32
#: Per-group search in high dimension on CPU: the batched block-diagonal torch kernel matches or
#: beats one faiss call per group up to this group size (and avoids a Python loop).
TORCH_GROUP_MAX_SIZE = 4096


def faiss_available() -> bool:
    """Whether faiss can be imported."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_gpu_available() -> bool:
    """Whether faiss was built with GPU support and sees at least one GPU."""
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


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

    - CUDA: ``"faiss"`` (GPU brute force) when faiss-gpu sees a GPU; else ``"torch"``, except
      ``dim <= KDTREE_MAX_DIM`` searches of more than ``CUDA_BRUTE_FORCE_MAX_PAIRS`` pairs, which
      go to ``"kdtree"`` (a copy to the host and back).
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
        if faiss_gpu_available():
            return "faiss"
        large = n_query * n_ref > CUDA_BRUTE_FORCE_MAX_PAIRS
        return "kdtree" if large and dim <= KDTREE_MAX_DIM else "torch"
    if device.type != "cpu":
        return "torch"
    if dim <= KDTREE_MAX_DIM:
        return "kdtree"
    exact = "kdtree" if dim <= KDTREE_EXACT_MAX_DIM else "faiss"
    if exact == "faiss" and not faiss_available():
        exact = "torch"
    if n_query * n_ref <= EXACT_MAX_PAIRS or not allow_approximate or not faiss_available():
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
    instead of M launches; not measured here, see docs/entropy.md) unless :func:`select_backend`
    sends a group of that size to the host's kd-tree."""
    if torch.device(device).type == "cuda":
        single = select_backend(max_group_size, max_group_size, dim, device)
        return "kdtree" if single == "kdtree" else "torch"
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

"""k-NN entropy machinery: neighbour search backends, entropy estimators, grid coverage.

- :mod:`myriad.entropy.knn`: ``knn.knn``, :func:`knn_grouped`, :class:`KNNSearch` (faiss,
  kd-tree and chunked torch backends, chosen automatically by :func:`select_backend`). The
  function ``knn`` is imported from the submodule (``from myriad.entropy.knn import knn``) so
  that ``myriad.entropy.knn`` stays the module.
- :mod:`myriad.entropy.estimators`: Kozachenko-Leonenko entropy, its importance-weighted form and
  KL estimate, collective / individual / diversity terms.
- :mod:`myriad.entropy.reward`: the per-state k-NN reward.
- :mod:`myriad.entropy.coverage`: fraction of grid cells visited, per member and for the union,
  of one batch (:func:`coverage`) or tracked over a run (:class:`CoverageTracker`).

docs/entropy.md describes the API, the backend rule and the measured speed and accuracy.
"""

from myriad.entropy.coverage import (
    Coverage,
    CoverageGrid,
    CoverageTracker,
    cell_index,
    coverage,
)
from myriad.entropy.estimators import (
    DEFAULT_MIN_DISTANCE,
    ImportanceWeightedEntropy,
    PopulationEntropy,
    WeightedEntropy,
    cumulative_log_ratio,
    importance_weighted_entropy,
    kl_entropy,
    kl_entropy_from_distances,
    log_unit_ball_volume,
    population_entropy,
    population_entropy_from_distances,
)
from myriad.entropy.knn import (
    BACKENDS,
    DEFAULT_MEMORY_BUDGET,
    KNNSearch,
    Neighbors,
    faiss_gpu_available,
    ivf_parameters,
    knn_grouped,
    select_backend,
    select_grouped_backend,
)
from myriad.entropy.reward import KNNReward, knn_reward, knn_reward_from_distances

__all__ = [
    "BACKENDS",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_MIN_DISTANCE",
    "Coverage",
    "CoverageGrid",
    "CoverageTracker",
    "ImportanceWeightedEntropy",
    "KNNReward",
    "KNNSearch",
    "Neighbors",
    "PopulationEntropy",
    "WeightedEntropy",
    "cell_index",
    "coverage",
    "cumulative_log_ratio",
    "faiss_gpu_available",
    "importance_weighted_entropy",
    "ivf_parameters",
    "kl_entropy",
    "kl_entropy_from_distances",
    "knn_grouped",
    "knn_reward",
    "knn_reward_from_distances",
    "log_unit_ball_volume",
    "population_entropy",
    "population_entropy_from_distances",
    "select_backend",
    "select_grouped_backend",
]

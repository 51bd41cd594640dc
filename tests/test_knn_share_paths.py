"""The fast low-dimensional k-NN paths of pretraining against float64 brute force.

The kd-tree searches the distinct states and expands copies afterwards, answers queries in
spatial order, and pretraining runs the pooled and per-member searches concurrently. All of it
must return the exact neighbour distances (recall of the k-th neighbour 1.0, entropy error 0) on
rollout-like data full of exact duplicates, with valid neighbour indices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pytest
import torch

from myriad.entropy import knn as knn_mod
from myriad.entropy import population_entropy_from_distances
from myriad.entropy.knn import REGISTRY, KNNSearch, Neighbors, multiset
from myriad.entropy.knn.backends.kdtree import KDTREE_ORDER_MIN_QUERIES, KDTreeBackend
from myriad.entropy.knn.multiset import DistinctRows
from myriad.entropy.knn.neighbors import drop_self
from myriad.pretrain.objectives import EntropyMeasurement

K = 10


def stacked_states(n: int, dim: int = 2, seed: int = 0) -> torch.Tensor:
    """``[n, dim]`` states of point masses in a box: clipping stacks many exactly on the walls
    and corners, and whole trajectories repeat, as in a maze rollout."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, dim, generator=gen, dtype=torch.float64) * 1.3).clamp(-1.0, 1.0)
    repeated = torch.randint(0, n, (n // 10,), generator=gen)
    x[: n // 10] = x[repeated]  # copies of interior points too
    x[n // 10 : n // 10 + 3] = 0.5
    x[n // 10 : n // 10 + 3, 0] = 0.0
    x[n // 10 + 3 : n // 10 + 6] = 0.5
    x[n // 10 + 3 : n // 10 + 6, 0] = -0.0  # equal to 0.0, with other bits
    return x[torch.randperm(n, generator=gen)].float()


def brute_force_distances(
    x: torch.Tensor, k: int, reference: torch.Tensor | None = None, chunk: int = 512
) -> torch.Tensor:
    """``[Nq, k]`` float64 exact neighbour distances (a self-query excludes each point by
    index), from coordinate differences in float64."""
    ref = (x if reference is None else reference).double()
    q = x.double()
    out = torch.empty(q.shape[0], k, dtype=torch.float64)
    for s in range(0, q.shape[0], chunk):
        d = torch.cdist(q[s : s + chunk], ref, compute_mode="donot_use_mm_for_euclid_dist")
        if reference is None:
            rows = torch.arange(s, min(s + chunk, q.shape[0]))
            d[rows - s, rows] = float("inf")
        out[s : s + chunk] = d.topk(k, dim=1, largest=False).values
    return out


def assert_exact(
    nb: Neighbors, x: torch.Tensor, k: int, reference: torch.Tensor | None = None
) -> None:
    """Distances equal to brute force (recall of every rank 1.0) and indices that are real,
    distinct neighbours at those distances, never the point itself on a self-query."""
    ref = x if reference is None else reference
    true = brute_force_distances(x, k, reference)
    assert nb.distances.shape == (x.shape[0], k) and nb.indices.shape == (x.shape[0], k)
    assert torch.equal(nb.distances, true.float())
    recomputed = torch.linalg.vector_norm(
        ref.double()[nb.indices] - x.double()[:, None, :], dim=-1
    ).float()
    assert torch.equal(recomputed, nb.distances)
    assert bool((nb.indices.sort(dim=1).values.diff(dim=1) > 0).all())  # no row repeats one
    if reference is None:
        assert not bool((nb.indices == torch.arange(x.shape[0])[:, None]).any())


class PlainKDTree(KDTreeBackend):
    """The kd-tree over every row, queries in row order: the path the fast one must match."""

    name: ClassVar[str] = "kdtree-plain-test"
    merge_duplicates: ClassVar[bool] = False
    ordered: ClassVar[bool] = False


@pytest.fixture
def plain_backend() -> Iterator[str]:
    REGISTRY[PlainKDTree.name] = PlainKDTree()
    yield PlainKDTree.name
    del REGISTRY[PlainKDTree.name]


def test_states_have_many_duplicates() -> None:
    x = stacked_states(6000)
    distinct = DistinctRows.find(x.double().numpy())
    assert distinct.num_distinct == len(torch.unique(x, dim=0))  # no two merged, none split
    assert distinct.num_distinct < 0.8 * len(x)
    assert int(distinct.counts.max()) > K + 1  # a corner holds more copies than k + 1
    # Every row is a copy of its distinct point, and the copies are where `rows` says.
    assert np.array_equal(distinct.points[distinct.inverse], x.double().numpy() + 0.0)
    assert int(distinct.counts.sum()) == len(x)
    for u in (0, int(distinct.counts.argmax())):
        copies = distinct.rows[distinct.starts[u] : distinct.starts[u] + distinct.counts[u]]
        assert np.all(distinct.inverse[copies] == u)


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_self_query_is_exact_with_duplicates(dim: int) -> None:
    x = stacked_states(6000, dim, seed=dim)
    assert len(x) >= KDTREE_ORDER_MIN_QUERIES  # the spatially ordered path
    assert_exact(KNNSearch(backend="kdtree")(x, K), x, K)


def test_small_self_query_is_exact_with_duplicates() -> None:
    x = stacked_states(300)  # below the ordering threshold
    assert_exact(KNNSearch(backend="kdtree")(x, K), x, K)


def test_fast_and_plain_paths_agree(plain_backend: str) -> None:
    x = stacked_states(6000, seed=5)
    fast = KNNSearch(backend="kdtree")(x, K)
    plain = KNNSearch(backend=plain_backend)(x, K)
    assert torch.equal(fast.distances, plain.distances)
    assert_exact(plain, x, K)


def test_reference_query_is_exact_with_duplicates() -> None:
    ref = stacked_states(6000, seed=7)
    queries = torch.cat([ref[:2500], stacked_states(2500, seed=8)])
    assert_exact(KNNSearch(backend="kdtree")(queries, K, ref), queries, K, ref)


def test_all_copies_of_a_point_within_k() -> None:
    # 4 copies of one point and 3 of another: the neighbours list exactly the other copies
    # first, then the nearest distinct points.
    base = torch.tensor([[0.0, 0.0]] * 4 + [[1.0, 0.0]] * 3)
    x = torch.cat([base, torch.randn(20, 2, generator=torch.Generator().manual_seed(3)) + 5])
    nb = KNNSearch(backend="kdtree")(x, 5)
    assert_exact(nb, x, 5)
    assert torch.equal(nb.distances[0, :3], torch.zeros(3))
    assert set(nb.indices[0, :3].tolist()) == {1, 2, 3}
    assert set(nb.indices[0, 3:5].tolist()) <= {4, 5, 6}


def test_hash_collisions_fall_back_to_the_exact_search(monkeypatch: pytest.MonkeyPatch) -> None:
    # A constant hash and spatial key: copies are no longer adjacent after the sort, a point is
    # listed several times, and the search must still be exact.
    def constant(points: np.ndarray) -> np.ndarray:
        return np.zeros(len(points), np.uint64)

    monkeypatch.setattr(multiset, "row_hash", constant)
    monkeypatch.setattr(multiset, "spatial_key", constant)
    x = stacked_states(5000, seed=11)
    assert DistinctRows.find(x.double().numpy()).num_distinct > len(torch.unique(x, dim=0))
    assert_exact(KNNSearch(backend="kdtree")(x, K), x, K)
    ref = stacked_states(5000, seed=12)
    assert_exact(KNNSearch(backend="kdtree")(x, K, ref), x, K, ref)


def test_rows_sharing_a_spatial_key_stay_apart() -> None:
    # In 8-D the key keeps 8 bits per coordinate: points 1e-6 apart share a key, and copies of
    # each are interleaved in row order; the hash must still group the copies.
    gen = torch.Generator().manual_seed(13)
    base = torch.rand(50, 8, generator=gen, dtype=torch.float64)
    near = base + 1e-6
    x = torch.cat([base, near, base, near, base])[torch.randperm(250, generator=gen)]
    points = x.numpy()
    assert len(np.unique(multiset.spatial_key(points))) < 60  # most pairs share a key
    distinct = DistinctRows.find(points)
    assert distinct.num_distinct == 100
    assert_exact(KNNSearch(backend="kdtree")(x, K), x, K)


def test_spatial_key_interleaves_the_bits_of_the_coordinates() -> None:
    # Against a bit-by-bit Morton code: bit t of coordinate j lands at bit t * p + j.
    gen = np.random.default_rng(0)
    for p in (1, 2, 3, 5, 8):
        points = gen.normal(size=(64, p))
        bits = min(64 // p, 16)
        lo, span = points.min(axis=0), points.max(axis=0) - points.min(axis=0)
        cells = np.minimum((points - lo) * ((2.0**bits - 1) / span), 2.0**bits - 1)
        cells = cells.astype(np.uint64)
        expected = [
            sum(((int(c[j]) >> t) & 1) << (t * p + j) for j in range(p) for t in range(bits))
            for c in cells
        ]
        assert multiset.spatial_key(points).tolist() == expected
    keys = gen.integers(0, 2**64, size=1000, dtype=np.uint64)
    keys[::3] = keys[0]  # ties keep row order
    assert np.array_equal(multiset.stable_argsort(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("groups", [4, 80])  # one tree per group; one shifted tree
def test_grouped_is_exact_with_duplicates(groups: int) -> None:
    n = 80 * groups if groups > 64 else 6000
    x = stacked_states(n - n % groups, seed=groups)
    nb = KNNSearch(backend="kdtree").grouped(x, K, num_groups=groups)
    size = x.shape[0] // groups
    for g in range(groups):
        block = slice(g * size, (g + 1) * size)
        local = Neighbors(nb.distances[block], nb.indices[block] - g * size)
        assert_exact(local, x[block], K)


def test_unequal_groups_are_exact_with_duplicates() -> None:
    x = stacked_states(6000, seed=21)
    group = torch.randint(0, 3, (6000,), generator=torch.Generator().manual_seed(0))
    nb = KNNSearch(backend="kdtree").grouped(x, K, group)
    for g in range(3):
        rows = torch.nonzero(group == g).flatten()
        # Indices are rows of x; map them to positions within the group.
        position = torch.full((6000,), -1, dtype=torch.int64)
        position[rows] = torch.arange(len(rows))
        local = Neighbors(nb.distances[rows], position[nb.indices[rows]])
        assert bool((local.indices >= 0).all())  # never a row of another group
        assert_exact(local, x[rows], K)


def test_drop_self_fast_path_matches_the_general_rule() -> None:
    gen = torch.Generator().manual_seed(4)
    n, c = 200, 6
    idx = torch.stack([torch.randperm(50, generator=gen)[:c] for _ in range(n)])
    own = torch.randint(0, 50, (n,), generator=gen)
    idx[:120, 0] = own[:120]  # itself first (the usual case)
    idx[120:160, 2] = own[120:160]  # behind tied copies
    dist = torch.rand(n, c, generator=gen).sort(dim=1).values
    own[160:] = 99  # absent: the last column is dropped
    got_d, got_i = drop_self(dist, idx, own)
    for row in range(n):
        hits = (idx[row] == own[row]).nonzero().flatten()
        drop = int(hits[0]) if len(hits) else c - 1
        keep = [j for j in range(c) if j != drop]
        assert torch.equal(got_i[row], idx[row, keep])
        assert torch.equal(got_d[row], dist[row, keep])
    everyone = torch.arange(n)
    idx[:, 0] = everyone
    fast_d, fast_i = drop_self(dist, idx, everyone)
    assert torch.equal(fast_i, idx[:, 1:]) and torch.equal(fast_d, dist[:, 1:])


def test_measurement_entropies_equal_brute_force() -> None:
    # A rollout [T, E, 2] of 4 members; the concurrent measurement must give the entropies of
    # float64 brute force exactly (relative error 0) and the same neighbours as the sequential
    # one.
    t_steps, envs, members = 32, 192, 4
    features = stacked_states(t_steps * envs, seed=30).reshape(t_steps, envs, 2)
    measure = EntropyMeasurement(K, members, 2)
    got = measure(features)
    assert measure.concurrent
    measure.concurrent = False
    sequential = measure.evaluate(features)
    assert torch.equal(got.pooled.distances, sequential.pooled.distances)
    assert torch.equal(got.grouped.distances, sequential.grouped.distances)
    x = got.scaled
    pooled_true = brute_force_distances(x, K)[:, K - 1]
    size = x.shape[0] // members
    member_true = torch.cat(
        [brute_force_distances(x[g * size : (g + 1) * size], K)[:, K - 1] for g in range(members)]
    )
    exact = population_entropy_from_distances(
        pooled_true.float(), member_true.float(), 2, K, num_groups=members, min_distance=1e-3
    )
    assert float(got.collective - got.log_scale) == pytest.approx(
        float(exact.collective), rel=1e-12, abs=1e-12
    )
    torch.testing.assert_close(got.individual - got.log_scale, exact.individual, rtol=0, atol=1e-12)


def test_kdtree_stays_the_auto_choice_in_low_dimension() -> None:
    assert knn_mod.select_backend(524288, 524288, 2) == "kdtree"
    assert knn_mod.select_grouped_backend(32768, 2) == "kdtree"

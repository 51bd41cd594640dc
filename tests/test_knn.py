"""Neighbour search: every backend against float64 brute force, per-group queries, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myriad.entropy import knn as knn_mod
from myriad.entropy.knn import (
    KNNSearch,
    Neighbors,
    SearchBackend,
    feature_codes,
    feature_levels,
    knn,
    knn_grouped,
    select_backend,
    select_grouped_backend,
)

EXACT = ["kdtree", "faiss", "torch"]


def brute_force(
    x: torch.Tensor, k: int, reference: torch.Tensor | None = None, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``cdist`` + ``topk``: the reference every backend must match."""
    ref = x if reference is None else reference
    d = torch.cdist(x.double(), ref.double())
    if reference is None:
        d.fill_diagonal_(float("inf"))
    if mask is not None:
        d = d.masked_fill(~mask, float("inf"))
    dist, idx = d.topk(k, dim=1, largest=False)
    return dist, idx


def assert_same(nb: Neighbors, ref: tuple[torch.Tensor, torch.Tensor], k: int) -> None:
    dist, idx = ref
    assert nb.distances.shape == (dist.shape[0], k)
    assert nb.distances.dtype == torch.float32
    assert nb.indices.dtype == torch.int64
    torch.testing.assert_close(nb.distances.double(), dist, rtol=1e-5, atol=1e-6)
    # Continuous random data has no ties, so the neighbours themselves must agree.
    assert torch.equal(nb.indices, idx)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("dim", [1, 2, 5, 29])
def test_self_query_matches_brute_force(backend: str, dim: int, gen: torch.Generator) -> None:
    x = torch.randn(700, dim, generator=gen)
    assert_same(knn(x, 6, backend=backend), brute_force(x, 6), 6)


@pytest.mark.parametrize("backend", EXACT)
def test_separate_reference_matches_brute_force(backend: str, gen: torch.Generator) -> None:
    x = torch.randn(300, 4, generator=gen)
    ref = torch.randn(500, 4, generator=gen)
    assert_same(knn(x, 5, ref, backend=backend), brute_force(x, 5, ref), 5)


def test_torch_tiles_within_memory_budget(gen: torch.Generator) -> None:
    # 2 KiB blocks force both query and reference chunking and the running top-k merge.
    x = torch.randn(400, 3, generator=gen)
    assert_same(knn(x, 7, backend="torch", memory_budget=2048), brute_force(x, 7), 7)
    ref = torch.randn(333, 3, generator=gen)
    assert_same(knn(x, 4, ref, backend="torch", memory_budget=1024), brute_force(x, 4, ref), 4)


@pytest.mark.parametrize("budget", [1024, 8192, 65536])
def test_torch_tiles_never_exceed_the_budget(
    budget: int, monkeypatch, gen: torch.Generator
) -> None:
    # Every distance tile (and the one temporary the budget allows for) fits the budget.
    tiles: list[int] = []
    baddbmm = torch.baddbmm

    def recording_baddbmm(*args, **kwargs):
        out = baddbmm(*args, **kwargs)
        tiles.append(out.numel() * out.element_size())
        return out

    monkeypatch.setattr(torch, "baddbmm", recording_baddbmm)
    x = torch.randn(600, 3, generator=gen)
    assert_same(knn(x, 5, backend="torch", memory_budget=budget), brute_force(x, 5), 5)
    group = torch.arange(600) % 3
    knn_grouped(x, 5, group, backend="torch", memory_budget=budget)
    assert tiles and max(tiles) * 2 <= budget


def test_far_from_origin_data_keeps_exact_neighbours(gen: torch.Generator) -> None:
    # |x|^2 ~ 1e8 would swamp float32 distance expansions without centring.
    x = torch.randn(500, 3, generator=gen) + 1e4
    ref = brute_force(x, 5)
    for backend in EXACT:
        assert_same(knn(x, 5, backend=backend), ref, 5)


def test_float64_input(gen: torch.Generator) -> None:
    x = torch.randn(300, 6, generator=gen, dtype=torch.float64)
    for backend in EXACT:
        assert_same(knn(x, 3, backend=backend), brute_force(x, 3), 3)


@pytest.mark.parametrize("backend", ["faiss-pq", "faiss-ivf", "faiss-hnsw"])
def test_approximate_backends(backend: str, gen: torch.Generator) -> None:
    x = torch.randn(2000, 12, generator=gen)
    dist, idx = brute_force(x, 10)
    # Generous settings make the approximate indexes exact on this small set; the default
    # settings' recall is measured by `myriad bench knn` and documented.
    search = KNNSearch(backend=backend, pq_k_factor=16, ivf_nlist=16, ivf_nprobe=16, hnsw_m=32)
    nb = search(x, 10)
    assert nb.distances.shape == (2000, 10)
    recall = (nb.indices[:, :, None] == idx[:, None, :]).any(dim=1).float().mean()
    assert recall >= 0.99
    assert not (nb.indices == torch.arange(2000)[:, None]).any()
    # Reported distances are true distances to the reported points, whatever the index.
    true = (x[nb.indices] - x[:, None, :]).norm(dim=-1)
    torch.testing.assert_close(nb.distances, true, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", [*EXACT, "faiss-pq"])
def test_self_excluded_by_index_with_duplicates(backend: str, gen: torch.Generator) -> None:
    base = torch.randn(200, 3, generator=gen)
    x = torch.cat([base, base, base])  # every point has two exact copies
    nb = knn(x, 4, backend=backend)
    own = torch.arange(x.shape[0])[:, None]
    assert not (nb.indices == own).any()
    # The two copies are legitimate neighbours at distance 0.
    assert torch.all(nb.distances[:, :2] == 0)
    copies = torch.stack([(own[:, 0] + 200) % 600, (own[:, 0] + 400) % 600], dim=1)
    assert torch.equal(nb.indices[:, :2].sort(dim=1).values, copies.sort(dim=1).values)
    assert torch.all(nb.distances[:, 2:] > 0)


def test_feature_levels_reach_the_lloyd_max_quantiser() -> None:
    # Max (1960): the MSE-optimal 16-level quantiser of a standard normal has distortion 0.009497
    # and outermost levels +-2.733.
    x = torch.randn(200_000, 1, generator=torch.Generator().manual_seed(5))
    levels = feature_levels(x)[0]
    assert torch.all(levels.diff() > 0)
    mse = (x - levels[None, :]).square().min(dim=1).values.mean()
    assert abs(float(mse) - 0.009497) < 0.0003
    assert abs(float(levels[-1]) - 2.733) < 0.03 and abs(float(levels[0]) + 2.733) < 0.03


def test_feature_levels_no_worse_than_faiss_kmeans(gen: torch.Generator) -> None:
    faiss = pytest.importorskip("faiss")
    # Skewed, heavy-tailed and discrete features, one k-means per feature in faiss.
    x = torch.stack(
        [
            torch.randn(4096, generator=gen).exp(),
            torch.distributions.StudentT(2.0).sample((4096,)),
            torch.randint(0, 5, (4096,), generator=gen).float(),
        ],
        dim=1,
    )
    levels = feature_levels(x)
    for j in range(x.shape[1]):
        col = x[:, j : j + 1].contiguous()
        ours = (col - levels[j][None, :]).square().min(dim=1).values.mean()
        km = faiss.Kmeans(1, 16, niter=50, seed=0)
        km.train(col.numpy())
        theirs = (col - torch.from_numpy(km.centroids).T).square().min(dim=1).values.mean()
        assert float(ours) <= float(theirs) * 1.01 + 1e-9


def test_feature_levels_constant_feature(gen: torch.Generator) -> None:
    x = torch.cat([torch.full((500, 1), 3.0), torch.randn(500, 1, generator=gen)], dim=1)
    levels = feature_levels(x)
    assert torch.isfinite(levels).all()
    assert torch.all(levels[0] == 3.0)
    assert torch.all(feature_codes_unpacked(x, levels)[:, 0] == 0)


def feature_codes_unpacked(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    packed = torch.from_numpy(feature_codes(x, levels))
    codes = torch.stack([packed & 15, packed >> 4], dim=2).flatten(1)
    return codes[:, : x.shape[1]]


@pytest.mark.parametrize("dim", [1, 6, 29])
def test_feature_codes_match_faiss_encoder(dim: int, gen: torch.Generator) -> None:
    faiss = pytest.importorskip("faiss")
    x = torch.randn(3000, dim, generator=gen)
    levels = feature_levels(x[:1000])
    pq = faiss.ProductQuantizer(dim, dim, 4)
    faiss.copy_array_to_vector(levels.numpy().ravel(), pq.centroids)
    assert np.array_equal(feature_codes(x, levels), pq.compute_codes(x.numpy()))
    assert np.array_equal(feature_codes(x, levels, chunk_rows=700), feature_codes(x, levels))
    # Each code names the nearest level.
    nearest = (x[:, :, None] - levels[None]).abs().argmin(dim=2)
    assert torch.equal(feature_codes_unpacked(x, levels), nearest.to(torch.uint8))


@pytest.mark.parametrize("dim", [7, 130])
def test_faiss_pq_one_and_two_features_per_subquantizer(dim: int, gen: torch.Generator) -> None:
    # p <= 128: myriad's own levels and codes; p > 128: faiss trains pairs of features.
    x = torch.randn(1500, dim, generator=gen)
    dist, idx = brute_force(x, 5)
    nb = KNNSearch(backend="faiss-pq", pq_k_factor=32)(x, 5)
    recall = (nb.indices[:, :, None] == idx[:, None, :]).any(dim=1).float().mean()
    assert recall >= 0.99
    true = (x[nb.indices] - x[:, None, :]).norm(dim=-1)
    torch.testing.assert_close(nb.distances, true, rtol=1e-5, atol=1e-5)
    # Fewer points than quantisation levels.
    few = x[:9]
    assert_same(KNNSearch(backend="faiss-pq")(few, 3), brute_force(few, 3), 3)


@pytest.mark.parametrize("backend", EXACT)
def test_many_duplicates_never_return_self(backend: str, gen: torch.Generator) -> None:
    # 30 copies of one point with k = 5: ties at distance 0 exceed k + 1.
    x = torch.cat([torch.zeros(30, 2), torch.randn(50, 2, generator=gen)])
    nb = knn(x, 5, backend=backend)
    assert not (nb.indices == torch.arange(80)[:, None]).any()
    assert torch.all(nb.distances[:30] == 0)
    assert torch.isfinite(nb.distances).all()


# ----------------------------------------------------------------------------- per group


def group_mask(group: torch.Tensor) -> torch.Tensor:
    return group[:, None] == group[None, :]


@pytest.mark.parametrize("backend", [*EXACT, "auto"])
def test_grouped_with_group_ids(backend: str, gen: torch.Generator) -> None:
    x = torch.randn(900, 3, generator=gen)
    group = torch.randint(0, 5, (900,), generator=gen)
    nb = knn_grouped(x, 4, group, backend=backend)
    assert_same(nb, brute_force(x, 4, mask=group_mask(group)), 4)
    assert torch.equal(group[nb.indices], group[:, None].expand(-1, 4))


@pytest.mark.parametrize("backend", [*EXACT, "auto"])
@pytest.mark.parametrize("dim", [2, 29])
def test_grouped_equal_blocks(backend: str, dim: int, gen: torch.Generator) -> None:
    x = torch.randn(800, dim, generator=gen)
    blocks = torch.arange(800) // 200
    nb = knn_grouped(x, 5, num_groups=4, backend=backend)
    assert_same(nb, brute_force(x, 5, mask=group_mask(blocks)), 5)
    # Equal blocks given as explicit ids give the same answer.
    nb_ids = knn_grouped(x, 5, blocks, backend=backend)
    assert torch.equal(nb_ids.indices, nb.indices)


def test_grouped_many_groups_shared_tree(gen: torch.Generator) -> None:
    # More groups than KDTREE_LOOP_MAX_GROUPS: one kd-tree over groups shifted apart.
    m = knn_mod.KDTREE_LOOP_MAX_GROUPS + 16
    x = torch.randn(m * 12, 2, generator=gen)
    group = torch.randperm(m * 12, generator=gen) % m
    nb = knn_grouped(x, 3, group, backend="kdtree")
    assert_same(nb, brute_force(x, 3, mask=group_mask(group)), 3)


def test_grouped_torch_unequal_groups_small_budget(gen: torch.Generator) -> None:
    x = torch.randn(500, 4, generator=gen)
    group = torch.cat([torch.zeros(50), torch.ones(300), torch.full((150,), 2.0)]).long()
    group = group[torch.randperm(500, generator=gen)]
    nb = knn_grouped(x, 6, group, backend="torch", memory_budget=4096)
    assert_same(nb, brute_force(x, 6, mask=group_mask(group)), 6)


def test_grouped_duplicates_across_groups_are_not_neighbours(gen: torch.Generator) -> None:
    # The same point in two groups: each copy must not see the other.
    pts = torch.randn(40, 2, generator=gen)
    x = torch.cat([pts, pts])
    nb = knn_grouped(x, 3, num_groups=2)
    assert torch.all(nb.distances > 0)
    assert torch.all((nb.indices < 40) == (torch.arange(80) < 40)[:, None])


def test_registered_backend_gets_exclusion_reranking_and_groups_from_the_base(
    monkeypatch, gen: torch.Generator
) -> None:
    # A backend that only ranks candidates: the SearchBackend template must exclude each point
    # by index, return exact sorted distances, and run it per group.
    class CdistBackend(SearchBackend):
        name = "cdist"

        def candidates(self, q, r, kk, self_query, options):
            return torch.cdist(q.double(), r.double()).topk(kk, dim=1, largest=False).indices

    monkeypatch.setitem(knn_mod.REGISTRY, "cdist", CdistBackend())
    base = torch.randn(150, 3, generator=gen)
    x = torch.cat([base, base])  # each point's copy ties with the point itself at distance 0
    nb = knn(x, 4, backend="cdist")
    assert not (nb.indices == torch.arange(300)[:, None]).any()
    assert torch.equal(nb.indices[:, 0], (torch.arange(300) + 150) % 300)
    true = (x[nb.indices] - x[:, None, :]).norm(dim=-1)
    torch.testing.assert_close(nb.distances, true, rtol=1e-6, atol=1e-6)
    y = torch.randn(400, 3, generator=gen)
    group = torch.randint(0, 4, (400,), generator=gen)
    assert_same(
        knn_grouped(y, 5, group, backend="cdist"), brute_force(y, 5, mask=group_mask(group)), 5
    )
    monkeypatch.delitem(knn_mod.REGISTRY, "cdist")
    with pytest.raises(ValueError, match="unknown kNN backend 'cdist'"):
        knn(x, 4, backend="cdist")


# ----------------------------------------------------------------------------- selection


def test_auto_rule() -> None:
    assert select_backend(65536, 65536, 2) == "kdtree"
    assert select_backend(65536, 65536, 6) == "kdtree"
    assert select_backend(65536, 65536, 29) == "faiss-pq"
    assert select_backend(65536, 65536, 29, allow_approximate=False) == "faiss"
    assert select_backend(65536, 65536, 8, allow_approximate=False) == "kdtree"
    assert select_backend(4096, 4096, 29) == "faiss"
    # Without faiss-gpu, CUDA data stays on the GPU with the torch kernel.
    on_cuda = "faiss" if knn_mod.faiss_gpu_available() else "torch"
    assert select_backend(65536, 65536, 29, "cuda") == on_cuda
    assert select_grouped_backend(4096, 29, "cuda") == "torch"
    if not knn_mod.faiss_gpu_available():
        # Millions of low-dimensional states: the host's kd-tree, not GPU brute force.
        assert select_backend(6_553_600, 6_553_600, 2, "cuda") == "kdtree"
        assert select_backend(65536, 65536, 2, "cuda") == "torch"
        assert select_grouped_backend(409_600, 2, "cuda") == "kdtree"
        assert select_grouped_backend(409_600, 29, "cuda") == "torch"
    assert select_grouped_backend(4096, 29) == "torch"
    assert select_grouped_backend(4096, 2) == "kdtree"
    assert select_grouped_backend(16384, 29) == "faiss"
    assert KNNSearch(backend="torch").resolve(10, 10, 2, "cpu") == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(gen: torch.Generator) -> None:
    x = torch.randn(3000, 8, generator=gen)
    ref = brute_force(x, 5)
    # Without faiss (an offline node's bundle has none) "auto" is the torch kernel.
    backends = ("auto", "torch", "faiss") if knn_mod.faiss_available() else ("auto", "torch")
    for backend in backends:
        nb = knn(x.cuda(), 5, backend=backend)
        assert nb.distances.is_cuda and nb.indices.is_cuda
        assert_same(Neighbors(nb.distances.cpu(), nb.indices.cpu()), ref, 5)
    nb = knn_grouped(x.cuda(), 5, num_groups=3, backend="auto")
    blocks = torch.arange(3000) // 1000
    assert_same(
        Neighbors(nb.distances.cpu(), nb.indices.cpu()),
        brute_force(x, 5, mask=group_mask(blocks)),
        5,
    )


# ----------------------------------------------------------------------------- bad input


def test_k_too_large() -> None:
    x = torch.randn(10, 2)
    with pytest.raises(ValueError, match="use k <= 9"):
        knn(x, 10)
    with pytest.raises(ValueError, match="use k <= 4"):
        knn(x, 5, torch.randn(4, 2))
    with pytest.raises(ValueError, match="smallest group"):
        knn_grouped(x, 4, torch.tensor([0] * 6 + [1] * 4))
    with pytest.raises(ValueError, match="positive int"):
        knn(x, 0)
    # A single point has no neighbour: the fix is more points, not a k below 1.
    with pytest.raises(ValueError, match="only 0 candidate neighbours; provide more points"):
        knn(x[:1], 1)


def test_non_finite_points() -> None:
    x = torch.randn(20, 2)
    x[3, 1] = float("nan")
    x[7, 0] = float("inf")
    with pytest.raises(ValueError, match=r"NaN or inf \(first rows: \[3, 7\]\)"):
        knn(x, 2)
    with pytest.raises(ValueError, match="NaN or inf"):
        knn(torch.randn(5, 2), 2, x)
    with pytest.raises(ValueError, match="NaN or inf"):
        knn_grouped(x, 2, num_groups=2)


def test_empty_and_malformed_groups() -> None:
    x = torch.randn(12, 2)
    with pytest.raises(ValueError, match=r"groups \[1\] have no points"):
        knn_grouped(x, 2, torch.tensor([0] * 6 + [2] * 6))
    with pytest.raises(ValueError, match="have no points"):
        knn_grouped(x, 2, torch.zeros(12, dtype=torch.long), num_groups=2)
    with pytest.raises(ValueError, match="equal blocks"):
        knn_grouped(x, 2, num_groups=5)
    with pytest.raises(ValueError, match="one per point"):
        knn_grouped(x, 2, torch.zeros(11, dtype=torch.long))
    with pytest.raises(ValueError, match="integer ids"):
        knn_grouped(x, 2, torch.zeros(12))
    with pytest.raises(ValueError, match="num_groups=M"):
        knn_grouped(x, 2)


def test_mismatched_devices() -> None:
    x = torch.randn(12, 2)
    with pytest.raises(ValueError, match=r"move both to one device"):
        knn(x, 2, torch.empty(12, 2, device="meta"))
    with pytest.raises(ValueError, match=r"move both to one device"):
        knn_grouped(x, 2, torch.zeros(12, dtype=torch.long, device="meta"))


def test_bad_shapes_and_backend() -> None:
    with pytest.raises(ValueError, match=r"shape \[N, p\]"):
        knn(torch.randn(10), 2)
    with pytest.raises(ValueError, match="same p"):
        knn(torch.randn(10, 2), 2, torch.randn(10, 3))
    with pytest.raises(ValueError, match="floating point"):
        knn(torch.zeros(10, 2, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="unknown kNN backend"):
        knn(torch.randn(10, 2), 2, backend="annoy")
    with pytest.raises(ValueError, match="memory_budget"):
        KNNSearch(memory_budget=0)

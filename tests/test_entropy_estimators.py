"""Entropy estimators against analytic values and independent scipy/numpy references.

Tolerances (nats) and sample sizes are stated next to each check and in docs/entropy.md. The
Kozachenko-Leonenko estimator is consistent but biased at finite N, strongly so in high
dimension and near the edges of a bounded support; those cases are checked against a literal
scipy implementation of the same formula plus a stated bound on the analytic error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree
from scipy.special import digamma, gammaln

from myriad.entropy import (
    DEFAULT_MIN_DISTANCE,
    ImportanceWeightedEntropy,
    KNNReward,
    KNNSearch,
    cumulative_log_ratio,
    importance_weighted_entropy,
    kl_entropy,
    kl_entropy_from_distances,
    knn_grouped,
    knn_reward,
    knn_reward_from_distances,
    log_unit_ball_volume,
    population_entropy,
)
from myriad.entropy.knn import Neighbors, knn
from myriad.pretrain.objectives import EntropyMeasurement

EXACT = KNNSearch(allow_approximate=False)


def gaussian_entropy(p: int, s: float = 1.0) -> float:
    return 0.5 * p * math.log(2 * math.pi * math.e * s * s)


def reference_kth(x: np.ndarray, k: int, queries: np.ndarray | None = None) -> np.ndarray:
    """Distance of each query (default: each point) to its k-th neighbour in ``x``, the point
    itself excluded, with scipy's kd-tree in float64 (column 0 is the point itself at 0)."""
    r, _ = cKDTree(x).query(x if queries is None else queries, k=k + 1)
    return r[:, k]


def reference_kl(x: np.ndarray, k: int, min_distance: float | None = None) -> float:
    """docs/algorithms.md §1 written out with scipy (kd-tree, gammaln, digamma), float64;
    distances floored at ``min_distance`` when given."""
    n, p = x.shape
    rk = reference_kth(x, k)
    if min_distance is not None:
        rk = np.maximum(rk, min_distance)
    log_cp = (p / 2) * np.log(np.pi) - gammaln(1 + p / 2)
    return float(np.mean(np.log(n) + log_cp + p * np.log(rk) - np.log(k)) + np.log(k) - digamma(k))


def sample(kind: str, n: int, p: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, p, generator=g) if kind == "gauss" else torch.rand(n, p, generator=g)


# ----------------------------------------------------------------------------- unit ball


def test_log_unit_ball_volume() -> None:
    assert log_unit_ball_volume(1) == pytest.approx(math.log(2.0))
    assert log_unit_ball_volume(2) == pytest.approx(math.log(math.pi))
    assert log_unit_ball_volume(3) == pytest.approx(math.log(4 * math.pi / 3))
    for p in (29, 500, 5000):  # c_p itself underflows float64 around p = 450
        expected = (p / 2) * math.log(math.pi) - float(gammaln(1 + p / 2))
        assert log_unit_ball_volume(p) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match=">= 1"):
        log_unit_ball_volume(0)


# ----------------------------------------------------------------------------- KL estimate

# (kind, p, N, tolerance in nats against the analytic entropy), k = 10, seed 0.
ANALYTIC_CASES = [
    ("gauss", 1, 4096, 0.05),
    ("gauss", 2, 4096, 0.05),
    ("gauss", 8, 8192, 0.15),
    ("unif", 1, 4096, 0.05),
    ("unif", 2, 4096, 0.08),
]


@pytest.mark.parametrize(("kind", "p", "n", "tol"), ANALYTIC_CASES)
def test_kl_entropy_analytic(kind: str, p: int, n: int, tol: float) -> None:
    x = sample(kind, n, p, seed=0)
    truth = gaussian_entropy(p) if kind == "gauss" else 0.0
    h = kl_entropy(x, 10, search=EXACT)
    assert h.dtype == torch.float64
    assert abs(float(h) - truth) < tol
    assert float(h) == pytest.approx(reference_kl(x.double().numpy(), 10), abs=1e-5)


# (kind, p, N, bias band in nats): the finite-N bias of the estimator, stated, not hidden.
BIASED_CASES = [
    ("gauss", 29, 8192, (1.5, 3.0)),  # measured +2.36 (5.7 % of 41.15 nats)
    ("unif", 8, 8192, (0.7, 1.4)),  # edge effect, measured +1.05
    ("unif", 29, 4096, (6.5, 9.5)),  # edge effect dominates, measured +8.22
]


@pytest.mark.parametrize(("kind", "p", "n", "band"), BIASED_CASES)
def test_kl_entropy_high_dimension(kind: str, p: int, n: int, band: tuple[float, float]) -> None:
    x = sample(kind, n, p, seed=0)
    truth = gaussian_entropy(p) if kind == "gauss" else 0.0
    h = float(kl_entropy(x, 10, search=EXACT))
    # Same formula, independent implementation: tight.
    assert h == pytest.approx(reference_kl(x.double().numpy(), 10), rel=1e-6)
    # Against the analytic value: the known positive bias, within a stated band.
    assert band[0] < h - truth < band[1]


def test_kl_bias_shrinks_with_n() -> None:
    truth = gaussian_entropy(29)
    errors = [
        float(kl_entropy(sample("gauss", n, 29, 1), 10, search=EXACT)) - truth for n in (1024, 8192)
    ]
    assert errors[1] < errors[0]


def test_scale_and_shift_equivariance() -> None:
    # H(a X + b) = H(X) + p log a holds exactly for the estimator (same neighbours).
    x = sample("unif", 2000, 5, 3)
    h = float(kl_entropy(x, 5, search=EXACT))
    h2 = float(kl_entropy(3.0 * x - 7.0, 5, search=EXACT))
    assert h2 == pytest.approx(h + 5 * math.log(3.0), abs=1e-4)


def test_duplicates_give_finite_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.zeros(40, 3), torch.randn(500, 3, generator=g)])
    h = kl_entropy(x, 10)
    assert torch.isfinite(h)
    # The 40 copies have R_k = 0, clamped to DEFAULT_MIN_DISTANCE before the log.
    r = knn(x, 10).distances[:, 9].double()
    expected = (
        math.log(540)
        - float(digamma(10))
        + log_unit_ball_volume(3)
        + 3 * torch.log(r.clamp_min(DEFAULT_MIN_DISTANCE)).mean()
    )
    assert float(h) == pytest.approx(float(expected), rel=1e-10)
    with pytest.raises(ValueError, match="min_distance"):
        kl_entropy_from_distances(r, 3, 10, min_distance=0.0)


def test_duplicates_give_finite_population_and_weighted_entropy() -> None:
    g = torch.Generator().manual_seed(4)
    # Member 0 is pinned in one spot (all its states identical); member 1 moves.
    x = torch.cat([torch.zeros(300, 2), torch.randn(300, 2, generator=g)])
    pe = population_entropy(x, 5, num_groups=2)
    values = torch.stack([pe.collective, *pe.individual, pe.diversity])
    assert torch.isfinite(values).all()
    assert float(pe.individual[0]) < float(pe.individual[1])
    log_w = torch.randn(600, generator=g, dtype=torch.float64).requires_grad_()
    weighted = importance_weighted_entropy(log_w, knn(x, 5), 2)
    (weighted.entropy + weighted.kl).backward()
    assert torch.isfinite(weighted.entropy) and torch.isfinite(weighted.kl)
    assert torch.isfinite(log_w.grad).all()


def test_batched_weighted_entropy_matches_each_set() -> None:
    g = torch.Generator().manual_seed(6)
    sets = [torch.randn(200, 3, generator=g) for _ in range(3)]
    neighbours = [knn(x, 5) for x in sets]
    log_w = torch.randn(3, 200, generator=g, dtype=torch.float64)
    batched = importance_weighted_entropy(
        log_w,
        Neighbors(
            torch.stack([nb.distances for nb in neighbours]),
            torch.stack([nb.indices for nb in neighbours]),
        ),
        3,
    )
    assert batched.entropy.shape == (3,) and batched.kl.shape == (3,)
    for i, nb in enumerate(neighbours):
        single = importance_weighted_entropy(log_w[i], nb, 3)
        torch.testing.assert_close(batched.entropy[i], single.entropy, rtol=1e-12, atol=0)
        torch.testing.assert_close(batched.kl[i], single.kl, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"\[N\] \(or \[B, N\]\)"):
        importance_weighted_entropy(log_w[:, :10], neighbours[0], 3)


def test_batched_distances_give_one_estimate_per_row() -> None:
    r = torch.rand(5, 300, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.1
    batched = kl_entropy_from_distances(r, 4, 7)
    assert batched.shape == (5,)
    rows = torch.stack([kl_entropy_from_distances(row, 4, 7) for row in r])
    torch.testing.assert_close(batched, rows, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\[N\] \(or \[B, N\]\)"):
        kl_entropy_from_distances(torch.ones(2, 3, 4), 4, 7)
    with pytest.raises(ValueError, match="non-empty"):
        kl_entropy_from_distances(torch.ones(3, 0), 4, 7)


# ----------------------------------------------------------------------------- population


def test_mixture_identity_two_far_apart_gaussians() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 2, generator=g)
    b = torch.randn(4096, 2, generator=g) + torch.tensor([100.0, 0.0])
    x = torch.cat([a, b])
    pe = population_entropy(x, 10, num_groups=2)
    # Each member is a standard 2-D Gaussian: H = log(2 pi e) (KL bias at 4,096 points ~ -0.02).
    expected = torch.full((2,), math.log(2 * math.pi * math.e), dtype=torch.float64)
    torch.testing.assert_close(pe.individual, expected, atol=0.05, rtol=0)
    # Disjoint supports: generalised Jensen-Shannon = log M.
    assert float(pe.diversity) == pytest.approx(math.log(2), abs=0.01)
    assert pe.individual.shape == (2,)
    for h in pe.individual:
        assert abs(float(h) - gaussian_entropy(2)) < 0.05
    assert float(pe.objective(0.0)) == pytest.approx(float(pe.individual_mean))
    assert float(pe.objective(1.0)) == pytest.approx(float(pe.collective))


def test_mixture_four_members_shuffled_ids() -> None:
    g = torch.Generator().manual_seed(1)
    centres = torch.tensor([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0], [50.0, 50.0]])
    group = torch.arange(4).repeat_interleave(2048)
    x = torch.randn(8192, 2, generator=g) + centres[group]
    perm = torch.randperm(8192, generator=g)
    pe = population_entropy(x[perm], 10, group[perm])
    assert float(pe.diversity) == pytest.approx(math.log(4), abs=0.02)
    # The per-member entropies come out in member order.
    pe_blocks = population_entropy(x, 10, num_groups=4)
    torch.testing.assert_close(pe.individual, pe_blocks.individual)


def test_unequal_members_match_scipy_reference() -> None:
    g = torch.Generator().manual_seed(8)
    sizes = [300, 700, 500]
    group = torch.arange(3).repeat_interleave(torch.tensor(sizes))
    x = torch.randn(1500, 3, generator=g, dtype=torch.float64) * (1.0 + group[:, None])
    perm = torch.randperm(1500, generator=g)
    pe = population_entropy(x[perm], 6, group[perm], search=EXACT)
    xs = x.numpy()
    members = [xs[group.numpy() == i] for i in range(3)]
    expected = [reference_kl(xi, 6) for xi in members]
    # Neighbour distances are float32 whatever the input: 1e-7 relative per distance.
    assert pe.individual.tolist() == pytest.approx(expected, rel=1e-7)
    assert float(pe.collective) == pytest.approx(reference_kl(xs, 6), rel=1e-7)


def test_identical_members_have_no_diversity() -> None:
    x = sample("gauss", 8192, 2, seed=5)
    pe = population_entropy(x, 10, num_groups=4)
    assert abs(float(pe.diversity)) < 0.05


# ----------------------------------------------------------------------------- importance weights


def reference_weighted(x: np.ndarray, log_w: np.ndarray, k: int) -> tuple[float, float]:
    """docs/algorithms.md §4 written out with scipy and explicit normalisation, float64."""
    n, p = x.shape
    r, idx = cKDTree(x).query(x, k=k + 1)
    w = np.exp(log_w - log_w.max())
    w = w / w.sum()
    wx = w[idx[:, 1:]].sum(axis=1)
    vx = np.exp((p / 2) * np.log(np.pi) - gammaln(1 + p / 2)) * r[:, k] ** p
    h = -np.sum(wx / k * np.log(wx / vx)) + np.log(k) - digamma(k)
    kl = np.mean(np.log(k / (n * wx)))
    return float(h), float(kl)


def test_equal_weights_reproduce_plain_estimate() -> None:
    x = sample("gauss", 3000, 3, seed=2)
    iw = ImportanceWeightedEntropy(x, 10, search=EXACT)
    for const in (0.0, 3.7, -250.0):
        out = iw(torch.full((3000,), const))
        assert float(out.entropy) == pytest.approx(float(iw.plain_entropy), abs=1e-10)
        assert float(out.kl) == pytest.approx(0.0, abs=1e-12)
    assert float(iw.plain_entropy) == pytest.approx(
        float(kl_entropy(x, 10, search=EXACT)), abs=1e-12
    )


def test_weighted_matches_reference() -> None:
    x = sample("gauss", 1500, 2, seed=3)
    g = torch.Generator().manual_seed(4)
    log_w = 0.5 * torch.randn(1500, generator=g, dtype=torch.float64)
    out = importance_weighted_entropy(log_w, knn(x, 5), 2)
    h_ref, kl_ref = reference_weighted(x.double().numpy(), log_w.numpy(), 5)
    assert float(out.entropy) == pytest.approx(h_ref, rel=1e-6)
    assert float(out.kl) == pytest.approx(kl_ref, rel=1e-6, abs=1e-9)
    assert float(out.kl) > 0


def test_weighted_gradcheck() -> None:
    x = sample("gauss", 40, 2, seed=6)
    nb = knn(x, 3)
    g = torch.Generator().manual_seed(6)
    log_w = (0.3 * torch.randn(40, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda lw: importance_weighted_entropy(lw, nb, 2).entropy, (log_w,)
    )
    assert torch.autograd.gradcheck(lambda lw: importance_weighted_entropy(lw, nb, 2).kl, (log_w,))


def test_weighted_extreme_log_weights_stay_finite() -> None:
    x = sample("gauss", 500, 2, seed=7)
    log_w = torch.zeros(500, dtype=torch.float64)
    log_w[0] = 800.0  # exp overflows float64 without the log-space normalisation
    log_w = log_w.requires_grad_()
    out = importance_weighted_entropy(log_w, knn(x, 5), 2)
    (out.entropy + out.kl).backward()
    assert torch.isfinite(out.entropy) and torch.isfinite(out.kl)
    assert torch.isfinite(log_w.grad).all()


def test_cumulative_log_ratio_restarts_per_episode() -> None:
    g = torch.Generator().manual_seed(8)
    lr = torch.randn(7, 3, generator=g)
    start = torch.zeros(7, 3, dtype=torch.bool)
    start[3, 0] = True
    start[1, 2] = start[5, 2] = True
    expected = torch.empty_like(lr)
    for e in range(3):
        acc = 0.0
        for t in range(7):
            acc = float(lr[t, e]) if (t == 0 or start[t, e]) else acc + float(lr[t, e])
            expected[t, e] = acc
    torch.testing.assert_close(cumulative_log_ratio(lr, start), expected)


# ----------------------------------------------------------------------------- reward


def test_reward_beta_endpoints_and_mix() -> None:
    x = sample("gauss", 1200, 2, seed=9)
    r_pool = knn(x, 10).distances[:, 9]
    r_ind = knn_grouped(x, 10, num_groups=4).distances[:, 9]
    c = 0.5
    torch.testing.assert_close(
        knn_reward(x, 10, num_groups=4, beta=1.0, c=c), torch.log(c + r_pool)
    )
    torch.testing.assert_close(knn_reward(x, 10, num_groups=4, beta=0.0, c=c), torch.log(c + r_ind))
    mix = 0.3 * torch.log(c + r_ind) + 0.7 * torch.log(c + r_pool)
    torch.testing.assert_close(knn_reward(x, 10, num_groups=4, beta=0.7, c=c), mix)
    # beta = 1 needs no member information.
    torch.testing.assert_close(knn_reward(x, 10, beta=1.0, c=c), torch.log(c + r_pool))


def test_reward_from_distances_needs_the_weighted_terms() -> None:
    r = torch.rand(50, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(knn_reward_from_distances(r, None, 1.0, 1.0), torch.log(1.0 + r))
    torch.testing.assert_close(knn_reward_from_distances(None, r, 0.0, 2.0), torch.log(2.0 + r))
    with pytest.raises(ValueError, match="pass individual_kth"):
        knn_reward_from_distances(r, None, 0.5, 1.0)
    with pytest.raises(ValueError, match="pass collective_kth"):
        knn_reward_from_distances(None, r, 0.5, 1.0)


def test_reward_finite_on_duplicates_and_errors() -> None:
    x = torch.cat([torch.zeros(30, 2), sample("gauss", 70, 2, seed=11)])
    r = knn_reward(x, 5, num_groups=2, beta=0.5, c=1e-3)
    assert torch.isfinite(r).all()
    with pytest.raises(ValueError, match="beta"):
        knn_reward(x, 5, num_groups=2, beta=1.5)
    with pytest.raises(ValueError, match="c must be > 0"):
        knn_reward(x, 5, num_groups=2, c=0.0)
    with pytest.raises(ValueError, match="num_groups=M"):
        knn_reward(x, 5, beta=0.5)


def test_reward_module_normalises_feature_scales() -> None:
    x = sample("gauss", 1000, 3, seed=10)
    scale = torch.tensor([100.0, 0.1, 1.0])
    a = KNNReward(3, k=5, beta=0.5)(x, num_groups=4)
    b = KNNReward(3, k=5, beta=0.5)(x * scale, num_groups=4)
    # Not exact: RunningMeanStd starts from a unit-variance prior (pseudo-count 1e-4) and adds
    # 1e-8 under the square root.
    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    module = KNNReward(3, k=5)
    module(x * scale)
    assert "normalizer.var" in module.state_dict()
    torch.testing.assert_close(
        module.normalizer.std.float(), scale * x.std(0, unbiased=False), rtol=1e-3, atol=1e-6
    )


# ----------------------------------------------------------------------------- pretraining path


@pytest.mark.parametrize(("beta", "c"), [(1.0, 1.0), (0.0, 0.5), (0.7, 1.0)])
def test_pretraining_measurement_matches_scipy_reference(beta: float, c: float) -> None:
    """What pretraining computes each iteration (EntropyMeasurement: entropies of both terms
    and the per-state reward) against docs/algorithms.md §1-§3 written out with scipy, on a
    rollout ``[T, E, p]`` whose two members (env blocks 0-7 and 8-15) explore differently and
    where env 0 never moves (exact duplicates: the 1e-3 resolution floor decides its term)."""
    t, e, p, k, m, floor = 32, 16, 2, 5, 2, 1e-3
    g = torch.Generator().manual_seed(3)
    features = torch.randn(t, e, p, generator=g)
    features[:, 8:] = 3.0 * features[:, 8:] + torch.tensor([20.0, -5.0])
    features[:, 0] = features[0, 0]
    meas = EntropyMeasurement(k, m, p, min_distance=floor)(features)

    # Env-major rows (member i owns rows i * 8T .. (i + 1) * 8T - 1), scaled by the std as
    # numpy computes it; the running estimate differs by its prior's weight, ~1e-4 / N.
    x = features.transpose(0, 1).reshape(-1, p).double().numpy()
    std = x.std(axis=0)
    scaled = x / std
    log_scale = float(np.log(std).sum())
    members = [scaled[: 8 * t], scaled[8 * t :]]
    assert meas.log_scale == pytest.approx(log_scale, abs=1e-6)
    assert float(meas.collective) == pytest.approx(
        reference_kl(scaled, k, floor) + log_scale, abs=1e-5
    )
    expected = [reference_kl(xi, k, floor) + log_scale for xi in members]
    assert meas.individual.tolist() == pytest.approx(expected, abs=1e-5)
    assert expected[1] > expected[0] + 2.0  # member 1's cloud is 3x wider: the layout matters
    assert float(meas.diversity) == pytest.approx(
        float(meas.collective) - float(np.mean(expected)), abs=1e-5
    )

    pooled = reference_kth(scaled, k)
    own = np.concatenate([reference_kth(xi, k) for xi in members])
    reward = beta * np.log(c + pooled) + (1 - beta) * np.log(c + own)
    got = meas.reward(beta, c)  # [T, E]
    assert got.shape == (t, e)
    np.testing.assert_allclose(got.T.reshape(-1).double().numpy(), reward, rtol=1e-5, atol=1e-5)

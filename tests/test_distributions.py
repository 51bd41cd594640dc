"""The closed-form distribution helpers against torch.distributions (an independent reference)."""

import torch
from torch.distributions import Categorical, Independent, Normal, kl_divergence

from myriad.nn.distributions import (
    categorical_entropy,
    categorical_kl,
    categorical_log_prob,
    gaussian_entropy,
    gaussian_kl,
    gaussian_log_prob,
    pairwise_categorical_kl,
    pairwise_gaussian_kl,
)


def _normal(mean, log_std):
    return Independent(Normal(mean, log_std.exp()), 1)


def test_gaussian_helpers_match_torch_distributions():
    g = torch.Generator().manual_seed(0)
    m1, m2 = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g)
    s1, s2 = 0.5 * torch.randn(7, 3, generator=g), 0.5 * torch.randn(7, 3, generator=g)
    a = torch.randn(7, 3, generator=g)
    p, q = _normal(m1, s1), _normal(m2, s2)
    torch.testing.assert_close(gaussian_log_prob(a, m1, s1), p.log_prob(a))
    torch.testing.assert_close(gaussian_entropy(s1), p.entropy())
    torch.testing.assert_close(gaussian_kl(m1, s1, m2, s2), kl_divergence(p, q))


def test_categorical_helpers_match_torch_distributions():
    g = torch.Generator().manual_seed(1)
    l1, l2 = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    a = torch.randint(0, 5, (6,), generator=g)
    p, q = Categorical(logits=l1), Categorical(logits=l2)
    torch.testing.assert_close(categorical_log_prob(a, l1), p.log_prob(a))
    torch.testing.assert_close(categorical_entropy(l1), p.entropy())
    torch.testing.assert_close(categorical_kl(l1, l2), kl_divergence(p, q))


def test_pairwise_matrices_match_pairwise_loops():
    g = torch.Generator().manual_seed(2)
    mean, log_std = torch.randn(3, 4, 2, generator=g), 0.3 * torch.randn(3, 1, 2, generator=g)
    logits = torch.randn(3, 4, 5, generator=g)
    kl = pairwise_gaussian_kl(mean, log_std)
    kc = pairwise_categorical_kl(logits)
    for i in range(3):
        for j in range(3):
            ref = kl_divergence(
                _normal(mean[i], log_std[i].expand(4, 2)), _normal(mean[j], log_std[j].expand(4, 2))
            ).mean()
            torch.testing.assert_close(kl[i, j], ref)
            ref_c = kl_divergence(Categorical(logits=logits[i]), Categorical(logits=logits[j]))
            torch.testing.assert_close(kc[i, j], ref_c.mean())
    assert torch.all(kl.diagonal() == 0) and torch.all(kc.diagonal().abs() < 1e-6)

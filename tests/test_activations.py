"""myriad's ELU (exp form on the CPU) against ELU evaluated in float64 with expm1."""

from __future__ import annotations

import math

import pytest
import torch

from myriad.nn.activations import ELU, _exp_, elu, elu_
from myriad.nn.population import ACTIVATIONS, PopulationActorCritic


def _inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, -1e-4, 1e-4, -88.0, -1e4, 30.0, -1e-8])
    return torch.cat([torch.randn(100_000, generator=gen) * 3, edges])


def _reference(x: torch.Tensor, alpha: float) -> torch.Tensor:
    x64 = x.double()
    return torch.where(x64 > 0, x64, alpha * torch.expm1(x64))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_values_are_within_the_stated_bound_of_the_exact_elu(alpha: float) -> None:
    x = _inputs()
    got = elu(x, alpha)
    assert got.dtype == torch.float32
    error = (got.double() - _reference(x, alpha)).abs()
    assert float(error.max()) <= 1.2e-7 * alpha
    # Positive inputs pass through exactly; so do alpha (exp(x) - 1) = -alpha for x <= -88.
    assert torch.equal(got[x > 0], x[x > 0])
    assert torch.all(got[x <= -88.0] == -alpha)
    # Torch's own kernel differs by as little.
    assert float((got - torch.nn.functional.elu(x, alpha)).abs().max()) <= 1.2e-7 * alpha


def test_exp_through_exp2_is_within_its_stated_error() -> None:
    # Every negative input the ELU exponentiates, densely: 2M points spread over [-20, 0]
    # (exp(x) < 2.1e-9 below, where the error is far smaller), plus the decade near 0.
    x = torch.cat([torch.linspace(-20.0, 0.0, 2_000_001), -torch.logspace(-8, 0, 200_001)])
    error = (_exp_(x.clone()).double() - torch.exp(x.double())).abs()
    assert float(error.max()) <= 6e-8


def test_special_values() -> None:
    x = torch.tensor([math.inf, -math.inf, math.nan])
    got = elu(x)
    assert got[0] == math.inf and got[1] == -1.0 and math.isnan(got[2])


def test_in_place_and_module_forms_agree_and_alpha_above_one_runs_torchs_kernel() -> None:
    x = _inputs()
    y = x.clone()
    assert elu_(y) is y
    assert torch.equal(y, elu(x))
    assert torch.equal(ELU()(x), elu(x))
    # For alpha > 1, max(x, alpha (exp(x) - 1)) is not ELU: torch's kernel runs.
    assert torch.equal(elu(x, 2.0), torch.nn.functional.elu(x, 2.0))
    assert torch.equal(ELU(alpha=2.0)(x), torch.nn.functional.elu(x, 2.0))


def test_gradient_is_the_exact_derivative() -> None:
    x = _inputs()[:2000].double().requires_grad_()
    assert torch.autograd.gradcheck(elu, (x[:50],))
    (grad,) = torch.autograd.grad(elu(x).sum(), x)
    expected = torch.where(x > 0, torch.ones_like(x), torch.exp(x)).detach()
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=0.0)


def test_populations_use_it_for_elu() -> None:
    assert ACTIVATIONS["elu"] is ELU and issubclass(ELU, torch.nn.ELU)
    model = PopulationActorCritic(3, 2, 2, activation="elu")
    assert any(isinstance(m, ELU) for m in model.modules())

"""The oriented linear maps of the learning loop give torch's values and gradients."""

from __future__ import annotations

import pytest
import torch

from myriad.nn.linear import Linear, batched_linear, linear

# (M, n, in, out): one output (matrix-vector), out < in, in < out, square.
SHAPES = [(1, 7, 4, 64), (3, 5, 64, 2), (2, 6, 64, 1), (4, 3, 5, 5)]


def _inputs(m: int, n: int, i: int, o: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(m * 1000 + n * 100 + i * 10 + o)
    return tuple(
        torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
        for shape in ((m, n, i), (m, i, o), (m, o))
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_batched_linear_matches_baddbmm_and_its_gradients(shape: tuple[int, ...]) -> None:
    x, w, b = _inputs(*shape)
    y = batched_linear(x, w, b)
    reference = torch.baddbmm(b.unsqueeze(1), x, w)
    torch.testing.assert_close(y, reference)
    upstream = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), upstream)
    expected = torch.autograd.grad(reference, (x, w, b), upstream)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradgradcheck(batched_linear, (x, w, b))


def test_linear_module_is_nn_linear_with_the_same_state_and_gradients() -> None:
    torch.manual_seed(0)
    fast, plain = Linear(4, 64), torch.nn.Linear(4, 64)
    plain.load_state_dict(fast.state_dict())
    assert list(fast.state_dict()) == list(plain.state_dict())
    x = torch.randn(300, 4)
    torch.testing.assert_close(fast(x), plain(x))
    fast(x).square().sum().backward()
    plain(x).square().sum().backward()
    torch.testing.assert_close(fast.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fast.bias.grad, plain.bias.grad, rtol=1e-5, atol=1e-4)
    assert fast.weight.grad.is_contiguous()


def test_linear_of_one_member_equals_addmm_and_only_needed_gradients_are_formed() -> None:
    x, w, b = _inputs(1, 9, 64, 2)
    y = linear(x[0].detach(), w[0], b[0])
    torch.testing.assert_close(y, torch.addmm(b[0], x[0], w[0]))
    y.sum().backward()
    assert w.grad is not None and b.grad is not None and x.grad is None

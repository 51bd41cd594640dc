"""ELU evaluated through ``exp`` on the CPU, where torch's ELU kernel is dominated by ``expm1``.

For ``0 < alpha <= 1``, ``ELU(x) = max(x, alpha (exp(min(x, 0)) - 1))``: for ``x > 0`` the second
term is 0, and for ``x <= 0`` it is at least ``exp(x) - 1 >= x``. On a CPU torch evaluates its ELU
with a vectorised ``expm1``, which costs about five times a vectorised ``exp``: over a
``[4096, 64]`` activation (one chunk of :class:`~myriad.nn.mlp.MLP`) ``F.elu`` took 368 us and the
four passes ``clamp``, ``exp``, ``sub``, ``maximum`` 241 us on one thread of the 2-core benchmark
CPU (AVX-512; one-off observation, 2026-11-26). ELU is the most expensive op of a PPO update on
such networks, more than the matrix products.

For float32, ``exp`` itself is evaluated as ``exp2(x log2(e))``: torch's vectorised ``exp2`` took
18 us over a ``[2048, 64]`` tensor where ``exp`` took 81 us, and the ELU of a ``[4096, 64]``
activation 103 us against ``F.elu``'s 210 us (one thread, CPU time, one-off observation,
2026-11-28). Rounding ``log2(e)`` and ``x log2(e)`` to float32 adds an error of order
``|x| exp(x) 2^-24`` to ``exp(x)`` (at most about ``3e-8``, as ``|x| exp(x) <= 1/e``); with the
result's own rounding, this ``exp(x)`` is within ``6e-8`` of the exact value for every ``x <= 0``
(checked on a dense grid by ``tests/test_activations.py``).

The price is ``exp(x) - 1`` instead of ``expm1(x)`` for negative inputs: an absolute error of at
most about ``1.2e-7 alpha`` (half a unit in the last place of 1, plus the error of ``exp`` above),
which is a relative error only for inputs within about ``1e-3`` of 0. The
derivative is taken from the output, as torch's own ELU backward does (``alpha exp(x) = out +
alpha`` for ``x <= 0``). On other devices, for ``alpha`` outside ``(0, 1]``, and while a graph is
traced or exported (:mod:`myriad.nn.tracing`), torch's kernel runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from myriad.nn.tracing import exporting


def _exp_form(x: torch.Tensor, alpha: float) -> bool:
    return x.device.type == "cpu" and 0.0 < alpha <= 1.0


#: ``log2(e)``: ``exp(x) = exp2(x log2(e))``.
LOG2_E = 1.0 / math.log(2.0)


def _exp_(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in place; float32 through ``exp2``, whose vectorised CPU kernel is several
    times faster than ``exp``'s (module docstring for its error)."""
    return x.mul_(LOG2_E).exp2_() if x.dtype == torch.float32 else x.exp_()


def _negative_part(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha (exp(min(x, 0)) - 1)``, a new tensor shaped like ``x``."""
    negative = _exp_(x.clamp(max=0.0)).sub_(1.0)
    return negative if alpha == 1.0 else negative.mul_(alpha)


def elu_(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """ELU of ``x`` in place (no autograd record); returns ``x``."""
    if not _exp_form(x, alpha):
        return torch.nn.functional.elu_(x, alpha)
    return torch.maximum(x, _negative_part(x, alpha), out=x)


def elu_grad(grad: torch.Tensor, out: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Gradient with respect to ELU's input, from the output ``out`` and ``grad = dL/dout``."""
    return torch.ops.aten.elu_backward(grad, alpha, 1.0, 1.0, True, out)


class _ELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, alpha: float) -> torch.Tensor:
        negative = _negative_part(x, alpha)
        out = torch.maximum(x, negative, out=negative)
        ctx.alpha = alpha
        ctx.save_for_backward(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (out,) = ctx.saved_tensors
        return elu_grad(grad, out, ctx.alpha), None


def elu(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """ELU of ``x`` (any shape), differentiable; torch's own ELU while a graph is traced or
    exported (:mod:`myriad.nn.tracing`)."""
    if not _exp_form(x, alpha) or exporting():
        return torch.nn.functional.elu(x, alpha)
    if torch.is_grad_enabled() and x.requires_grad:
        out: torch.Tensor = _ELU.apply(x, alpha)
        return out
    negative = _negative_part(x, alpha)
    return torch.maximum(x, negative, out=negative)


class ELU(nn.ELU):
    """``nn.ELU`` (same arguments, no parameters) evaluated with :func:`elu`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input) if self.inplace else elu(input, self.alpha)

"""Linear maps whose matrix products are oriented for the thin shapes of RL networks.

A policy's layers multiply a tall batch ``[n, in]`` (tens of thousands of rows) by a small
weight, where ``in`` or ``out`` is often tiny (an observation of 4 numbers, an action of 2, one
value). BLAS libraries are far from their peak on some orientations of such products: on a CPU
with MKL, the weight gradient of a ``4 -> 64`` layer computed as ``grad^T @ x`` (what autograd
does for ``nn.Linear``) takes about ten times as long as the same numbers computed as
``x^T @ grad``, and an ``[in, out]`` weight with ``out = 2`` is as slow in the forward product.
:func:`batched_linear` computes the same values (up to floating-point summation order) with the
orientation that puts the smaller dimension first, in the forward and the backward pass; on
CUDA the choice is harmless. Shapes: ``M`` members (a batch of independent maps), ``n`` rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from myriad.nn.tracing import exporting


class _BatchedLinear(torch.autograd.Function):
    """``y[m] = x[m] @ weight[m] + bias[m]`` with explicitly oriented products."""

    # forward(ctx, ...) rather than setup_context: Function.apply binds the signature of a
    # setup_context-style forward on every call, which costs more than a small product.
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        weight_oi = weight.transpose(1, 2).contiguous()  # [M, out, in], a few KB
        if weight.shape[2] == 1:
            # A single output is a batched matrix-vector product: as [M, 1, in] @ [M, in, n]
            # it streams x once; as [M, n, in] @ [M, in, 1] it is several times slower.
            # [M, 1, n] transposed to [M, n, 1] has the memory layout of a contiguous tensor.
            return torch.bmm(weight_oi, x.transpose(1, 2)).transpose(1, 2) + bias.unsqueeze(1)
        return torch.baddbmm(bias.unsqueeze(1), x, weight_oi.transpose(1, 2))

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        in_features, out_features = weight.shape[1], weight.shape[2]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            if out_features == 1:
                grad_x = grad * weight.transpose(1, 2)  # [M, n, 1] * [M, 1, in]
            else:
                grad_x = torch.bmm(grad, weight.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            # The product whose result has the smaller dimension first is the fast one.
            if in_features < out_features:
                grad_weight = torch.bmm(x.transpose(1, 2), grad)
            else:
                grad_weight = torch.bmm(grad.transpose(1, 2), x).transpose(1, 2)
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum(dim=1)
        return grad_x, grad_weight, grad_bias


def batched_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x [M, n, in] @ weight [M, in, out] + bias [M, out] -> [M, n, out]`` (differentiable).

    The same values as ``torch.baddbmm(bias.unsqueeze(1), x, weight)``, computed with the fast
    orientation of each product (see the module docstring); that plain product while a graph
    is traced or exported (:mod:`myriad.nn.tracing`).
    """
    if exporting():
        return torch.baddbmm(bias.unsqueeze(1), x, weight)
    return _BatchedLinear.apply(x, weight, bias)


def linear(x: torch.Tensor, weight_io: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One map: ``x [n, in] @ weight_io [in, out] + bias [out] -> [n, out]`` (differentiable)."""
    if exporting():
        return torch.addmm(bias, x, weight_io)
    return batched_linear(x.unsqueeze(0), weight_io.unsqueeze(0), bias.unsqueeze(0)).squeeze(0)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``state_dict``) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or self.bias is None:
            return super().forward(x)
        return linear(x, self.weight.t(), self.bias)

"""The MLP of every population network: an ``nn.Sequential`` of ``Linear`` and activation
modules, with per-member linear heads after it.

What the network computes is the plain layer-by-layer evaluation below. On the CPU, large
batches take a faster route to the same values (up to floating-point summation order):
:mod:`myriad.nn.chunked` runs all layers on one cache-sized chunk of rows at a time, forward and
backward, and on worker threads when OpenMP's idle threads sleep. It returns None wherever it
does not apply (other devices, traced or exported graphs, small batches, other activations),
and the plain path runs.
"""

from __future__ import annotations

import torch
from torch import nn

from myriad.nn.chunked import Plan, chunked_forward, layer_plan
from myriad.nn.linear import batched_linear


class MLP(nn.Sequential):
    """``nn.Sequential`` of ``Linear`` / activation layers (same parameters, same
    ``state_dict``), evaluated in cached row chunks on the CPU where that applies
    (:mod:`myriad.nn.chunked`).

    The chunked path takes layers that alternate ``Linear`` and one of
    :data:`myriad.nn.chunked.SUPPORTED_ACTIVATIONS` (the last ``Linear`` may have no activation)
    and inputs ``[N, in]``; anything else runs as a plain ``nn.Sequential``.
    """

    def _plan(self) -> Plan | None:
        return layer_plan(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = chunked_forward(self._plan(), x, None)
        return super().forward(x) if out is None else out

    def forward_member_heads(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """This MLP, then member m's linear head on its rows: ``x [M * n, in]`` member-major
        with equal counts, ``weight [M, hidden, out]``, ``bias [M, out]`` -> ``[M * n, out]``.

        On the chunked path the heads run on each chunk while the MLP's output is in the cache,
        forward and backward, so the ``[M * n, hidden]`` gradient of that output is never
        written out whole; otherwise the MLP runs, then :func:`batched_linear`.
        """
        out = chunked_forward(self._plan(), x, (weight, bias))
        if out is not None:
            return out
        h = super().forward(x)
        m = weight.shape[0]
        return batched_linear(h.view(m, -1, h.shape[-1]), weight, bias).reshape(-1, weight.shape[2])

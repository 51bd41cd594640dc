"""Whether a forward pass is being traced or exported rather than run.

The fast paths of :mod:`myriad.nn` (the ELU through ``exp``, the oriented products of
:mod:`myriad.nn.linear`, the chunked MLP of :mod:`myriad.nn.chunked`) are custom autograd functions
and in-place ops with ``out=`` tensors, which ``torch.jit.trace``, ``torch.jit.script`` and
TorchScript-based ONNX export cannot record. While one of them (or ``torch.export`` /
``torch.compile``, which the current ONNX exporter runs) records a graph, those modules compute
the same values with plain differentiable torch ops instead, so an exported policy is an
ordinary graph of standard operators; training and inference keep the fast paths.
"""

from __future__ import annotations

import torch


def exporting() -> bool:
    """True while ``torch.jit`` traces or scripts, or ``torch.export`` / ``torch.compile``
    records a graph."""
    return bool(torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling())

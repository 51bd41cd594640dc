"""The dense products of myriad's MLPs on the CPU, ``x @ weight.T + bias``, through oneDNN.

torch sends a float32 ``mm`` or ``addmm`` on the CPU to its BLAS library (MKL in the PyPI
wheels). For the tall, thin products of RL networks that library can be far from the CPU's peak:
on the 2-core benchmark CPU (an AMD EPYC with AVX-512) a ``[4096, 64] @ [64, 64]`` product took
305-333 us with ``mm``, and 144 us with oneDNN's linear kernel, the one torch's own compiler
uses for linear layers on the CPU (``torch.ops.mkldnn._linear_pointwise``, shipped with every
x86 build of torch); the gradient products ``[4096, 64] @ [64, 64]`` 316 us against 139 us, and
``[64, 4096] @ [4096, 64]`` 337 us against 259 us; a ``[4096, 64] @ [64, 2]`` head 162 us
against 49 us. Where MKL was faster, :mod:`myriad.nn.chunked` keeps torch's product: the weight
gradients of layers with fewer inputs than outputs (4 inputs: 37 us against 47 us) and of the
heads (26 us against 41 us), and the heads' input gradient, written in place (one-off
observations, 2026-11-28, one thread; the effect on whole commands is measured by
``benchmarks/rsl_rl_compare.py`` and ``benchmarks/cpu_matmul.py``).

The values are those of ``addmm`` up to floating-point summation order. The products here
record no autograd graph: they serve :mod:`myriad.nn.chunked`, whose custom backward calls them
too, and evaluation without gradients. Each call of oneDNN's kernel costs about 10 us more than
``addmm``'s (a ``[64, 64] @ [64, 64]`` product took 14.0 us against 7.5 us), so small batches
stay on torch's layers (:data:`myriad.nn.chunked.ONE_CHUNK_MIN_ROWS`); within a large batch only
a stream's last chunk can be small.

Where the kernel runs: float32 tensors on an x86-64 CPU, when torch's build has oneDNN and
``torch.backends.mkldnn`` is enabled, unless the process settings say ``MYRIAD_CPU_MATMUL=blas``
(:mod:`myriad.utils.process`). The first use checks the kernel against ``addmm`` on a small
product, once per process under a lock (the MLP's worker streams meet it at once); a torch whose
kernel is missing, takes other arguments or disagrees gets ``addmm`` for the rest of the
process.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable

import torch

from myriad.utils.process import process_settings

_Kernel = Callable[..., torch.Tensor]
#: oneDNN's linear kernel once checked (None where it cannot be used); ``_checked`` says whether
#: the check ran.
_kernel: _Kernel | None = None
_checked = False
#: The MLP's worker streams meet the first product at once: a stream that found the check under
#: way and went on with ``addmm`` computed its rows with other products than the other stream,
#: so the first call's values were not those of later calls.
_check_lock = threading.Lock()


def _checked_kernel() -> _Kernel | None:
    global _kernel, _checked
    if not _checked:
        with _check_lock:
            if not _checked:
                _kernel = _working_kernel()
                _checked = True
    return _kernel


def _working_kernel() -> _Kernel | None:
    """oneDNN's linear kernel where the process settings and the machine allow it and it agrees
    with ``addmm`` on a small product, else None."""
    if (
        process_settings().cpu_matmul != "onednn"
        or platform.machine().lower() not in ("x86_64", "amd64")
        or not torch.backends.mkldnn.is_available()
    ):
        return None
    try:
        kernel: _Kernel = torch.ops.mkldnn._linear_pointwise
        gen = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(s, generator=gen) for s in ((33, 7), (5, 7), (5,)))
        with torch.no_grad():
            y = kernel(x, w, b, "none", [], "")
        agrees = torch.allclose(y, torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-5)
    except (AttributeError, RuntimeError, TypeError):
        return None
    return kernel if agrees else None


def onednn_kernel(x: torch.Tensor) -> _Kernel | None:
    """oneDNN's linear kernel where it serves ``x`` (float32 on the CPU, with
    ``torch.backends.mkldnn`` enabled), else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or not torch.backends.mkldnn.enabled:
        return None
    return _checked_kernel()


def _kernel_for(x: torch.Tensor, weight: torch.Tensor) -> _Kernel | None:
    """:func:`onednn_kernel`, unless autograd would record the product (the kernel has no
    backward: the products here are meant for code that runs without gradients)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    return onednn_kernel(x)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [n, in] @ weight.T + bias``, a new ``[n, out]`` tensor; ``weight [out, in]`` in any
    memory layout (a transposed view included), ``bias [out]`` or None. Under autograd, with
    inputs that need gradients, torch's own product runs (and is recorded)."""
    kernel = _kernel_for(x, weight)
    if kernel is not None:
        return kernel(x, weight, bias, "none", [], "")
    if bias is None:
        return torch.mm(x, weight.t())
    return torch.addmm(bias, x, weight.t())


def linear_into(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`linear` written into ``out [n, out]`` (a view of a larger tensor included);
    returns ``out``."""
    kernel = _kernel_for(x, weight)
    if kernel is not None:
        return out.copy_(kernel(x, weight, bias, "none", [], ""))
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)

"""CPU tuning of :class:`~myriad.nn.mlp.MLP`: its layers evaluated in row chunks that stay in
the CPU's cache, forward and backward, on worker threads when OpenMP's idle threads sleep.

A PPO minibatch of 32,768 rows makes every hidden activation of a 64-unit layer an 8 MB tensor,
so a layer-by-layer evaluation streams each activation and each gradient through main memory
several times (GEMM, activation, next GEMM; activation backward, two GEMMs).
:func:`chunked_forward` runs all layers on one chunk of rows at a time, and its backward (the
custom autograd function ``_ChunkedMLP``) does the same in reverse, so a chunk's intermediate
values are reused from the cache: about 1.3x faster on a 2-core CPU. The values are those of the
layer-by-layer evaluation up to floating-point summation order (weight gradients are summed
chunk by chunk). With a population's per-member linear heads (the shared trunk of
:class:`~myriad.nn.population.SharedTrunkNet`) the heads also run on each chunk, so the trunk
output's gradient, as wide as the trunk, exists only one chunk at a time instead of as a whole
``[N, hidden]`` tensor. The activation's derivative is taken from its output (ELU, ReLU, leaky
ReLU, tanh); MLPs with other activations, inputs that are not ``[N, in]`` on the CPU and inputs
of at most one chunk (4,096 rows of a 64-unit MLP) get None here and run layer by layer.

When idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``, which importing myriad sets; the
start-up's :class:`~myriad.utils.process.ProcessSettings` say so, :func:`use_process_settings`)
and there are ``T > 1`` torch threads, the rows are split into ``T`` contiguous streams of
chunks, each run by its own single-threaded worker thread (torch releases the GIL inside its
kernels): splitting every 4,096-row op over OpenMP threads would wake the sleeping threads once
per op. With libgomp's default policy, whose idle threads spin for a while before they sleep,
the ops are split over OpenMP threads as usual: there the spinning team would take the cores
the streams need. On the 2-core benchmark CPU, a PPO iteration at 4,096 envs with two threads
took 0.84 s with streams and 1.25 s without under the passive policy, and 0.97 s with streams
and 0.63 s without under the default one (one-off observations, 2026-11-26). Each stream sums
its own weight gradients and the streams' sums are added in stream order, so a run is
reproducible for a given thread count and policy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier
from typing import Any, TypeVar

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from myriad.nn.activations import ELU, elu_, elu_grad
from myriad.nn.products import linear, linear_into, onednn_kernel
from myriad.nn.tracing import exporting
from myriad.utils.process import ProcessSettings, process_settings

#: Rows per chunk are chosen so that one activation of the widest layer takes about this many
#: bytes (a CPU core's L2 cache: each worker thread runs its own chunks).
CHUNK_BYTES = 1 << 20

R = TypeVar("R")


def _activate_(act: nn.Module, y: torch.Tensor) -> None:
    """Apply ``act`` to ``y`` in place."""
    if isinstance(act, ELU):
        elu_(y, act.alpha)
    elif isinstance(act, nn.ELU):
        torch.nn.functional.elu_(y, act.alpha)
    elif isinstance(act, nn.ReLU):
        y.relu_()
    elif isinstance(act, nn.LeakyReLU):
        torch.nn.functional.leaky_relu_(y, act.negative_slope)
    else:
        y.tanh_()


def _activation_grad(act: nn.Module, grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Gradient with respect to the activation's input, from its output ``out``."""
    aten = torch.ops.aten
    if isinstance(act, nn.ELU):  # myriad's ELU too: the derivative from the output is the same
        return elu_grad(grad, out, act.alpha)
    if isinstance(act, nn.ReLU):
        return aten.threshold_backward(grad, out, 0.0)
    if isinstance(act, nn.LeakyReLU):
        return aten.leaky_relu_backward(grad, out, act.negative_slope, True)
    return aten.tanh_backward(grad, out)


SUPPORTED_ACTIVATIONS = (nn.ELU, nn.ReLU, nn.LeakyReLU, nn.Tanh)

Plan = tuple[tuple[nn.Linear, nn.Module | None], ...]
#: Per-member output heads on a member-major batch: weight ``[M, in, out]``, bias ``[M, out]``.
Head = tuple[torch.Tensor, torch.Tensor] | None


def _chunk_rows(plan: Plan) -> int:
    width = max(max(lin.in_features, lin.out_features) for lin, _ in plan)
    return max(16, CHUNK_BYTES // (4 * width))


#: Single-threaded worker pools by size, created on first use. A forked child cannot use its
#: parent's threads: it starts with none.
_WORKERS: dict[int, ThreadPoolExecutor] = {}
os.register_at_fork(after_in_child=_WORKERS.clear)


def _workers(count: int) -> ThreadPoolExecutor:
    """``count`` worker threads whose torch ops each run on one thread."""
    pool = _WORKERS.get(count)
    if pool is None:
        threads = torch.get_num_threads()
        started = Barrier(count)

        def single_threaded() -> None:
            # torch.set_num_threads sets the calling thread's OpenMP and MKL counts and a
            # process-wide default that threads read on their first op: read it here, before
            # the caller restores the default below.
            torch.set_num_threads(1)
            torch.get_num_threads()
            started.wait()

        pool = ThreadPoolExecutor(count, "myriad-mlp", initializer=single_threaded)
        # Each task starts one thread (none is idle yet); all meet at the barrier.
        for future in [pool.submit(int) for _ in range(count)]:
            future.result()
        torch.set_num_threads(threads)
        _WORKERS[count] = pool
    return pool


#: The fewest rows worth a worker thread of their own. With idle OpenMP threads that slept at
#: once, a forward pass of a 64-64 ELU MLP over 1,024-2,048 rows ran 1.1-1.6x faster as two
#: streams than on two OpenMP threads (one-off observations, 2026-11-26), and 1,024 rows was the
#: threshold. With the short spin of the process settings and oneDNN's products, a policy and
#: critic step over 4,096 rows took 1.02 ms on two OpenMP threads against 1.58 ms as two
#: streams of 2,048, and a PPO iteration at 4,096 envs 390-428 ms against 436-457 ms with the
#: 1,024 threshold (two threads, quiet 2-core CPU; one-off observations, 2026-11-28).
MIN_STREAM_ROWS = 4096


#: The process settings the MLP runs under: start-up's decision (:mod:`myriad.utils.process`,
#: applied before torch loaded its OpenMP runtime), not the environment read again here.
_settings: ProcessSettings = process_settings()


def use_process_settings(settings: ProcessSettings) -> None:
    """Run the MLPs of this process under ``settings`` (start-up's by default; a program that
    set up its OpenMP runtime differently hands what it did)."""
    global _settings
    _settings = settings


def openmp_threads_sleep() -> bool:
    """Whether idle OpenMP threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``) rather than spin
    for a while (libgomp's default), as the process settings say."""
    return _settings.openmp_threads_sleep


def _streams(x: torch.Tensor) -> int:
    """Chunk streams for ``x [N, in]`` on the CPU: with sleeping OpenMP threads, one per torch
    thread, each of at least :data:`MIN_STREAM_ROWS` rows; otherwise one."""
    if not openmp_threads_sleep():
        return 1
    return max(1, min(torch.get_num_threads(), x.shape[0] // MIN_STREAM_ROWS))


def _in_streams(n: int, streams: int, work: Callable[[int, int], R]) -> list[R]:
    """``work(start, stop)`` for ``streams`` contiguous near-equal row ranges of ``[0, n)``,
    on the worker threads when there are several; results in range order.

    ``work`` records no autograd graph (it runs inside a custom Function or without
    gradients), and runs in the caller's inference mode: both modes belong to a thread.
    """
    if streams == 1:
        return [work(0, n)]
    inference = torch.is_inference_mode_enabled()

    def run(start: int, stop: int) -> R:
        with torch.inference_mode(inference), torch.no_grad():
            return work(start, stop)

    bounds = [n * k // streams for k in range(streams + 1)]
    pool = _workers(streams)
    futures = [pool.submit(run, bounds[k], bounds[k + 1]) for k in range(streams)]
    return [f.result() for f in futures]


#: The fewest rows of a batch that fits in one chunk and one stream worth the chunked path with
#: oneDNN's products (:mod:`myriad.nn.products`); fewer run layer by layer. A 6-64-64-2 ELU MLP
#: over 1,024 rows took 235 us chunked against 225 us layer by layer without gradients and 605 us
#: against 626 us forward and backward; over 256 rows 105 us against 68 us and 352 us against
#: 217 us; over 4,096 rows 731 us against 853 us and 1,617 us against 2,423 us (one thread,
#: one-off observations, 2026-11-28).
ONE_CHUNK_MIN_ROWS = 2048


#: Layers at least this wide at the input add their bias after the product (see
#: :func:`_forward_chunk`).
BIAS_AFTER_PRODUCT_MIN_IN = 32


def _forward_chunk(
    plan: Plan, params: tuple[torch.Tensor, ...], h: torch.Tensor, outs: list[torch.Tensor]
) -> None:
    """All layers on the rows ``h [n, in]``, writing layer i's output into ``outs[i]``.

    ``addmm`` first copies the broadcast bias into its output, which for a kept activation is
    memory no chunk has touched yet: the copy then waits on main memory, where a product that
    writes the output itself overlaps those writes with its arithmetic. Into untouched 1 MB
    outputs, a 4,096 x 64 by 64 x 64 product with ``addmm`` took 380 us, ``mm`` then ``add_``
    of the bias 300 us (one thread; 210 and 185 us with two); with 4 inputs there was no gain
    with one thread and a loss with two (one-off observations, 2026-11-27).
    """
    onednn = onednn_kernel(h) is not None
    for i, (lin, act) in enumerate(plan):
        if lin.in_features >= BIAS_AFTER_PRODUCT_MIN_IN and not onednn:
            torch.mm(h, params[2 * i].t(), out=outs[i])
            outs[i].add_(params[2 * i + 1])
        else:
            linear_into(outs[i], h, params[2 * i], params[2 * i + 1])
        if act is not None:
            _activate_(act, outs[i])
        h = outs[i]


def _head_parts(start: int, stop: int, rows_per_member: int) -> list[tuple[int, int, int, int]]:
    """``(m0, m1, a, b)`` for the member blocks of a member-major batch that meet rows
    ``[start, stop)``: rows ``[a, b)`` belong to members ``m0..m1-1``, ``(b - a) / (m1 - m0)``
    rows each. Consecutive whole blocks form one part, so a chunk holding many small members'
    blocks runs their heads as one batched product rather than one product per member."""
    parts: list[tuple[int, int, int, int]] = []
    a = start
    while a < stop:
        m = a // rows_per_member
        b = min(stop, (m + 1) * rows_per_member)
        whole = b - a == rows_per_member
        if (
            whole
            and parts
            and parts[-1][3] == a
            and parts[-1][3] - parts[-1][2] == (parts[-1][1] - parts[-1][0]) * rows_per_member
        ):
            m0, _, a0, _ = parts.pop()
            parts.append((m0, m + 1, a0, b))
        else:
            parts.append((m, m + 1, a, b))
        a = b
    return parts


def _head_forward(
    weight: torch.Tensor, bias: torch.Tensor, h: torch.Tensor, y: torch.Tensor, m0: int, m1: int
) -> None:
    """Members ``m0..m1-1``'s heads on their equal shares of the rows ``h``, into ``y``."""
    if m1 - m0 == 1:
        linear_into(y, h, weight[m0].t(), bias[m0])
        return
    k = m1 - m0
    torch.baddbmm(
        bias[m0:m1].unsqueeze(1),
        h.view(k, -1, h.shape[1]),
        weight[m0:m1],
        out=y.view(k, -1, y.shape[1]),
    )


def _head_backward(
    weight: torch.Tensor,
    h: torch.Tensor,
    grad_y: torch.Tensor,
    grad_w: torch.Tensor,
    grad_b: torch.Tensor,
    grad_h: torch.Tensor,
    m0: int,
    m1: int,
) -> None:
    """Backward of :func:`_head_forward`: adds to ``grad_w [M, out, in]`` and ``grad_b`` and
    writes ``grad_h``."""
    if m1 - m0 == 1:
        grad_w[m0].addmm_(grad_y.t(), h)
        grad_b[m0] += grad_y.sum(dim=0)
        # torch's product writes into grad_h; oneDNN's, with the copy into it, was slower here.
        torch.mm(grad_y, weight[m0].t(), out=grad_h)
        return
    k = m1 - m0
    g3, h3 = grad_y.view(k, -1, grad_y.shape[1]), h.view(k, -1, h.shape[1])
    grad_w[m0:m1].baddbmm_(g3.transpose(1, 2), h3)
    grad_b[m0:m1] += g3.sum(dim=1)
    torch.bmm(g3, weight[m0:m1].transpose(1, 2), out=grad_h.view(k, -1, grad_h.shape[1]))


def _forward_rows(
    plan: Plan,
    params: tuple[torch.Tensor, ...],
    x: torch.Tensor,
    outs: Sequence[torch.Tensor | None],
    start: int,
    stop: int,
    head: Head = None,
    y: torch.Tensor | None = None,
) -> None:
    """All layers on rows ``[start, stop)`` of ``x``, a chunk at a time, into ``outs``: layer
    i's output ``[N, out_i]``, or None for a layer whose output is not kept (it then lives one
    chunk at a time, in the cache). With ``head``, each member's head also runs on its rows of
    the last layer's output (member-major, equal counts) while they are in the cache, into
    ``y [N, head_out]``."""
    rows = _chunk_rows(plan)
    for s in range(start, stop, rows):
        e = min(s + rows, stop)
        chunk_outs = [
            x.new_empty(e - s, lin.out_features) if o is None else o[s:e]
            for o, (lin, _) in zip(outs, plan)
        ]
        _forward_chunk(plan, params, x[s:e], chunk_outs)
        if head is not None and y is not None:
            weight, bias = head
            h = chunk_outs[-1]
            for m0, m1, a, b in _head_parts(s, e, x.shape[0] // weight.shape[0]):
                _head_forward(weight, bias, h[a - s : b - s], y[a:b], m0, m1)


def _backward_rows(
    plan: Plan,
    params: tuple[torch.Tensor, ...],
    x: torch.Tensor,
    outs: tuple[torch.Tensor, ...],
    grad: torch.Tensor,
    grad_x: torch.Tensor | None,
    start: int,
    stop: int,
    head: Head = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Backward through rows ``[start, stop)``, a chunk at a time: writes their rows of
    ``grad_x`` and returns the weight and bias gradients summed over them (with ``head``, its
    weight ``[M, in, out]`` and bias gradients last, and ``grad`` is the heads' ``[N, out]``).

    Weight gradients accumulate in the orientation whose product is fast (myriad.nn.linear):
    ``[in, out]`` when in < out, the parameter's own ``[out, in]`` otherwise.
    """
    depth, rows = len(plan), _chunk_rows(plan)
    transposed = [lin.in_features < lin.out_features for lin, _ in plan]
    grad_w = [
        torch.zeros(lin.in_features, lin.out_features, dtype=x.dtype, device=x.device)
        if t
        else torch.zeros_like(params[2 * i])
        for i, ((lin, _), t) in enumerate(zip(plan, transposed))
    ]
    grad_b = [torch.zeros_like(params[2 * i + 1]) for i in range(depth)]
    # The bias gradient is a column sum of the chunk's gradient; torch's reduction over rows
    # splits poorly over OpenMP threads, a matrix-vector product with ones does not: with two
    # threads a PPO update at 4,096 envs ran 3-5% faster, with one 1.5% slower (interleaved,
    # one-off observations, 2026-11-27).
    ones = x.new_ones(rows) if torch.get_num_threads() > 1 else None
    onednn = onednn_kernel(x) is not None
    if head is not None:
        weight, bias = head
        # [M, out, in]: the head's output is the narrow side, so out-first is the fast product.
        head_w = torch.zeros_like(weight.transpose(1, 2))
        head_b = torch.zeros_like(bias)
        rows_per_member = x.shape[0] // weight.shape[0]
        hidden = weight.shape[1]
    for s in range(start, stop, rows):
        e = min(s + rows, stop)
        if head is None:
            g = grad[s:e]
        else:
            # The trunk output's gradient, member by member, only ever one chunk in size.
            g = x.new_empty(e - s, hidden)
            h = outs[-1][s:e]
            for m0, m1, a, b in _head_parts(s, e, rows_per_member):
                _head_backward(
                    weight, h[a - s : b - s], grad[a:b], head_w, head_b, g[a - s : b - s], m0, m1
                )
        for i in reversed(range(depth)):
            act = plan[i][1]
            if act is not None:
                g = _activation_grad(act, g, outs[i][s:e])
            h_in = x[s:e] if i == 0 else outs[i - 1][s:e]
            if transposed[i]:
                grad_w[i].addmm_(h_in.t(), g)
            elif onednn:
                grad_w[i] += linear(g.t(), h_in.t())
            else:
                grad_w[i].addmm_(g.t(), h_in)
            if ones is not None:
                grad_b[i].addmv_(g.t(), ones[: e - s])
            else:
                grad_b[i] += g.sum(dim=0)
            if i > 0:
                g = linear(g, params[2 * i].t())
            elif grad_x is not None:
                linear_into(grad_x[s:e], g, params[0].t())
    grad_w = [w.t() if t else w for w, t in zip(grad_w, transposed)]
    if head is not None:
        grad_w.append(head_w.transpose(1, 2))
        grad_b.append(head_b)
    return grad_w, grad_b


class _ChunkedMLP(torch.autograd.Function):
    """The MLP of ``plan`` on ``x [N, in]``, then, when ``head_weight [M, hidden, out]`` and
    ``head_bias [M, out]`` are given, member m's head on its rows of the member-major batch;
    ``params`` are (weight [out, in], bias) per layer."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        plan: Plan,
        head_weight: torch.Tensor | None,
        head_bias: torch.Tensor | None,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        outs = [x.new_empty(n, lin.out_features) for lin, _ in plan]
        head: Head = None
        y = outs[-1]
        if head_weight is not None and head_bias is not None:
            head = (head_weight, head_bias)
            y = x.new_empty(n, head_weight.shape[2])
        ctx.streams = _streams(x)
        _in_streams(
            n,
            ctx.streams,
            lambda start, stop: _forward_rows(plan, params, x, outs, start, stop, head, y),
        )
        ctx.plan = plan
        ctx.has_head = head is not None
        saved_head = head if head is not None else ()
        ctx.save_for_backward(x, *saved_head, *params, *outs)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        plan: Plan = ctx.plan
        depth = len(plan)
        saved = ctx.saved_tensors
        x, saved = saved[0], saved[1:]
        head: Head = None
        if ctx.has_head:
            head, saved = (saved[0], saved[1]), saved[2:]
        params, outs = saved[: 2 * depth], saved[2 * depth :]
        grad = grad.contiguous()
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        sums = _in_streams(
            x.shape[0],
            ctx.streams,
            lambda start, stop: _backward_rows(
                plan, params, x, outs, grad, grad_x, start, stop, head
            ),
        )
        grad_w, grad_b = sums[0]
        for w, b in sums[1:]:  # in stream order: the same sum in every run
            grad_w = [a + c for a, c in zip(grad_w, w)]
            grad_b = [a + c for a, c in zip(grad_b, b)]
        grads: list[torch.Tensor | None] = [grad_x, None]
        grads += [grad_w[depth].contiguous(), grad_b[depth]] if head is not None else [None, None]
        for i in range(depth):
            grads += [grad_w[i].contiguous(), grad_b[i]]
        return tuple(grads)


def layer_plan(layers: Iterable[nn.Module]) -> Plan | None:
    """The (Linear, activation or None) pairs of ``layers``, or None unless they alternate
    ``Linear`` (with a bias) and one of :data:`SUPPORTED_ACTIVATIONS` (the last ``Linear`` may
    have no activation)."""
    layers = list(layers)
    plan: list[tuple[nn.Linear, nn.Module | None]] = []
    i = 0
    while i < len(layers):
        lin = layers[i]
        if not isinstance(lin, nn.Linear) or lin.bias is None:
            return None
        act = layers[i + 1] if i + 1 < len(layers) else None
        if act is not None and not isinstance(act, SUPPORTED_ACTIVATIONS):
            return None
        plan.append((lin, act))
        i += 2
    return tuple(plan) or None


def chunked_forward(plan: Plan | None, x: torch.Tensor, head: Head) -> torch.Tensor | None:
    """The layers of ``plan`` on ``x [N, in]`` in cached row chunks (then, with ``head``, member
    m's head on its rows of the member-major batch), or None where chunking does not apply:
    no plan, a traced or exported graph, an input other than ``[N, in]`` on the CPU, or rows
    that fit in one chunk and one stream (they gain nothing from chunking), unless oneDNN's
    products serve them and there are at least :data:`ONE_CHUNK_MIN_ROWS` (they gain those
    products, :mod:`myriad.nn.products`)."""
    if exporting():  # a traced or exported graph holds the plain layers (myriad.nn.tracing)
        return None
    if plan is None or x.ndim != 2 or x.device.type != "cpu":
        return None
    one_chunk = _streams(x) == 1 and x.shape[0] <= _chunk_rows(plan)
    if one_chunk and (x.shape[0] < ONE_CHUNK_MIN_ROWS or onednn_kernel(x) is None):
        return None
    params = tuple(p for lin, _ in plan for p in (lin.weight, lin.bias))
    head_params = head if head is not None else ()
    if torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in (*params, *head_params))
    ):
        head_weight, head_bias = head if head is not None else (None, None)
        out: torch.Tensor = _ChunkedMLP.apply(x, plan, head_weight, head_bias, *params)
        return out
    y = None
    if head is not None:
        y = x.new_empty(x.shape[0], head[0].shape[2])
    last = x.new_empty(x.shape[0], plan[-1][0].out_features) if head is None else None
    outs: list[torch.Tensor | None] = [*[None] * (len(plan) - 1), last]
    _in_streams(
        x.shape[0],
        _streams(x),
        lambda start, stop: _forward_rows(plan, params, x, outs, start, stop, head, y),
    )
    result = y if y is not None else last
    assert result is not None
    return result

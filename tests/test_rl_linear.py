"""The oriented linear maps and the chunked MLP of the learning loop give torch's values and
gradients."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import myriad.nn.chunked as chunking
from myriad.nn.activations import ELU
from myriad.nn.linear import Linear, batched_linear, linear
from myriad.nn.mlp import MLP
from myriad.utils.process import process_settings


def wait_policy(monkeypatch: pytest.MonkeyPatch, policy: str | None) -> None:
    """Run the MLPs as if start-up had found OpenMP's wait policy ``policy``."""
    settings = dataclasses.replace(process_settings(), openmp_wait_policy=policy)
    monkeypatch.setattr(chunking, "_settings", settings)


# (M, n, in, out): in < out, out < in, one output (matrix-vector), square.
SHAPES = [(1, 5, 3, 9), (3, 4, 9, 2), (2, 5, 9, 1), (2, 3, 5, 5)]


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


def _mlp_pair(
    activations: tuple[torch.nn.Module, ...], last: bool
) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    sizes = [5] + [7] * len(activations)
    for i, act in enumerate(activations):
        layers += [Linear(sizes[i], sizes[i + 1]), act]
    if last:
        layers.append(Linear(sizes[-1], 3))
    return MLP(*layers).double(), torch.nn.Sequential(*layers).double()


def chunked_plan(activations: tuple[torch.nn.Module, ...], last: bool) -> chunking.Plan:
    plan = _mlp_pair(activations, last)[0]._plan()
    assert plan is not None
    return plan


def assert_same_values_and_gradients(
    chunked: torch.nn.Module, plain: torch.nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """``chunked(x)`` and its gradients (input and parameters, for a fixed upstream gradient)
    equal ``plain``'s; returns ``chunked``'s gradients."""
    y, expected = chunked(x), plain(x)
    torch.testing.assert_close(y, expected)
    upstream = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(0))
    got = torch.autograd.grad(y, [x, *chunked.parameters()], upstream)
    want = torch.autograd.grad(expected, [x, *plain.parameters()], upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    return got


def test_chunks_hold_one_l2_share_whatever_the_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = chunked_plan((torch.nn.ELU(), torch.nn.ELU()), True)
    width = max(max(lin.in_features, lin.out_features) for lin, _ in plan)
    for threads in (1, 2, 4):
        monkeypatch.setattr(chunking.torch, "get_num_threads", lambda t=threads: t)
        assert chunking._chunk_rows(plan) == chunking.CHUNK_BYTES // (4 * width)


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two torch threads, and idle OpenMP threads that sleep: the MLP runs two streams."""
    wait_policy(monkeypatch, "PASSIVE")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_two_threads_run_two_single_threaded_streams(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 16 * 4 * 7)  # 16-row chunks
    monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
    seen: list[tuple[int, int, str, int]] = []
    forward_rows = chunking._forward_rows

    def spy(plan, params, x, outs, start, stop, *head):  # type: ignore[no-untyped-def]
        seen.append((start, stop, threading.current_thread().name, torch.get_num_threads()))
        forward_rows(plan, params, x, outs, start, stop, *head)

    monkeypatch.setattr(chunking, "_forward_rows", spy)
    chunked, plain = _mlp_pair((torch.nn.ELU(), torch.nn.ELU()), True)
    x = torch.randn(41, 5, dtype=torch.float64)
    torch.testing.assert_close(chunked(x), plain(x))
    with torch.inference_mode():
        torch.testing.assert_close(chunked(x), plain(x))
    with torch.no_grad():  # hidden layers kept one chunk at a time
        torch.testing.assert_close(chunked(x), plain(x))
    assert len(seen) == 6
    seen = seen[:2]
    # Two contiguous ranges, each on a worker thread whose ops run on one thread.
    assert sorted(s[:2] for s in seen) == [(0, 20), (20, 41)]
    assert all(name.startswith("myriad-mlp") and threads == 1 for _, _, name, threads in seen)
    # The caller keeps its thread count, and a thread started later gets it too.
    assert torch.get_num_threads() == 2
    counts: list[int] = []
    later = threading.Thread(target=lambda: counts.append(torch.get_num_threads()))
    later.start()
    later.join()
    assert counts == [2]


def test_two_streams_give_the_sequential_values_and_gradients_reproducibly(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 16 * 4 * 7)
    monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
    chunked, plain = _mlp_pair((torch.nn.ELU(), torch.nn.ELU()), True)
    x = torch.randn(75, 5, dtype=torch.float64, requires_grad=True)
    got = assert_same_values_and_gradients(chunked, plain, x)
    again = assert_same_values_and_gradients(chunked, plain, x)
    assert all(torch.equal(a, b) for a, b in zip(got, again))
    assert torch.autograd.gradcheck(chunked, (x,))


def test_rows_too_few_for_two_streams_run_layer_by_layer(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
    chunked, plain = _mlp_pair((torch.nn.ELU(),), True)
    x = torch.randn(31, 5, dtype=torch.float64)  # one chunk, too few rows for two streams
    assert chunking._streams(x) == 1
    assert torch.equal(chunked(x), plain(x))
    assert chunking._streams(torch.randn(32, 5)) == 2


def test_spinning_openmp_threads_split_each_op_instead(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
    x = torch.randn(64, 5)
    assert chunking._streams(x) == 2
    for policy in ("", "ACTIVE"):
        wait_policy(monkeypatch, policy)
        assert chunking._streams(x) == 1
    wait_policy(monkeypatch, None)
    assert chunking._streams(x) == 1


def test_the_streams_follow_start_up_settings_not_the_environment_read_later(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenMP runtime read its policy when torch loaded it: a variable changed afterwards
    says nothing about the runtime, and the MLP keeps start-up's decision."""
    monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
    x = torch.randn(64, 5)
    for policy in ("ACTIVE", "PASSIVE"):
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
        assert chunking._streams(x) == 2
    chunking.use_process_settings(dataclasses.replace(process_settings(), openmp_wait_policy=None))
    assert chunking._streams(x) == 1


def _evaluate(module: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    # A NumPy array travels back by value; a tensor would go through torch's shared memory.
    with torch.no_grad():
        return module(x).numpy()


def test_a_forked_child_starts_its_own_workers(two_threads: None) -> None:
    chunked, plain = _mlp_pair((torch.nn.ELU(),), True)
    x = torch.randn(chunking._chunk_rows(chunked._plan()) * 2 + 3, 5, dtype=torch.float64)
    expected = plain(x)
    torch.testing.assert_close(chunked(x), expected)  # the parent's workers exist now
    assert chunking._WORKERS
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        got = pool.apply(_evaluate, (chunked, x))
    torch.testing.assert_close(torch.from_numpy(got), expected)


@pytest.mark.parametrize(
    ("activations", "last"),
    [
        ((torch.nn.ELU(), torch.nn.ELU()), True),
        ((ELU(), ELU()), True),
        ((torch.nn.ReLU(), torch.nn.Tanh()), False),
        ((torch.nn.LeakyReLU(0.1),), True),
    ],
)
def test_chunked_mlp_matches_the_sequential_evaluation(
    activations: tuple[torch.nn.Module, ...], last: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of 16 rows (one thread): 40 rows take three chunks, the last one partial.
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 16 * 4 * 7)
    monkeypatch.setattr(chunking.torch, "get_num_threads", lambda: 1)
    assert chunking._chunk_rows(chunked_plan(activations, last)) == 16
    chunked, plain = _mlp_pair(activations, last)
    assert list(chunked.state_dict()) == list(plain.state_dict())
    x = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    assert_same_values_and_gradients(chunked, plain, x)
    with torch.no_grad():
        torch.testing.assert_close(chunked(x), plain(x))
    assert torch.autograd.gradcheck(chunked, (x,))


def test_mlp_falls_back_to_layer_by_layer_where_it_cannot_chunk() -> None:
    silu, plain = _mlp_pair((torch.nn.SiLU(),), True)
    assert silu._plan() is None
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(silu(x[0]), plain(x[0]))
    elu, plain_elu = _mlp_pair((torch.nn.ELU(),), True)
    torch.testing.assert_close(elu(x), plain_elu(x))  # [M, N, in] inputs run layer by layer
    # Rows that fit in one chunk run layer by layer too: the very same numbers.
    assert torch.equal(elu(x[0]), plain_elu(x[0]))


@pytest.mark.parametrize(("members", "rows_per_member"), [(1, 40), (3, 13), (5, 7), (2, 40)])
@pytest.mark.parametrize("streams", [False, True])
def test_member_heads_on_chunks_match_the_mlp_then_batched_linear(
    members: int, rows_per_member: int, streams: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16-row chunks: members' blocks start inside chunks (13, 7 rows) or span several (40).
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 16 * 4 * 7)
    if streams:
        wait_policy(monkeypatch, "PASSIVE")
        monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
        monkeypatch.setattr(chunking.torch, "get_num_threads", lambda: 2)
    else:
        monkeypatch.setattr(chunking.torch, "get_num_threads", lambda: 1)
    trunk, plain = _mlp_pair((torch.nn.ELU(), torch.nn.ELU()), False)
    gen = torch.Generator().manual_seed(members)
    n = members * rows_per_member
    x = torch.randn(n, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(members, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(members, 3, generator=gen, dtype=torch.float64, requires_grad=True)

    def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = plain(x).view(members, rows_per_member, -1)
        return torch.baddbmm(bias.unsqueeze(1), h, weight).reshape(n, 3)

    def fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return trunk.forward_member_heads(x, weight, bias)

    y, expected = fused(x, weight, bias), reference(x, weight, bias)
    torch.testing.assert_close(y, expected)
    upstream = torch.randn(y.shape, generator=gen, dtype=y.dtype)
    inputs = [x, weight, bias]
    got = torch.autograd.grad(y, [*inputs, *trunk.parameters()], upstream)
    want = torch.autograd.grad(expected, [*inputs, *plain.parameters()], upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, weight, bias), expected)
    assert torch.autograd.gradcheck(fused, tuple(inputs))


@pytest.mark.parametrize("threads", [1, 2])
def test_bias_after_the_product_and_bias_gradients_by_product_give_the_same_numbers(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every layer adds its bias after the product; with two (OpenMP) threads the bias
    # gradients are matrix-vector products with ones instead of column sums.
    monkeypatch.setattr(chunking, "BIAS_AFTER_PRODUCT_MIN_IN", 1)
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 16 * 4 * 7)
    monkeypatch.setattr(chunking.torch, "get_num_threads", lambda: threads)
    wait_policy(monkeypatch, None)
    chunked, plain = _mlp_pair((torch.nn.ELU(), torch.nn.ELU()), True)
    x = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    assert_same_values_and_gradients(chunked, plain, x)
    assert torch.autograd.gradcheck(chunked, (x,))

"""The MLPs' dense products on oneDNN (myriad.nn.products) give torch's ``addmm`` values, and the
chunked MLP built on them gives the plain float32 evaluation's values and gradients."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

import myriad.nn.chunked as chunking
import myriad.nn.products as products
from myriad.nn.linear import Linear
from myriad.nn.mlp import MLP
from myriad.utils.process import process_settings

ONEDNN_HERE = (
    platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()
)


Choose = Callable[[str], None]


@pytest.fixture
def kernel_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[Choose]:
    """Run the products as if start-up had chosen ``cpu_matmul`` (checked again on first use)."""

    def choose(cpu_matmul: str) -> None:
        settings = dataclasses.replace(process_settings(), cpu_matmul=cpu_matmul)
        monkeypatch.setattr(products, "process_settings", lambda: settings)
        monkeypatch.setattr(products, "_checked", False)

    yield choose
    # The next test checks the kernel again, under the real settings.
    monkeypatch.setattr(products, "_checked", False)


def test_the_kernel_serves_float32_on_the_cpu_only(kernel_choice: Choose) -> None:
    kernel_choice("onednn")
    x32 = torch.randn(3, 4)
    assert (products.onednn_kernel(x32) is not None) == ONEDNN_HERE
    assert products.onednn_kernel(x32.double()) is None
    kernel_choice("blas")
    assert products.onednn_kernel(x32) is None


@pytest.mark.parametrize("cpu_matmul", ["onednn", "blas"])
def test_products_equal_addmm_for_every_layout(kernel_choice: Choose, cpu_matmul: str) -> None:
    kernel_choice(cpu_matmul)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 64, generator=gen)
    weight = torch.randn(17, 64, generator=gen)  # [out, in]
    bias = torch.randn(17, generator=gen)
    expected = torch.addmm(bias, x, weight.t())
    torch.testing.assert_close(products.linear(x, weight, bias), expected)
    torch.testing.assert_close(products.linear(x, weight), x @ weight.t())
    # A transposed weight view and a transposed input view, as the backward passes use them.
    weight_io = weight.t().contiguous()  # [in, out]
    torch.testing.assert_close(products.linear(x, weight_io.t(), bias), expected)
    grad = torch.randn(300, 17, generator=gen)
    torch.testing.assert_close(products.linear(grad.t(), x.t()), grad.t() @ x)
    # Into a view of a larger tensor, leaving the rest untouched.
    big = torch.zeros(400, 17)
    returned = products.linear_into(big[50:350], x, weight, bias)
    torch.testing.assert_close(big[50:350], expected)
    assert returned.data_ptr() == big[50:350].data_ptr()
    assert big[:50].abs().sum() == 0 and big[350:].abs().sum() == 0


def test_a_kernel_that_disagrees_is_not_used(
    kernel_choice: Choose, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not ONEDNN_HERE:
        pytest.skip("no oneDNN kernel on this machine")
    kernel_choice("onednn")
    real = torch.ops.mkldnn._linear_pointwise

    class WrongKernel:
        _linear_pointwise = staticmethod(lambda *a: real(*a) + 1.0)

    monkeypatch.setattr(torch.ops, "mkldnn", WrongKernel())
    assert products.onednn_kernel(torch.randn(2, 2)) is None
    x, weight = torch.randn(5, 3), torch.randn(4, 3)
    torch.testing.assert_close(products.linear(x, weight), x @ weight.t())


def _float32_mlp_pair() -> tuple[MLP, torch.nn.Sequential]:
    torch.manual_seed(0)
    layers = [Linear(4, 64), torch.nn.ELU(), Linear(64, 64), torch.nn.ELU(), Linear(64, 2)]
    return MLP(*layers), torch.nn.Sequential(*layers)


@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("rows", [40, 1000])
def test_chunked_mlp_on_onednn_matches_the_plain_float32_evaluation(
    kernel_choice: Choose, monkeypatch: pytest.MonkeyPatch, streams: int, rows: int
) -> None:
    kernel_choice("onednn")
    # 64-row chunks; 1,000 rows take several chunks per stream, 40 rows one chunk.
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 64 * 4 * 64)
    monkeypatch.setattr(chunking, "MIN_STREAM_ROWS", 16)
    monkeypatch.setattr(chunking, "ONE_CHUNK_MIN_ROWS", 32)
    policy = "PASSIVE" if streams == 2 else None
    settings = dataclasses.replace(process_settings(), openmp_wait_policy=policy)
    monkeypatch.setattr(chunking, "_settings", settings)
    before = torch.get_num_threads()
    torch.set_num_threads(streams)
    try:
        _check_chunked_mlp_on_onednn(monkeypatch, rows)
    finally:
        torch.set_num_threads(before)


def _check_chunked_mlp_on_onednn(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    seen: list[int] = []
    forward_rows = chunking._forward_rows

    def spy(*args):  # type: ignore[no-untyped-def]
        seen.append(args[4])
        forward_rows(*args)

    monkeypatch.setattr(chunking, "_forward_rows", spy)
    chunked, plain = _float32_mlp_pair()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 4, generator=gen, requires_grad=True)
    y, expected = chunked(x), plain(x)
    # With oneDNN even one chunk runs on the chunked path; on other machines it runs plain.
    assert bool(seen) == ONEDNN_HERE
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(y.shape, generator=gen)
    got = torch.autograd.grad(y, [x, *chunked.parameters()], upstream)
    want = torch.autograd.grad(expected, [x, *plain.parameters()], upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(chunked(x), expected, rtol=1e-5, atol=1e-5)
    # The same numbers on every run.
    again = torch.autograd.grad(chunked(x), [x, *chunked.parameters()], upstream)
    assert all(torch.equal(a, b) for a, b in zip(got, again))
    # Fewer rows than ONE_CHUNK_MIN_ROWS in one chunk: torch's layers, the very same numbers.
    seen.clear()
    small = x[:20].detach()
    assert torch.equal(chunked(small), plain(small)) and not seen


@pytest.mark.parametrize(
    ("value", "expected", "message"),
    [
        (None, "onednn", ""),
        ("blas", "blas", ""),
        (" OneDNN ", "onednn", ""),
        ("mkl", "onednn", "MYRIAD_CPU_MATMUL='mkl' is not one of onednn, blas; using onednn"),
    ],
)
def test_the_kernel_is_a_process_setting(value: str | None, expected: str, message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MYRIAD_CPU_MATMUL"}
    if value is not None:
        env["MYRIAD_CPU_MATMUL"] = value
    probe = (
        "import myriad.nn.mlp; from myriad.utils.process import process_settings as p;"
        " print(p().cpu_matmul)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [expected]
    assert done.stderr.strip() == (f"myriad: {message}" if message else "")


def test_streams_meeting_the_first_product_both_get_the_checked_kernel(
    kernel_choice: Choose, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream that asked while the other stream's check was under way once got None and
    # computed its rows with addmm: the first call's values were not those of later calls.
    kernel_choice("onednn")
    entered, release = threading.Event(), threading.Event()
    sentinel = torch.mm

    def slow_check():  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        return sentinel

    monkeypatch.setattr(products, "_working_kernel", slow_check)
    got: dict[str, object] = {}
    first = threading.Thread(target=lambda: got.update(a=products._checked_kernel()))
    second = threading.Thread(target=lambda: got.update(b=products._checked_kernel()))
    first.start()
    assert entered.wait(10)
    second.start()
    second.join(0.2)  # it waits for the check rather than answer without it
    release.set()
    first.join(10)
    second.join(10)
    assert got == {"a": sentinel, "b": sentinel}


@pytest.mark.parametrize(("members", "rows_per_member"), [(1, 40), (3, 13), (2, 40)])
def test_member_heads_on_onednn_match_the_mlp_then_baddbmm(
    kernel_choice: Choose, monkeypatch: pytest.MonkeyPatch, members: int, rows_per_member: int
) -> None:
    kernel_choice("onednn")
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 16 * 4 * 64)  # 16-row chunks
    monkeypatch.setattr(chunking, "ONE_CHUNK_MIN_ROWS", 1)
    torch.manual_seed(members)
    layers = [Linear(4, 64), torch.nn.ELU(), Linear(64, 64), torch.nn.ELU()]
    trunk, plain = MLP(*layers), torch.nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(members)
    n = members * rows_per_member
    x = torch.randn(n, 4, generator=gen, requires_grad=True)
    weight = torch.randn(members, 64, 3, generator=gen, requires_grad=True)
    bias = torch.randn(members, 3, generator=gen, requires_grad=True)
    y = trunk.forward_member_heads(x, weight, bias)
    h = plain(x).view(members, rows_per_member, -1)
    expected = torch.baddbmm(bias.unsqueeze(1), h, weight).reshape(n, 3)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(y.shape, generator=gen)
    inputs = [x, weight, bias]
    got = torch.autograd.grad(y, [*inputs, *trunk.parameters()], upstream)
    want = torch.autograd.grad(expected, [*inputs, *plain.parameters()], upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

"""OpenMP thread counts for the k-NN searches (myriad.utils.threads)."""

from __future__ import annotations

import pytest
import torch

from myriad.utils.threads import available_cpus, openmp_threads, search_threads


def test_openmp_threads_applies_inside_the_block_and_restores() -> None:
    # torch's OpenMP runtime reads the calling thread's count: the block sees the raised count
    # whatever torch_threads says, and the learner's count is back afterwards.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with openmp_threads(3):
            assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("3", 3), ("", None), ("x", None)])
def test_search_threads_follow_omp_num_threads_when_set(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: int | None
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert search_threads() == (expected if expected is not None else available_cpus())
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert search_threads() == available_cpus()


def test_openmp_threads_reaches_a_runtime_loaded_after_the_first_block() -> None:
    from threadpoolctl import ThreadpoolController

    with openmp_threads(1):
        pass
    import pykdtree.kdtree  # noqa: F401 - loads its own OpenMP runtime

    with openmp_threads(3):
        counts = [
            info["num_threads"]
            for info in ThreadpoolController().info()
            if info["user_api"] == "openmp"
        ]
    assert len(counts) >= 1 and all(c == 3 for c in counts)


def test_intra_op_threads_restores_the_count_when_the_block_raises() -> None:
    from myriad.utils.threads import intra_op_threads

    before = torch.get_num_threads()
    inside: list[int] = []

    def raising_block() -> None:
        with intra_op_threads(before + 1):
            inside.append(torch.get_num_threads())
            raise ValueError("inside the block")

    with pytest.raises(ValueError, match="inside the block"):
        raising_block()
    assert inside == [before + 1] and torch.get_num_threads() == before

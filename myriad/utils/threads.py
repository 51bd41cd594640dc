"""How many cores this process may use, and OpenMP thread counts for one block of code.

The k-NN searches of pretraining run on every core (:func:`search_threads`) while the learner
keeps ``torch_threads`` (one by default): a library's OpenMP loop may run in torch's OpenMP
runtime (a runtime loaded first with global symbols serves the others' calls), whose thread
count in the calling thread is then torch's. :func:`openmp_threads` sets the count of every
loaded OpenMP runtime for the calling thread only, and restores it afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def available_cpus() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def search_threads() -> int:
    """Threads for a search that runs beside the learner: ``OMP_NUM_THREADS`` when it is set
    (torchrun sets 1 per rank when it starts several on a machine, whose ranks then share the
    cores), else every core this process may use."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return available_cpus()


@contextmanager
def openmp_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` OpenMP threads in the calling thread (every runtime
    loaded when the block starts); other threads of the process keep their own counts.

    The loaded libraries are listed anew for each block (0.4 ms here, one-off observation,
    2026-11-27), so a runtime that came with a later import (pykdtree ships its own libgomp) is
    included.
    """
    from threadpoolctl import ThreadpoolController

    with ThreadpoolController().limit(limits=int(threads), user_api="openmp"):
        yield


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads, then restore the count (also when
    the block raises)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)

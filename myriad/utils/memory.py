"""Keep freed memory in the process for reuse (glibc's malloc).

A learning iteration allocates and frees many tensors of a megabyte or more (the activations
and gradients of 32,768-row minibatches). glibc serves large blocks with fresh memory maps and
hands freed memory at the top of its heap back to the system, so the next minibatch's tensors
of the same sizes fault their pages in again. Serving every block up to 32 MiB from the heap and
trimming the heap only above 1 GiB of free memory keeps those pages for the next minibatch: PPO
iterations on 4,096 envs ran 1.05x as fast with one torch thread and 1.14x with two, with the
median peak resident memory 2-7 MB higher (``benchmarks/results/malloc_tuning.json``;
docs/rl.md). Importing myriad sets this for the process (:mod:`myriad.utils.process`), so the
command, torchrun ranks and programs that embed myriad run alike.
"""

from __future__ import annotations

import ctypes
import sys

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Blocks up to this size come from the heap: the largest size glibc's own dynamic threshold
#: would rise to on a 64-bit system, fixed from the start.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> bool:
    """Raise glibc's mmap and trim thresholds for this process.

    Returns whether both were set: False where the C library is not glibc (macOS, musl, Windows),
    which keeps its own behaviour.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl's mallopt does nothing)
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
    )

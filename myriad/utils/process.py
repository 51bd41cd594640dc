"""The process settings that make myriad's loops fast, chosen and applied in one place.

:func:`apply_process_settings` runs when the ``myriad`` package is imported (its
``__init__``), before any of its modules imports torch. Every way of running myriad therefore
gets the same settings: the ``myriad`` command (pretrain, finetune, bench, ...), the ranks of
``torchrun -m myriad``, benchmarks, and Python programs that ``import myriad`` before they import
torch. The settings depend on what runs, not on the command typed:

- ``OMP_WAIT_POLICY=PASSIVE`` (unless the environment sets a policy): idle OpenMP threads sleep
  at once instead of spinning. Pretraining runs faiss (k-NN entropy) beside torch, each with its
  own OpenMP runtime, and spinning idle threads of one starve the working threads of the other
  on few cores; a multi-threaded MLP evaluation runs its rows as one stream of cache-sized chunks
  per torch thread (:mod:`myriad.nn.chunked`), which needs the OpenMP team to stay asleep. With one
  torch thread (``torch_threads: 1``, the configs' default, and every torchrun rank) no OpenMP
  team exists and the policy changes nothing.
- ``GOMP_SPINCOUNT=10000`` with that policy (unless the environment sets a count): an idle
  thread spins briefly before it sleeps, so that the next of a run of small parallel ops (an env
  step, the loss of a minibatch) finds it awake. Waking a sleeping thread cost about 45 us per
  op on a 2-core VM: ``floor`` of 8,192 floats took 47.8 us on two threads against 1.2 us on one
  (2.0 us with this count), and a nav-maze step of 4,096 envs 1.19 ms against 0.42 ms (0.44 ms;
  one-off observations, 2026-11-28).
- Threads: ``torch_threads`` of the run config, applied by the runner when a run starts
  (:func:`myriad.rl.runner.set_torch_threads`); torchrun sets ``OMP_NUM_THREADS=1`` per rank.
- Matrix products: the MLPs' dense products on an x86 CPU run on oneDNN's linear kernel rather
  than torch's BLAS (:mod:`myriad.nn.products`), unless ``MYRIAD_CPU_MATMUL=blas``.
- Allocator: glibc's malloc keeps freed blocks up to 32 MiB for reuse instead of returning them
  to the system (:func:`myriad.utils.memory.keep_freed_memory`), so each minibatch's tensors do
  not fault fresh pages in.

The OpenMP runtime reads its policy once, when torch loads it. In a program that imported torch
before myriad the runtime keeps the policy it started with, and the variable is left as it is,
so that it keeps saying what the runtime does: import myriad first to get the command's speed.

This module is the one place that reads the process environment for these settings. What it
decided is the :class:`ProcessSettings` value :func:`process_settings` returns; the code whose
fast path depends on it receives that value (the MLP's chunk streams,
:func:`myriad.nn.chunked.use_process_settings`) and never reads the environment itself.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessSettings:
    """What :func:`apply_process_settings` found and did.

    Attributes:
        openmp_wait_policy: ``OMP_WAIT_POLICY`` after start-up (None: unset, libgomp's default).
        openmp_spin_count: ``GOMP_SPINCOUNT`` after start-up (None: the policy's own count).
        set_here: whether myriad set it (the environment had none, torch was not loaded yet).
        torch_loaded_first: torch (so its OpenMP runtime) was imported before myriad.
        keeps_freed_memory: glibc's malloc keeps freed memory (False on other C libraries).
        cpu_matmul: ``"onednn"`` or ``"blas"``, the kernel of the MLPs' dense products on the
            CPU (:mod:`myriad.nn.products`; ``MYRIAD_CPU_MATMUL``, default ``"onednn"``).
    """

    openmp_wait_policy: str | None
    openmp_spin_count: str | None
    set_here: bool
    torch_loaded_first: bool
    keeps_freed_memory: bool
    cpu_matmul: str = "onednn"

    @property
    def openmp_threads_sleep(self) -> bool:
        """Whether idle OpenMP threads sleep at once (``PASSIVE``) rather than spin for a while
        (libgomp's default, and ``ACTIVE``)."""
        return (self.openmp_wait_policy or "").strip().upper() == "PASSIVE"


_settings: ProcessSettings | None = None

#: The values ``MYRIAD_CPU_MATMUL`` takes.
CPU_MATMUL_KERNELS = ("onednn", "blas")


def _cpu_matmul() -> str:
    value = os.environ.get("MYRIAD_CPU_MATMUL", "").strip().lower() or "onednn"
    if value not in CPU_MATMUL_KERNELS:
        print(
            f"myriad: MYRIAD_CPU_MATMUL={value!r} is not one of {', '.join(CPU_MATMUL_KERNELS)};"
            " using onednn",
            file=sys.stderr,
        )
        value = "onednn"
    return value


#: Spins of an idle OpenMP thread before it sleeps, with ``OMP_WAIT_POLICY=PASSIVE`` (whose own
#: count is 0). Longer spins take the cores the MLP's worker streams need: a PPO iteration at
#: 4,096 envs on two threads took 0.567 s with 10,000, 0.586 s with 1,000, 0.590 s with none and
#: 0.685 s with 100,000 (one-off observations, 2026-11-28, quiet 2-core VM).
OPENMP_SPIN_COUNT = "10000"


def apply_process_settings() -> ProcessSettings:
    """Apply the settings once per process (later calls return the first call's record)."""
    global _settings
    if _settings is not None:
        return _settings
    torch_loaded = "torch" in sys.modules
    before = os.environ.get("OMP_WAIT_POLICY", "").strip()
    # After torch loaded its OpenMP runtime the variable would no longer say what it does.
    set_here = not before and not torch_loaded
    if set_here:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)
    from myriad.utils.memory import keep_freed_memory

    _settings = ProcessSettings(
        os.environ.get("OMP_WAIT_POLICY"),
        os.environ.get("GOMP_SPINCOUNT"),
        set_here,
        torch_loaded,
        keep_freed_memory(),
        _cpu_matmul(),
    )
    return _settings


def process_settings() -> ProcessSettings:
    """The settings start-up applied (``import myriad`` applies them; this applies them if a
    program reached this module another way)."""
    return apply_process_settings()

"""Seeding and RNG state capture, so runs reproduce from their config and resume exactly."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) from one integer."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


#: Keys of the independent random streams derived from one seed with :func:`derive_seed`, in one
#: table so that no two uses share a stream. ``env`` and ``policy``: a Ray worker's env resets and
#: action sampling (from its shard seed); the others derive from a run's seed.
STREAMS: dict[str, int] = {
    "env": 0,
    "policy": 1,
    "minibatches": 2,
    "pbt": 3,
    "init_ranking": 4,
    "evaluation": 5,
}


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed derived from ``seed`` and ``keys`` by NumPy's ``SeedSequence``.

    Distinct key tuples give statistically independent streams (unlike ``seed + 1``, which is
    the next run's seed); the same inputs always give the same seed, on every machine.
    """
    entropy = [int(seed) % 2**64, *(int(k) % 2**64 for k in keys)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))


def stream_seed(seed: int, stream: str) -> int:
    """The seed of the named :data:`STREAMS` entry of a run seeded with ``seed``."""
    return derive_seed(seed, STREAMS[stream])


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A torch generator on ``device``; a random seed is drawn when ``seed`` is None."""
    gen = torch.Generator(device=device)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    gen.manual_seed(int(seed))
    return gen


def rng_state() -> dict[str, Any]:
    """The global RNG states of Python, NumPy and torch (CPU and CUDA when present)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

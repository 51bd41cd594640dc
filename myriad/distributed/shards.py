"""How E environments are split into W shards, and the seed each shard gets."""

from __future__ import annotations

import itertools

from myriad.utils.seeding import STREAMS, derive_seed

# Independent random streams derived from one shard seed.
ENV_STREAM = STREAMS["env"]
POLICY_STREAM = STREAMS["policy"]

__all__ = ["ENV_STREAM", "POLICY_STREAM", "derive_seed", "shard_seed", "split_envs"]


def split_envs(num_envs: int, num_shards: int) -> list[slice]:
    """Contiguous env ranges of ``num_shards`` shards, sizes differing by at most one.

    The first ``num_envs % num_shards`` shards get one env more; every shard gets at least one.

    Raises:
        ValueError: fewer envs than shards, or a non-positive count.
    """
    if num_shards < 1 or num_envs < num_shards:
        raise ValueError(
            f"cannot split {num_envs} envs into {num_shards} shards: need 1 <= shards <= envs"
        )
    base, extra = divmod(num_envs, num_shards)
    bounds = [0]
    for w in range(num_shards):
        bounds.append(bounds[-1] + base + (1 if w < extra else 0))
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def shard_seed(seed: int, shard: int, incarnation: int = 0) -> int:
    """The reset seed of shard ``shard`` for the run reset with ``seed``.

    ``incarnation`` counts restarts of the shard's worker: a restarted worker is re-seeded with a
    fresh but deterministic seed, so it does not replay the episodes it already produced.
    """
    return derive_seed(seed, shard, incarnation, ENV_STREAM)

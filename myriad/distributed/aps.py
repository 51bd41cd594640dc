"""Adaptive policy synchronisation (APS, docs/algorithms.md §9): the decision rule and its counters.

The learner holds policy version ``v``; worker ``w`` acts with ``v_w <= v``. After every update
the learner measures, on the states of the worker's last batch ``S_w``,

    D_w = mean_{s in S_w} KL( pi_{v_w}(.|s) || pi_v(.|s) )

and sends the current weights to ``w`` only when ``D_w > delta``. :class:`AdaptiveSync` is that
rule plus the counters a run logs; it knows nothing of Ray, so it is tested on its own.
:func:`mean_policy_kl` computes ``D_w`` from the two parameter dicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from myriad.distributed.policy import dist_kl


def mean_policy_kl(
    behaviour: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]
) -> float:
    """``D_w``: the mean over rows of the exact ``KL(behaviour || current)``.

    Args:
        behaviour: parameters the worker's policy produced on its states, ``[N, ...]``.
        current: the learner's current policy on the same states, ``[N, ...]``.
    """
    return float(dist_kl(behaviour, current).mean())


@dataclass
class WorkerSyncStats:
    """Counters of one worker.

    Attributes:
        checks: how many times a sync was decided on.
        syncs: how many of those sent weights.
        forced_syncs: syncs triggered by ``max_lag`` alone (drift at or below ``delta``).
        bytes_sent: bytes of weights sent to this worker (one state dict per sync).
        last_kl: ``D_w`` at the latest check.
        kl_at_sync: ``D_w`` of every check that triggered a sync, in order.
        lag_sum, lag_max, lag_count: policy lag ``v - v_w`` (in versions) of collected batches.
    """

    checks: int = 0
    syncs: int = 0
    forced_syncs: int = 0
    bytes_sent: int = 0
    last_kl: float = 0.0
    kl_at_sync: list[float] = field(default_factory=list)
    lag_sum: int = 0
    lag_max: int = 0
    lag_count: int = 0

    @property
    def lag_mean(self) -> float:
        return self.lag_sum / self.lag_count if self.lag_count else 0.0


class AdaptiveSync:
    """Send weights to a worker only when its policy has drifted by more than ``delta`` nats.

    Args:
        delta: KL threshold; ``0`` syncs after every update that changes the policy at all.
        max_lag: also sync a worker whose policy is this many versions behind, whatever its
            drift (None: KL alone decides, as in docs/algorithms.md §9). A safety net for
            learners whose updates are anchored to the behaviour policy (PPO's clipping): their
            drift can level off below ``delta``, and then KL alone never syncs again.

    Example:
        >>> aps = AdaptiveSync(delta=0.01)
        >>> aps.decide(worker=0, kl=0.005)
        False
        >>> aps.decide(worker=0, kl=0.02)
        True
        >>> aps.syncs
        {0: 1}
    """

    def __init__(self, delta: float, max_lag: int | None = None) -> None:
        if not delta >= 0.0:  # also rejects NaN
            raise ValueError(f"delta must be >= 0, got {delta}")
        if max_lag is not None and max_lag < 1:
            raise ValueError(f"max_lag must be >= 1 or None, got {max_lag}")
        self.delta = float(delta)
        self.max_lag = max_lag
        self.workers: dict[int, WorkerSyncStats] = {}

    def _worker(self, worker: int) -> WorkerSyncStats:
        return self.workers.setdefault(int(worker), WorkerSyncStats())

    def decide(self, worker: int, kl: float, lag: int | None = None) -> bool:
        """Record ``D_w = kl`` for ``worker``; True (one sync counted) when ``kl > delta``, or
        when ``lag`` (versions the worker is behind) reaches ``max_lag``.

        Raises:
            ValueError: ``kl`` is NaN or negative beyond rounding (the policy produced invalid
                parameters; syncing would hide it).
        """
        kl = float(kl)
        if math.isnan(kl) or kl < -1e-6:
            raise ValueError(
                f"worker {worker}: KL between policy versions is {kl}; check the policy"
            )
        stats = self._worker(worker)
        stats.checks += 1
        stats.last_kl = kl
        drifted = kl > self.delta
        stale = self.max_lag is not None and lag is not None and lag >= self.max_lag
        if not (drifted or stale):
            return False
        stats.syncs += 1
        stats.forced_syncs += int(not drifted)
        stats.kl_at_sync.append(kl)
        return True

    def record_bytes(self, worker: int, nbytes: int) -> None:
        """Count ``nbytes`` of weights sent to ``worker``."""
        self._worker(worker).bytes_sent += int(nbytes)

    def record_lag(self, worker: int, lag: int) -> None:
        """Record the policy lag, in versions, of a batch ``worker`` returned."""
        stats = self._worker(worker)
        stats.lag_sum += int(lag)
        stats.lag_max = max(stats.lag_max, int(lag))
        stats.lag_count += 1

    @property
    def syncs(self) -> dict[int, int]:
        """Syncs per worker."""
        return {w: s.syncs for w, s in sorted(self.workers.items())}

    @property
    def total_syncs(self) -> int:
        return sum(s.syncs for s in self.workers.values())

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.workers.values())

    def summary(self) -> dict[str, Any]:
        """Flat numbers for logs: totals, per-worker lists (in worker order), KL at sync time."""
        ws = [s for _, s in sorted(self.workers.items())]
        at_sync = [kl for s in ws for kl in s.kl_at_sync]
        lag_count = sum(s.lag_count for s in ws)
        return {
            "delta": self.delta,
            "max_lag": self.max_lag,
            "checks": sum(s.checks for s in ws),
            "syncs": self.total_syncs,
            "forced_syncs": sum(s.forced_syncs for s in ws),
            "syncs_per_worker": [s.syncs for s in ws],
            "bytes_sent": self.bytes_sent,
            "bytes_per_worker": [s.bytes_sent for s in ws],
            "kl_at_sync_mean": sum(at_sync) / len(at_sync) if at_sync else 0.0,
            "kl_at_sync_max": max(at_sync, default=0.0),
            "last_kl_per_worker": [s.last_kl for s in ws],
            "lag_mean": sum(s.lag_sum for s in ws) / lag_count if lag_count else 0.0,
            "lag_max": max((s.lag_max for s in ws), default=0),
        }

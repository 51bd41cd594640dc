"""The per-member k-NN search that runs on during the update (``defer_members``, beta = 1).

It must change nothing but when the work is done: the same neighbours and entropies as the
search that is waited for, the same training, and an error in the pooled search must reach the
caller without leaving the worker thread waiting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY_PRETRAIN, assert_same_training

import myriad.pretrain.runner as pretrain_runner
from myriad.pretrain.collaborators import PopulationMeasurement, RunShape, knn_measurement
from myriad.pretrain.objectives import EntropyMeasurement


def rollout_features(seed: int = 0) -> torch.Tensor:
    """``[T, E, p]`` features of 4 members (envs in blocks of 4), with repeated states."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(24, 16, 2, generator=g)
    features[:, :4] += 5.0
    features[:, 3] = features[0, 3]  # an env that never moves
    return features


def test_deferred_measurement_equals_the_waited_one() -> None:
    features = rollout_features()
    waited = EntropyMeasurement(5, 4, 2)(features)
    deferring = EntropyMeasurement(5, 4, 2)
    deferring.defer_members = True
    deferred = deferring(features)
    # beta = 1: the reward needs the pooled neighbours only
    torch.testing.assert_close(deferred.reward(1.0, 1.0), waited.reward(1.0, 1.0), rtol=0, atol=0)
    assert torch.equal(deferred.grouped.distances, waited.grouped.distances)
    assert torch.equal(deferred.grouped.indices, waited.grouped.indices)
    assert torch.equal(deferred.individual, waited.individual)
    assert torch.equal(deferred.collective, waited.collective)
    assert deferred.scalars() == waited.scalars()
    assert not deferred.pending
    # Evaluation rollouts (no update of the scale) are measured at once.
    assert not deferring.evaluate(features).pending


def test_a_failing_pooled_search_reaches_the_caller_and_frees_the_worker() -> None:
    """The per-member search that runs beside the pooled one (``concurrent``) waits for the
    pooled distances; when the pooled search fails, it must give up, not wait forever."""
    measure = EntropyMeasurement(5, 4, 2)
    inner = measure.search

    class BrokenPooled:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("pooled search failed")

        def grouped(self, *args: Any, **kwargs: Any) -> Any:
            return inner.grouped(*args, **kwargs)

    measure.search = BrokenPooled()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="pooled search failed"):
        measure(rollout_features())
    worker = measure._worker
    assert worker is not None
    # The member search gave up instead of waiting for the pooled distances forever: the
    # worker is free for the next job.
    assert worker.submit(lambda: 7).result(timeout=60) == 7


class _WaitedMeasurement(EntropyMeasurement):
    """The measurement with the per-member search always waited for."""

    @property  # type: ignore[override]
    def defer_members(self) -> bool:
        return False

    @defer_members.setter
    def defer_members(self, value: bool) -> None:
        pass


def test_training_is_the_same_with_the_search_deferred(tmp_path: Path) -> None:
    """A runner given a measurement that always waits for the per-member search learns what
    the default (deferring at beta = 1) learns."""
    from myriad.pretrain.api import resolve_config

    cfg = resolve_config([*TINY_PRETRAIN, "iterations=2", "dataset.enabled=false"])

    def waited(run: RunShape) -> PopulationMeasurement:
        obj = run.config["objective"]
        entropy = _WaitedMeasurement(
            int(obj["k"]),
            run.num_members,
            run.env.features.dim,
            backend=str(obj["backend"]),
            min_distance=float(obj["min_distance"]),
        )
        return PopulationMeasurement(entropy, knn_measurement(run).coverage)

    runs = []
    for name, measurement in (("deferred", knn_measurement), ("waited", waited)):
        runner = pretrain_runner.PretrainRunner(cfg, tmp_path / name, measurement=measurement)
        assert isinstance(runner.measure, _WaitedMeasurement) is (name == "waited")
        try:
            runner.learn(2)
            runs.append(
                {
                    "state": {"model": runner.model.state_dict()},
                    "logger": runner.logger.state_dict(),
                }
            )
        finally:
            runner.close()
    assert runs[0]["state"]["model"] and runs[0]["logger"]["history"]
    assert_same_training(*runs)


@pytest.mark.parametrize(("beta", "deferred"), [(1.0, True), (0.5, False)])
def test_the_runner_defers_only_when_the_reward_ignores_the_members(
    tmp_path: Path, beta: float, deferred: bool
) -> None:
    from myriad.pretrain.api import resolve_config

    cfg = resolve_config([*TINY_PRETRAIN, f"objective.beta={beta}", "dataset.enabled=false"])
    runner = pretrain_runner.PretrainRunner(cfg, tmp_path / "run")
    try:
        assert runner.measure.defer_members is deferred
    finally:
        runner.close()

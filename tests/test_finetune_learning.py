"""CPO and PPO learn to reach a sparse goal in the open nav room within a small budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from myriad.finetune.api import resolve_config
from myriad.finetune.runner import FinetuneRunner


def _sparse_budget() -> list[str]:
    """nav-empty: start in the centre, goal in a corner about five cells away, reward +1 on
    arrival; 128 envs, 64-64 networks. The budget that benchmarks/ppo_sparse_components.py
    measures PPO at over 96 seeds."""
    path = Path(__file__).resolve().parents[1] / "benchmarks/ppo_sparse_components.py"
    spec = importlib.util.spec_from_file_location("ppo_sparse_components", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.BUDGET)


BUDGET = _sparse_budget()


# A small budget, where the outcome depends on the seed and, through float rounding, on the CPU.
# CPO: over seeds 0-7 its leader reached 0.8 in 5 runs, with the KL set point (the default) and
# with the fixed coefficients alike; seed 2 reaches it in both modes. PPO: at 20 iterations seed
# 0 reached 0.8 on one CPU and 0.375 on another; at 40 iterations its training episodes reach
# the goal in 43 of seeds 0-95, rsl_rl's PPO's in 59 (benchmarks/ppo_sparse_components.py,
# docs/evidence/finetune.md "PPO on a sparse goal"), seeds 0, 2 and 4 among them. So PPO is
# checked on three seeds that reach it, two of which must.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("algo", "iterations", "seeds", "extra"),
    [("ppo", 40, (0, 2, 4), []), ("cpo", 40, (2,), ["population.size=8"])],
)
def test_leader_reaches_the_sparse_goal(tmp_path, algo, iterations, seeds, extra):
    reached = 0
    for seed in seeds:
        config = resolve_config(algo, [*BUDGET, *extra, f"seed={seed}"])
        runner = FinetuneRunner(config, tmp_path / f"{algo}-{seed}")
        before = runner.evaluate_leader(64)["eval/leader_success"]
        runner.learn(iterations)
        after = runner.evaluate_leader(64)["eval/leader_success"]
        runner.close()
        # The untrained mean action barely moves: the deterministic leader never arrives.
        assert before == 0.0
        reached += after >= 0.8
    # A majority of the seeds: two of PPO's three, CPO's one.
    assert reached >= len(seeds) // 2 + 1, (reached, seeds)

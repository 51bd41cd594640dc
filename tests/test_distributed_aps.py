"""APS decision rule, exact KLs, seeding, configs and the worker class, all without Ray."""

import math
import sys

import numpy as np
import pytest
import torch

from myriad.distributed import (
    AdaptiveSync,
    APSConfig,
    EnvWorker,
    LinearPolicy,
    as_dist_params,
    derive_seed,
    dist_log_prob,
    load_config,
    mean_policy_kl,
    preset_names,
    shard_seed,
    split_envs,
)
from myriad.distributed.policy import dist_kl
from myriad.utils.optional import MissingDependencyError


def gaussian(mean, log_std=0.0, n=5):
    m = torch.tensor(mean, dtype=torch.float32).expand(n, -1)
    return {"mean": m, "log_std": torch.full_like(m, log_std)}


def test_adaptive_sync_hand_checked_sequence():
    """Worker mean drifts by known shifts with sigma = 1: D = d^2 / 2, syncing at d > 0.1414."""
    aps = AdaptiveSync(delta=0.01)
    learner, worker, decisions, kls = 0.0, 0.0, [], []
    for shift in [0.1, 0.1, 0.05, 0.3, 0.1]:
        learner += shift
        kl = mean_policy_kl(gaussian([worker, 0.0]), gaussian([learner, 0.0]))
        assert kl == pytest.approx((learner - worker) ** 2 / 2, abs=1e-6)
        kls.append(kl)
        sync = aps.decide(0, kl)
        decisions.append(sync)
        if sync:
            worker = learner
    assert decisions == [False, True, False, True, False]
    assert aps.syncs == {0: 2}
    assert aps.workers[0].kl_at_sync == pytest.approx([0.02, 0.35**2 / 2], rel=1e-5)
    summary = aps.summary()
    assert summary["syncs"] == 2 and summary["checks"] == 5
    assert summary["kl_at_sync_max"] == pytest.approx(0.06125, rel=1e-5)


def test_delta_zero_syncs_every_change_and_large_delta_never():
    always, rarely = AdaptiveSync(0.0), AdaptiveSync(10.0)
    for kl in [1e-6, 0.02, 0.5, 3.0]:
        assert always.decide(1, kl)
        assert not rarely.decide(1, kl)
    assert always.syncs == {1: 4} and rarely.syncs == {1: 0}
    assert not always.decide(1, 0.0)  # an unchanged policy needs no weights


def test_max_lag_forces_a_sync_when_drift_levels_off():
    aps = AdaptiveSync(delta=0.05, max_lag=3)
    decisions = [aps.decide(0, 0.02, lag=lag) for lag in (1, 2, 3)]
    assert decisions == [False, False, True]
    assert aps.decide(0, 0.2, lag=1)
    assert aps.summary()["forced_syncs"] == 1 and aps.syncs == {0: 2}
    with pytest.raises(ValueError, match="max_lag"):
        AdaptiveSync(0.1, max_lag=0)


def test_adaptive_sync_counters_and_errors():
    aps = AdaptiveSync(0.1)
    aps.record_bytes(0, 100)
    aps.record_bytes(1, 50)
    aps.record_bytes(0, 100)
    for lag in (0, 2, 1):
        aps.record_lag(1, lag)
    s = aps.summary()
    assert s["bytes_sent"] == 250 and s["bytes_per_worker"] == [200, 50]
    assert s["lag_max"] == 2 and s["lag_mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="KL"):
        aps.decide(0, float("nan"))
    with pytest.raises(ValueError, match="delta"):
        AdaptiveSync(-0.1)


def test_gaussian_kl_matches_closed_form_with_different_scales():
    p = {"mean": torch.tensor([[0.3, -1.0]]), "log_std": torch.tensor([[0.0, math.log(2.0)]])}
    q = {"mean": torch.tensor([[0.0, 0.0]]), "log_std": torch.tensor([[math.log(0.5), 0.0]])}
    # Per dim: log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2.
    dim0 = math.log(0.5) + (1 + 0.09) / (2 * 0.25) - 0.5
    dim1 = math.log(0.5) + (4 + 1) / 2 - 0.5
    assert mean_policy_kl(p, q) == pytest.approx(dim0 + dim1, rel=1e-5)


def test_categorical_kl_matches_closed_form():
    uniform = {"logits": torch.zeros(3, 4)}
    shifted = {"logits": torch.tensor([[math.log(2.0), 0.0, 0.0, 0.0]]).expand(3, -1)}
    # KL(uniform || q) with q = (2, 1, 1, 1) / 5.
    expected = sum(0.25 * math.log(0.25 / qi) for qi in (0.4, 0.2, 0.2, 0.2))
    assert mean_policy_kl(uniform, shifted) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="categorical"):
        dist_kl(uniform, gaussian([0.0, 0.0], n=3))


def test_as_dist_params_accepts_the_policy_forms():
    mean, log_std = torch.zeros(4, 2), torch.zeros(2)
    p = as_dist_params((mean, log_std))
    assert p["log_std"].shape == (4, 2)
    assert set(as_dist_params({"mean": mean, "log_std": log_std})) == {"mean", "log_std"}
    assert set(as_dist_params(torch.zeros(4, 3))) == {"logits"}
    with pytest.raises(TypeError, match="action_params"):
        as_dist_params("nope")


def test_population_model_works_as_worker_policy():
    from myriad.nn import PopulationActorCritic

    model = PopulationActorCritic(4, 2, num_members=2)
    member = torch.tensor([0, 0, 0, 1, 1, 1])
    params = as_dist_params(model.action_params(torch.zeros(6, 4), member))
    assert params["mean"].shape == params["log_std"].shape == (6, 2)


def test_split_envs_and_seeds():
    assert split_envs(10, 3) == [slice(0, 4), slice(4, 7), slice(7, 10)]
    with pytest.raises(ValueError, match="shards"):
        split_envs(2, 3)
    seeds = {shard_seed(7, w, k) for w in range(4) for k in range(3)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
    assert shard_seed(7, 1) == shard_seed(7, 1) != shard_seed(8, 1)
    assert derive_seed(-1, 2) == derive_seed(2**64 - 1, 2)


def test_presets_load_and_unknown_keys_are_named():
    assert preset_names() == ["cluster", "local"]
    local, cluster = load_config("local"), load_config("cluster")
    assert local.ray.address is None and not local.ray.include_dashboard
    assert cluster.ray.address == "auto"
    # The APS settings of the presets (for APSCollector.from_config), outside the preset files.
    assert local.aps == APSConfig(delta=0.01, horizon=64, max_lag=None, kl_max_states=None)
    assert cluster.aps == APSConfig(delta=0.01, horizon=128, max_lag=None, kl_max_states=4096)
    assert load_config({"aps": {"horizon": 8}}).aps.horizon == 8
    assert load_config({"workers": {"num_workers": 4}}).workers.num_workers == 4
    with pytest.warns(UserWarning, match="APSCollector"):
        assert load_config({"mode": "worker"}) == load_config({})
    with pytest.raises(ValueError, match="num_worker"):
        load_config({"workers": {"num_worker": 4}})
    with pytest.raises(FileNotFoundError, match="presets"):
        load_config("nowhere")


def test_worker_rollout_in_process_reports_behaviour_distribution():
    """The worker class itself, without Ray: log-probs are those of the returned parameters,
    and a stale worker keeps acting with (and reporting) its own version."""
    worker = EnvWorker("nav-u-maze", 3, {"max_episode_steps": 5})
    policy = LinearPolicy(4, 2, init_log_std=-1.0)
    with torch.no_grad():
        policy.bias += 0.5
    worker.set_policy(policy, 3, np.zeros(3, dtype=np.int64))
    worker.reset(11)
    out = worker.rollout(7)
    assert out["obs"].shape == (7, 3, 4) and out["actions"].shape == (7, 3, 2)
    assert out["version"] == 3 and out["counters"]["steps"] == 7
    params = {k: torch.from_numpy(v) for k, v in out["params"].items()}
    np.testing.assert_allclose(params["mean"].numpy(), 0.5)
    logp = dist_log_prob(params, torch.from_numpy(out["actions"]))
    np.testing.assert_allclose(logp.numpy(), out["log_prob"], rtol=1e-6)
    assert out["info"]["done"][4].all()  # five-step episodes end at step index 4
    # Same seed, same rollout (env and sampling streams both derive from the reset seed).
    worker.reset(11)
    np.testing.assert_array_equal(worker.rollout(7)["actions"], out["actions"])


def test_worker_categorical_needs_action_table():
    worker = EnvWorker("nav-u-maze", 2)
    policy = LinearPolicy(4, 4, kind="categorical")
    worker.set_policy(policy, 0, np.zeros(2, dtype=np.int64))
    worker.reset(0)
    with pytest.raises(RuntimeError, match="action_table"):
        worker.rollout(1)
    table = np.array([[1, 0], [-1, 0], [0, 1], [0, -1]], dtype=np.float32)
    worker.set_policy(policy, 0, np.zeros(2, dtype=np.int64), table)
    out = worker.rollout(3)
    assert out["actions"].dtype == np.int64 and out["params"]["logits"].shape == (3, 2, 4)


def test_missing_ray_gives_one_line_install_message(monkeypatch):
    from myriad.distributed import RemoteVecEnv

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"myriad-rl\[ray\]"):
        RemoteVecEnv("nav-u-maze", 2, 1)

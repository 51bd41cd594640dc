"""Remote environments on a local Ray of two CPUs: equality with local envs, APS end to end,
worker failures."""

import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from myriad.distributed import (  # noqa: E402 - after the importorskip above
    APSCollector,
    LinearPolicy,
    RemoteVecEnv,
    WorkerLostError,
    WorkerTimeoutError,
    dist_log_prob,
    shard_seed,
    state_dict_bytes,
)
from myriad.envs import make  # noqa: E402
from myriad.envs.checker import check_env  # noqa: E402

ENV = "nav-u-maze"
OPTIONS = {"max_episode_steps": 8}
# Quarter-CPU actors: two envs of two workers fit on the 2-CPU test cluster at once.
# A worker answers within seconds on an idle machine; the limit leaves room for a loaded one
# (starting a worker imports torch and myriad in a new process).
WORKER = {"cpus_per_worker": 0.25, "timeout_s": 180.0}
COMPASS = np.array([[1, 0], [-1, 0], [0, 1], [0, -1]], dtype=np.float32)


@pytest.fixture(scope="module")
def ray_session():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def remote(ray_session):
    env = RemoteVecEnv(ENV, 7, 2, env_options=OPTIONS, **WORKER)
    yield env
    env.close()


def local_shards(seed: int, sizes=(4, 3)):
    envs = [make(ENV, n, **OPTIONS) for n in sizes]
    obs = torch.cat([e.reset(shard_seed(seed, w)) for w, e in enumerate(envs)])
    return envs, obs


def step_local(envs, actions, sizes=(4, 3)):
    outs = [e.step(a) for e, a in zip(envs, actions.split(list(sizes)))]
    info = {k: torch.cat([o[4][k] for o in outs]) for k in outs[0][4]}
    return [torch.cat([o[i] for o in outs]) for i in range(4)], info


def test_remote_matches_local_shards(remote):
    """Same seed and actions: the 4 + 3 split over two workers equals the two shards built
    locally with their shard seeds, through auto-resets (episodes of 8 steps)."""
    assert [s.stop - s.start for s in remote.slices] == [4, 3]
    envs, obs_local = local_shards(5)
    assert torch.equal(remote.reset(5), obs_local)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        actions = torch.rand(7, 2, generator=gen) * 2.4 - 1.2
        obs, reward, term, trunc, info = remote.step(actions)
        ref, ref_info = step_local(envs, actions)
        for got, want in zip((obs, reward, term, trunc), ref):
            assert torch.equal(got, want)
        for key, value in ref_info.items():
            assert torch.equal(info[key], value), key
        assert not info["restarted"].any()
        assert torch.equal(
            remote.current_features(), torch.cat([e.current_features() for e in envs])
        )
    assert torch.equal(remote.reset(5), obs_local)


def test_state_dict_restores_every_shard_exactly(remote):
    """A checkpoint taken mid-episode, loaded after more steps, replays the same steps: the
    workers' env state and the learner-side episode counters come back (checkpoints load
    ``weights_only``, so the state must survive that too)."""
    import io

    remote.reset(11)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        remote.step(torch.rand(7, 2, generator=gen) * 2 - 1)
    buffer = io.BytesIO()
    torch.save(remote.state_dict(), buffer)
    actions = [torch.rand(7, 2, generator=gen) * 2 - 1 for _ in range(9)]  # past the time limit
    first = [remote.step(a) for a in actions]
    buffer.seek(0)
    assert remote.load_state_dict(torch.load(buffer, weights_only=True)) is None
    for a, (obs, reward, term, trunc, info) in zip(actions, first):
        again = remote.step(a)
        for got, want in zip(again[:4], (obs, reward, term, trunc)):
            assert torch.equal(got, want)
        for key in ("final_obs", "episode_return", "episode_length"):
            assert torch.equal(again[4][key], info[key]), key


def test_remote_env_passes_contract_checker(remote):
    report = check_env(remote, steps=12)
    assert report.ok, report.failures()


def test_gymnasium_facade_over_remote_env(remote):
    import gymnasium as gym

    genv = remote.as_gymnasium()
    assert isinstance(genv, gym.vector.VectorEnv)
    obs, _ = genv.reset(seed=5)
    assert isinstance(obs, np.ndarray) and obs.shape == (7, 4)
    np.testing.assert_array_equal(obs, local_shards(5)[1].numpy())
    for _ in range(8):
        obs, reward, term, trunc, info = genv.step(np.zeros((7, 2), dtype=np.float32))
    assert isinstance(reward, np.ndarray) and trunc.all()
    assert info["_final_obs"].all() and info["final_obs"][0].shape == (4,)


def scripted_gaussian() -> LinearPolicy:
    """Mean = bias (weights zero), sigma = 1: KL between versions is d^2 / 2 for a mean shift
    d of one action dimension, whatever the states."""
    return LinearPolicy(4, 2)


def gated_gaussian(gate: Path) -> LinearPolicy:
    """:func:`scripted_gaussian` whose ``action_params`` holds, in a process whose pid the test
    armed (``gate/armed-<pid>``), until the test removes that file; it touches
    ``gate/started-<pid>`` first. The test acts (kills a worker, lets a call run out of time)
    while a rollout is certainly under way; a restarted worker (a new pid) is not held.

    The class is defined inside this function so that Ray pickles it by value: the workers
    cannot import this test module.
    """

    class GatedPolicy(LinearPolicy):
        def action_params(self, obs: torch.Tensor, member: torch.Tensor):
            armed = gate / f"armed-{os.getpid()}"
            if armed.exists():
                (gate / f"started-{os.getpid()}").touch()
                deadline = time.monotonic() + 120.0
                while armed.exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError("the test never released the gate")
                    time.sleep(0.01)
            return super().action_params(obs, member)

    return GatedPolicy(4, 2)


def arm(gate: Path, env) -> list[int]:
    """Arm the gate in every worker process of ``env``; returns their pids."""
    pids = [int(ray.get(a.ready.remote(), timeout=60)["pid"]) for a in env.actors]
    for pid in pids:
        (gate / f"armed-{pid}").touch()
    return pids


def wait_started(gate: Path, pids: list[int], timeout: float = 60.0) -> None:
    """Block until every process in ``pids`` is held at the gate."""
    deadline = time.monotonic() + timeout
    while not all((gate / f"started-{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"workers {pids} did not reach the gate in {timeout:g} s")
        time.sleep(0.01)


@pytest.mark.parametrize(("delta", "expected"), [(0.0, 5), (0.01, 2), (1.0, 0)])
def test_aps_gaussian_hand_checked_syncs(remote, delta, expected):
    policy = scripted_gaussian()
    collector = APSCollector(remote, policy, horizon=3, delta=delta, seed=1)
    nbytes = state_dict_bytes(policy.state_dict())
    learner, held = 0.0, [0.0, 0.0]
    expected_kls: list[float] = []
    for shift in [0.1, 0.1, 0.05, 0.3, 0.1]:
        batch = collector.collect()
        # Each worker acts with (and reports) the version it holds, stale or not.
        for w, sl in enumerate(remote.slices):
            assert batch.workers[w]["version"] == collector.worker_version[w]
            torch.testing.assert_close(
                batch.params["mean"][:, sl, 0], torch.full((3, sl.stop - sl.start), held[w])
            )
        torch.testing.assert_close(batch.log_prob, dist_log_prob(batch.params, batch.actions))
        with torch.no_grad():
            policy.bias[0, 0] += shift
        learner += shift
        kls = collector.publish()
        for w in range(2):
            want = (learner - held[w]) ** 2 / 2
            assert kls[w] == pytest.approx(want, abs=1e-6)
            if want > delta:
                expected_kls.append(want)
                held[w] = learner
    stats = collector.stats()
    assert stats["syncs_per_worker"] == [expected, expected]
    assert stats["bytes_sent"] == 2 * expected * nbytes
    assert stats["version"] == 5 and stats["batches_per_worker"] == [5, 5]
    at_sync = [kl for w in range(2) for kl in collector.aps.workers[w].kl_at_sync]
    assert sorted(at_sync) == pytest.approx(sorted(expected_kls), abs=1e-6)
    assert stats["lag_max"] == (0 if delta == 0.0 else (1 if delta == 0.01 else 4))


def test_aps_categorical_hand_checked_syncs(remote):
    policy = LinearPolicy(4, 4, kind="categorical")
    collector = APSCollector(
        remote, policy, horizon=2, delta=0.03, seed=2, action_table=torch.from_numpy(COMPASS)
    )

    def kl_uniform_to(a: float) -> float:
        z = math.exp(a) + 3.0
        q = [math.exp(a) / z, 1 / z, 1 / z, 1 / z]
        return sum(0.25 * math.log(0.25 / qi) for qi in q)

    decisions = []
    for logit in [0.2, math.log(2.0)]:
        batch = collector.collect()
        assert batch.actions.dtype == torch.long and batch.params["logits"].shape == (2, 7, 4)
        torch.testing.assert_close(batch.log_prob, dist_log_prob(batch.params, batch.actions))
        with torch.no_grad():
            policy.bias[0, 0] = logit
        kls = collector.publish()
        assert kls[0] == pytest.approx(kl_uniform_to(logit), abs=1e-6)
        decisions.append(collector.worker_version[0] == collector.version)
    assert decisions == [False, True]  # 0.0039 < 0.03 < 0.0499
    assert collector.stats()["syncs_per_worker"] == [1, 1]
    batch = collector.collect()
    torch.testing.assert_close(batch.params["logits"][..., 0], torch.full((2, 7), math.log(2.0)))


def test_worker_error_surfaces_with_its_traceback(remote):
    wrong = LinearPolicy(3, 2)  # built for 3-d observations; the env has 4
    collector = APSCollector(remote, wrong, horizon=2, seed=0)
    with pytest.raises(ray.exceptions.RayTaskError, match="action_params"):
        collector.collect()


def test_run_config_with_distributed_entry_builds_remote_envs(ray_session):
    """``make_from_config`` (envs layer) builds Ray-backed envs through the factory it is
    given (``myriad.distributed.make_distributed``, what the commands pass), and local envs
    without the entry."""
    from myriad.distributed import make_distributed
    from myriad.envs import make_from_config

    env_cfg = {"name": ENV, "options": OPTIONS}
    distributed = {"workers": {"num_workers": 1, **WORKER}}
    env = make_from_config(env_cfg, 3, "cpu", distributed, remote=make_distributed)
    try:
        assert isinstance(env, RemoteVecEnv) and env.name == ENV and env.num_envs == 3
        assert torch.equal(env.reset(5), make(ENV, 3, **OPTIONS).reset(shard_seed(5, 0)))
    finally:
        env.close()
    assert not isinstance(make_from_config(env_cfg, 3), RemoteVecEnv)


def test_failing_env_construction_surfaces(ray_session):
    with pytest.raises(ray.exceptions.RayActorError, match="unknown task"):
        RemoteVecEnv(ENV, 2, 1, env_options={"task": "bogus"}, **WORKER)


def wait_until_restarted(actor, timeout: float = 60.0) -> None:
    """Block until Ray has brought ``actor`` back in a new process."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ray.get(actor.ready.remote(), timeout=10)["reconstructed"]:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.05)
    raise AssertionError("the killed actor was not restarted")


def test_killed_worker_restarts_reseeded_and_counts_stay_exact(ray_session, tmp_path):
    config = {
        "workers": {"num_workers": 2, "max_restarts": 3, **WORKER},
        "aps": {"horizon": 2, "delta": 0.0},
    }
    env = RemoteVecEnv.from_config(ENV, 4, config, env_options=OPTIONS)
    try:
        env.reset(0)
        for _ in range(5):
            env.step(torch.zeros(4, 2))
        # Killed between two steps: the next step reaches a fresh process with no env state.
        ray.kill(env.actors[1], no_restart=False)
        wait_until_restarted(env.actors[1])
        obs, reward, term, trunc, info = env.step(torch.full((4, 2), 0.5))
        lost = slice(2, 4)
        assert info["restarted"].tolist() == [False, False, True, True]
        assert trunc[lost].all() and not term[lost].any() and (reward[lost] == 0).all()
        assert info["episode_length"][lost].tolist() == [5, 5]
        # Re-seeded deterministically from the reset seed, the shard and the restart count.
        fresh = make(ENV, 2, **OPTIONS).reset(shard_seed(0, 1, 1))
        assert torch.equal(obs[lost], fresh)
        for _ in range(3):
            env.step(torch.zeros(4, 2))
        assert env.stats.steps == [9, 8] and env.stats.interrupted_steps == [0, 1]
        assert env.stats.restarts == [0, 1]
        assert [c["steps"] for c in env.worker_counters()] == [9, 3]  # new process from zero

        # Worker-side inference: killed in the middle of its rollout, the worker is restarted,
        # gets the current weights, and its batch is redone: never delivered twice or missing.
        gate = tmp_path / "gate"
        gate.mkdir()
        policy = gated_gaussian(gate)
        collector = APSCollector.from_config(env, policy, config)
        collector.collect()
        with torch.no_grad():
            policy.bias += 0.3
        collector.publish()
        collector.horizon = 3
        pids = arm(gate, env)
        collector.collect_async()
        wait_started(gate, pids)  # both workers are inside their rollout
        ray.kill(env.actors[0], no_restart=False)  # held until killed; its restart is not armed
        (gate / f"armed-{pids[1]}").unlink()
        batch = collector.collect_wait()
        assert env.stats.restarts == [1, 1]
        assert [m["restarted"] for m in batch.workers] == [True, False]
        assert [m["index"] for m in batch.workers] == [1, 1]
        assert collector.batches == [2, 2]
        assert collector.env_steps == 4 * (2 + 3)
        assert batch.version.tolist() == [1, 1, 1, 1]  # the restarted worker got version 1
        assert torch.allclose(batch.params["mean"][:, :2], torch.tensor(0.3))
        assert collector.stats()["restart_syncs"] == 1
        assert [c["rollouts"] for c in env.worker_counters()] == [1, 2]

        # A call that outlives its bound raises instead of hanging: the workers are held at the
        # gate until the error has been raised.
        pids = arm(gate, env)
        env.timeout_s = 0.5
        with pytest.raises(WorkerTimeoutError, match="no answer"):
            collector.collect()
        for pid in pids:
            (gate / f"armed-{pid}").unlink()

        # Deaths beyond the restart budget end the run with an error, not a retry loop.
        env.max_restarts, env.timeout_s = 1, 30.0
        for actor in env.actors:
            ray.kill(actor, no_restart=False)
        with pytest.raises(WorkerLostError, match="max_restarts"):
            env.step(torch.zeros(4, 2))
    finally:
        env.close()

"""MuJoCo tasks on the CPU backend: Gymnasium v5 parity, instability handling, maze, hand."""

import math
import sys

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from myriad.envs import make, names
from myriad.envs.mujoco import BENCH_CASES
from myriad.envs.mujoco.models import locomotion_model
from myriad.utils.optional import MissingDependencyError

has_robotics = pytest.mark.skipif(
    __import__("importlib").util.find_spec("gymnasium_robotics") is None,
    reason="gymnasium-robotics (Shadow hand MJCF) not installed",
)


@pytest.mark.parametrize(
    ("gym_id", "name", "action_scale", "options"),
    [
        ("Ant-v5", "mujoco-ant", 1.0, {}),
        ("Ant-v5", "mujoco-ant", 1.0, {"healthy_reward": 0.0}),
        ("HalfCheetah-v5", "mujoco-halfcheetah", 1.0, {}),
        ("Humanoid-v5", "mujoco-humanoid", 0.4, {}),
    ],
)
def test_matches_gymnasium_v5(
    gym_id: str, name: str, action_scale: float, options: dict, tmp_path, monkeypatch
):
    """Same state and actions: same observations, rewards and terminations as Gymnasium."""
    monkeypatch.chdir(tmp_path)  # MuJoCo logs Gymnasium's deprecated MJCF attributes to a file
    reference = gym.make(gym_id, **options).unwrapped
    ref_obs, _ = reference.reset(seed=3)
    env = make(name, 1, model="gymnasium", **options)
    qpos = torch.from_numpy(reference.data.qpos.copy())[None]
    qvel = torch.from_numpy(reference.data.qvel.copy())[None]
    obs = env.set_state(qpos, qvel)
    np.testing.assert_allclose(obs[0].numpy(), ref_obs, rtol=1e-5, atol=1e-5)
    rng = np.random.default_rng(0)
    steps = 0
    for _ in range(30):
        a = rng.uniform(-1.0, 1.0, env.action_dim).astype(np.float32)
        ref_obs, ref_rew, ref_term, _, _ = reference.step(a * action_scale)
        _, rew, term, _, info = env.step(torch.from_numpy(a)[None])
        np.testing.assert_allclose(info["final_obs"][0].numpy(), ref_obs, rtol=1e-4, atol=1e-4)
        assert float(rew[0]) == pytest.approx(ref_rew, rel=1e-4, abs=1e-4)
        assert bool(term[0]) == ref_term
        steps += 1
        if ref_term:
            break
    assert steps >= 5
    env.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_nan_state_is_reset_and_counted(tmp_path, monkeypatch, workers: int):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT when it meets a bad state
    env = make("mujoco-ant", 4, model="fast", num_workers=workers)
    zeros = torch.zeros(4, env.action_dim)
    before, *_ = env.step(zeros)
    env.sim.corrupt(1)
    obs, rew, term, _, info = env.step(zeros)
    assert info["unstable"].tolist() == [False, True, False, False]
    assert int(info["unstable_total"]) == 1
    assert bool(term[1]) and float(rew[1]) == 0.0
    for t in (obs, info["final_obs"], info["features"], rew):
        assert torch.isfinite(t).all()
    assert torch.equal(info["final_obs"][1], before[1])
    _, _, _, _, info = env.step(zeros)
    assert not info["unstable"].any() and int(info["unstable_total"]) == 1
    env.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_divergence_in_the_first_step_after_a_reset_is_flagged(tmp_path, monkeypatch, workers):
    # Simulation time restarts at 0 on reset, so a divergence that MuJoCo repairs by resetting
    # the data itself is only visible through its warning counters.
    monkeypatch.chdir(tmp_path)
    env = make("mujoco-ant", 2, model="fast", num_workers=workers)
    env.reset(seed=0)
    env.sim.corrupt(0)
    _, rew, term, _, info = env.step(torch.zeros(2, env.action_dim))
    assert info["unstable"].tolist() == [True, False]
    assert bool(term[0]) and float(rew[0]) == 0.0 and int(info["unstable_total"]) == 1
    _, _, _, _, info = env.step(torch.zeros(2, env.action_dim))
    assert not info["unstable"].any() and int(info["unstable_total"]) == 1
    env.close()


def test_unstable_step_after_an_auto_reset_reports_the_new_episode_features(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = make("mujoco-ant", 2, model="fast", num_workers=0, max_episode_steps=1)
    env.reset(seed=0)
    zeros = torch.zeros(2, env.action_dim)
    _, _, _, trunc, info = env.step(zeros)  # both episodes end and auto-reset
    assert trunc.all()
    new_episode = env._task_features().float()
    assert not torch.equal(new_episode, info["features"])  # reset moved the torso
    env.sim.corrupt(0)
    _, _, _, _, info = env.step(zeros)
    assert bool(info["unstable"][0])
    torch.testing.assert_close(info["features"][0], new_episode[0])
    env.close()


def test_cpu_worker_count_does_not_change_results():
    runs = []
    for workers in (0, 2):
        env = make("mujoco-halfcheetah", 64, model="fast", num_workers=workers)
        gen = torch.Generator().manual_seed(0)
        out = [env.reset(seed=5)]
        for _ in range(5):
            out.append(env.step(torch.rand(64, 6, generator=gen) * 2 - 1)[0])
        runs.append(torch.stack(out))
        env.close()
    assert torch.equal(runs[0], runs[1])


def test_fast_model_settings():
    fast, ref = locomotion_model("ant", "fast"), locomotion_model("ant", "gymnasium")
    assert ref.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4 and ref.opt.iterations == 100
    assert fast.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER and fast.opt.iterations == 4
    touching = {fast.geom(i).name for i in range(fast.ngeom) if fast.geom_contype[i] & 1}
    assert touching == {
        "left_ankle_geom",
        "right_ankle_geom",
        "third_ankle_geom",
        "fourth_ankle_geom",
    }
    with pytest.raises(ValueError, match="model must be one of"):
        make("mujoco-ant", 1, model="brax")
    with pytest.raises(ValueError, match="backend must be one of"):
        make("mujoco-ant", 1, backend="jax")


def _cells(env, feats: torch.Tensor) -> tuple[np.ndarray, ...]:
    low, high = (np.asarray(b) for b in (env.features.low, env.features.high))
    cells = np.asarray(env.features.cells)
    idx = np.floor((feats.numpy() - low) / (high - low) * cells).astype(int)
    idx = np.clip(idx, 0, cells - 1)
    return tuple(idx.T)


def test_antmaze_reachable_cells_and_goal():
    env = make("mujoco-antmaze-u", 8)
    spec = env.features
    assert spec.cells == (20, 20) and spec.reachable.shape == (20, 20)
    assert int(spec.reachable.sum()) == 7 * 16  # 7 free maze cells of 4 x 4 grid cells
    assert spec.reachable[_cells(env, env.current_features())].all()
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        _, _, _, _, info = env.step(torch.rand(8, 8, generator=gen) * 2 - 1)
        assert spec.reachable[_cells(env, info["features"])].all()
    qpos = env.sim.field("qpos").clone()
    qpos[:, :2] = env.goal_xy
    env.set_state(qpos, torch.zeros(8, env.mj_model.nv))
    _, rew, term, _, info = env.step(torch.zeros(8, 8))
    assert (rew == 1.0).all() and term.all() and info["success"].all()
    env.close()


def test_antmaze_goal_option_reward_and_geodesic_distance():
    """Another goal cell: reward and termination there and not at the layout's goal, the goal
    offset in the observation, and geodesic distances along the U (counted by hand)."""
    env = make("mujoco-antmaze-u", 3, goal=(4.0, 4.0))
    qpos = env.sim.field("qpos").clone()
    qpos[:, :2] = torch.tensor([[4.0, 4.0], [-4.0, -4.0], [4.1, 3.7]], dtype=qpos.dtype)
    env.set_state(qpos, torch.zeros(3, env.mj_model.nv))
    obs, rew, term, _, info = env.step(torch.zeros(3, 8))
    assert rew.tolist() == [1.0, 0.0, 1.0] and term.tolist() == [True, False, True]
    torso = info["final_obs"][:, :2]
    torch.testing.assert_close(info["final_obs"][:, -2:], torch.tensor([4.0, 4.0]) - torso)
    # Cells along the U from the start corridor's west end to the goal corridor's west end.
    along = torch.tensor(
        [[-4.0, 4.0], [0.0, 4.0], [4.0, 4.0], [4.0, 0.0], [4.0, -4.0], [0.0, -4.0], [-4.0, -4.0]]
    )
    assert env.geodesic_to_goal(along).tolist() == [2, 1, 0, 1, 2, 3, 4]
    assert env.geodesic_to_goal(torch.tensor([[0.0, 0.0], [11.0, 0.0]])).isinf().all()
    env.close()
    with pytest.raises(ValueError, match="not in a free cell"):
        make("mujoco-antmaze-u", 1, goal=(0.0, 0.0))
    with pytest.raises(ValueError, match="one task"):
        make("mujoco-antmaze-u", 1, task="dense")


@pytest.mark.parametrize("physics", ["fast", "gymnasium"])
def test_an_ant_launched_over_a_wall_stays_in_the_maze(physics):
    """An ant thrown up and across the wall between the U-maze's start and goal corridors (a
    trained explorer reaches such speeds) stays under the maze's ceiling and in its corridors
    (the soft contacts let a torso thrown at 30 m/s into the ceiling sink into it a little)."""
    env = make("mujoco-antmaze-u", 4, model=physics)
    qpos = env.sim.field("qpos").clone()
    qvel = torch.zeros(4, env.mj_model.nv, dtype=qpos.dtype)
    # Start corridor (y = 4) towards the goal corridor (y = -4) across the wall at y = 0, and
    # out of the maze (x = -10) from its west end.
    qvel[:, :3] = torch.tensor(
        [[0.0, -15.0, 15.0], [0.0, -25.0, 25.0], [-15.0, 0.0, 15.0], [-10.0, -10.0, 30.0]],
        dtype=qpos.dtype,
    )
    env.set_state(qpos, qvel)
    top = env.layout.wall_height + env.layout.ceiling_thickness
    for _ in range(100):
        _, _, _, _, info = env.step(torch.zeros(4, 8))
        xyz = env.sim.field("xpos")[:, 1]  # the torso
        assert (xyz[:, 2] < top).all(), xyz
        assert env.features.reachable[_cells(env, info["features"])].all(), xyz
    env.close()


@has_robotics
def test_shadowhand_reward_success_and_new_target():
    from myriad.envs.mujoco.hand import rotation_distance

    env = make("mujoco-shadowhand-cube", 2)
    hold = torch.zeros(2, env.action_dim)
    for _ in range(10):  # let the cube settle on the palm
        env.step(hold)
    env.target_quat[0] = env.sim.field("qpos")[0, -4:]  # env 0 is at its target
    old_target = env.target_quat.clone()
    _, rew, term, _, info = env.step(hold)
    assert info["goal_reached"].tolist() == [True, False]
    assert info["successes"][0] >= 1.0 and info["successes"][1] == 0.0
    assert float(rotation_distance(env.target_quat[0], old_target[0])) > 0.0
    assert torch.equal(env.target_quat[1], old_target[1])
    assert not term.any()
    # Independent reward for env 1 from its final observation (IsaacGymEnvs' formula).
    o = info["final_obs"][1].double()
    dist = o[48:51].norm()
    quat = o[51:55]
    target = old_target[1]
    diff_w = (quat * target).sum()  # w of q * conj(target) for unit quaternions
    rot = 2 * math.asin(min(1.0, math.sqrt(max(0.0, 1 - float(diff_w) ** 2))))
    expected = -10 * float(dist) + 1 / (rot + 0.1)
    assert float(rew[1]) == pytest.approx(expected, rel=1e-3, abs=1e-3)
    assert float(rew[0]) > 250.0
    env.close()


def test_quaternion_distance():
    from myriad.envs.mujoco.hand import rotation_distance

    q = torch.tensor([0.5, 0.5, -0.5, 0.5], dtype=torch.float64)
    z90 = torch.tensor([math.cos(math.pi / 4), 0, 0, math.sin(math.pi / 4)], dtype=torch.float64)
    identity = torch.tensor([1.0, 0, 0, 0], dtype=torch.float64)
    assert float(rotation_distance(q, q)) == pytest.approx(0.0, abs=1e-6)
    assert float(rotation_distance(q, -q)) == pytest.approx(0.0, abs=1e-6)
    assert float(rotation_distance(z90, identity)) == pytest.approx(math.pi / 2, abs=1e-6)


def test_bench_cases_are_runnable_configs():
    registered = set(names())
    assert BENCH_CASES
    for case in BENCH_CASES:
        assert case["name"] in registered
        assert case["num_envs"] == [1, 64, 1024, 4096]
        assert case["options"]["backend"] in ("mujoco", "warp")
        assert case["options"]["model"] in ("gymnasium", "fast")


def test_missing_warp_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "warp", None)
    with pytest.raises(MissingDependencyError) as err:
        make("mujoco-halfcheetah", 1, backend="warp")
    message = str(err.value)
    assert "myriad-rl[warp]" in message and "\n" not in message


def test_missing_hand_assets_names_the_package(monkeypatch):
    import myriad.envs.mujoco.models as models

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match="gymnasium-robotics") as err:
        models.shadow_hand_model()
    assert "\n" not in str(err.value)

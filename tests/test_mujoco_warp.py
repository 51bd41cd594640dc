"""MuJoCo Warp backend on Warp's CPU device (CUDA when present): agreement with CPU MuJoCo,
zero-copy state, instability handling and the env contract.

Warp compiles its kernels on first use (about 20 s per model on two cores, cached under
``$MYRIAD_WARP_CACHE``), so the checks share one small HalfCheetah build and run as one test:
spread over pytest-xdist workers, each worker would compile the kernels again.
"""

import pytest
import torch

pytest.importorskip("warp", reason="warp-lang not installed (extra: warp)")
pytest.importorskip("mujoco_warp", reason="mujoco-warp not installed (extra: warp)")

from myriad.envs import make
from myriad.envs.checker import check_env

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 4


def test_warp_backend():
    env = make(
        "mujoco-halfcheetah",
        N,
        device=DEVICE,
        backend="warp",
        model="gymnasium",
        max_episode_steps=12,
    )
    try:
        check_same_seed_and_actions_match_cpu_mujoco(env)
        check_state_is_a_view_of_warp_memory(env)
        check_nan_state_is_reset_and_counted(env)
        assert check_env(env, steps=8).ok
    finally:
        env.close()


def check_same_seed_and_actions_match_cpu_mujoco(warp_env) -> None:
    """Short horizon, converged solver: the float32 GPU engine stays within 1e-3 of float64."""
    cpu = make("mujoco-halfcheetah", N, backend="mujoco", model="gymnasium", max_episode_steps=12)
    obs_cpu, obs_warp = cpu.reset(seed=7), warp_env.reset(seed=7).cpu()
    assert torch.allclose(obs_cpu, obs_warp, atol=1e-6)
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        a = torch.rand(N, 6, generator=gen) * 2 - 1
        obs_cpu, rew_cpu, *_ = cpu.step(a)
        obs_warp, rew_warp, *_ = warp_env.step(a.to(DEVICE))
        assert torch.allclose(obs_cpu, obs_warp.cpu(), atol=1e-3)
        assert torch.allclose(rew_cpu, rew_warp.cpu(), atol=1e-3)
    cpu.close()


def check_state_is_a_view_of_warp_memory(warp_env) -> None:
    qpos = warp_env.sim.field("qpos")
    assert qpos.data_ptr() == warp_env.sim.d.qpos.ptr
    assert qpos.device.type == torch.device(DEVICE).type


def check_nan_state_is_reset_and_counted(warp_env) -> None:
    warp_env.reset(seed=0)
    zeros = torch.zeros(N, 6, device=DEVICE)
    before, *_ = warp_env.step(zeros)
    total = int(warp_env.unstable_total)
    warp_env.sim.corrupt(2)
    obs, rew, term, _, info = warp_env.step(zeros)
    assert info["unstable"].tolist() == [False, False, True, False]
    assert int(info["unstable_total"]) == total + 1
    assert bool(term[2]) and float(rew[2]) == 0.0
    assert torch.isfinite(obs).all() and torch.isfinite(info["final_obs"]).all()
    assert torch.equal(info["final_obs"][2], before[2])
    assert torch.isfinite(warp_env.sim.field("qvel")).all()

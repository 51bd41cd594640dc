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


# One-step agreement along 100-step trajectories (myriad.envs.mujoco.agreement; docs/mujoco.md).
# Free-running trajectories cannot be compared over 100 steps: CPU MuJoCo against itself, rounded
# to float32 after every step, leaves the tolerance within 11-60 steps
# (benchmarks/results/mujoco_warp_agreement.json). Each env-step starts Warp from the CPU state.
AGREEMENT_ENVS, AGREEMENT_STEPS = 8, 100


def agreement_backends(robot: str, cone: int):
    import mujoco

    from myriad.envs.mujoco.backends import CpuBackend, WarpBackend
    from myriad.envs.mujoco.models import locomotion_model

    model = locomotion_model(robot, "gymnasium")
    model.opt.cone = cone
    fields = ("xpos", "cfrc_ext")
    cpu = CpuBackend(model, AGREEMENT_ENVS, 5, fields, num_workers=0)
    warp = WarpBackend(model, AGREEMENT_ENVS, 5, fields, DEVICE, nconmax=32, njmax=192)
    assert model.opt.cone in (mujoco.mjtCone.mjCONE_PYRAMIDAL, mujoco.mjtCone.mjCONE_ELLIPTIC)
    return cpu, warp


def assert_stepwise_agreement(gaps: torch.Tensor) -> None:
    """All but 1% of env-steps within STEP_TOLERANCE, 99% within a tenth of it: the rare
    exceptions are contacts that float32 rounding puts on the other side of the contact margin."""
    from myriad.envs.mujoco.agreement import STEP_TOLERANCE

    assert gaps.shape == (AGREEMENT_STEPS, AGREEMENT_ENVS)
    share_over = float((gaps > STEP_TOLERANCE).double().mean())
    p99 = float(torch.quantile(gaps.flatten(), 0.99))
    assert share_over <= 0.01, f"{100 * share_over:.1f}% of env-steps over {STEP_TOLERANCE}"
    assert p99 <= STEP_TOLERANCE / 10, f"99th percentile gap {p99:.2e}"


def test_halfcheetah_agrees_step_by_step_over_100_steps():
    """Gymnasium's HalfCheetah as shipped (Euler, pyramidal cones, Newton): float32 Warp stays
    within the tolerance of float64 MuJoCo on every step of a 100-step random-control run."""
    import mujoco

    from myriad.envs.mujoco.agreement import stepwise_gaps

    cpu, warp = agreement_backends("halfcheetah", mujoco.mjtCone.mjCONE_PYRAMIDAL)
    try:
        gaps = stepwise_gaps(cpu, warp, AGREEMENT_STEPS, seed=0)
    finally:
        cpu.close()
        warp.close()
    assert_stepwise_agreement(gaps)


def test_ant_agrees_step_by_step_with_elliptic_cones_and_capsule_frames_differ():
    """Gymnasium's Ant (RK4, Newton) with elliptic friction cones, whose friction does not depend
    on the tangent directions of a contact frame, agrees step by step over 100 steps. With
    Gymnasium's pyramidal cones it cannot: MuJoCo Warp orients the frame of a plane-capsule
    contact along world y when the capsule axis is within 30 degrees of the plane normal, where
    MuJoCo uses the projected capsule axis (docs/mujoco.md). That difference is checked here on
    the states of the same run, so that this test fails when MuJoCo Warp changes it."""
    import mujoco

    from myriad.envs.mujoco.agreement import stepwise_gaps

    cpu, warp = agreement_backends("ant", mujoco.mjtCone.mjCONE_ELLIPTIC)
    seen = {"aligned": 0, "near_vertical": 0}

    def check_frames() -> None:
        if min(seen.values()) < 3:
            compare_capsule_frames(cpu, warp, seen)

    try:
        gaps = stepwise_gaps(cpu, warp, AGREEMENT_STEPS, seed=0, before_step=check_frames)
    finally:
        cpu.close()
        warp.close()
    assert_stepwise_agreement(gaps)
    assert min(seen.values()) >= 3, f"too few plane-capsule contacts of each kind: {seen}"


def compare_capsule_frames(cpu, warp, seen: dict[str, int]) -> None:
    """Compare the plane-capsule contact frames of both engines in the current (same) state."""
    import mujoco
    import numpy as np

    from myriad.envs.mujoco.backends import _STATE_SPEC

    m, wp = cpu.model, warp.wp
    with wp.ScopedDevice(warp.wp_device):
        warp.mjw.forward(warp.m, warp.d)
    n = int(warp.d.nacon.numpy()[0])
    w_world = warp.d.contact.worldid.numpy()[:n]
    w_geom = warp.d.contact.geom.numpy()[:n]
    w_pos = warp.d.contact.pos.numpy()[:n]
    w_frame = warp.d.contact.frame.numpy()[:n].reshape(n, 9)
    data = mujoco.MjData(m)
    for env in range(cpu.num_envs):
        mujoco.mj_setState(m, data, cpu._arrays["state"][env], _STATE_SPEC)
        mujoco.mj_forward(m, data)
        for c in data.contact[: data.ncon]:
            capsule = int(c.geom[1])
            if m.geom_type[c.geom[0]] != mujoco.mjtGeom.mjGEOM_PLANE:
                continue
            if m.geom_type[capsule] != mujoco.mjtGeom.mjGEOM_CAPSULE:
                continue
            match = np.flatnonzero(
                (w_world == env)
                & (w_geom[:, 1] == capsule)
                & (np.abs(w_pos - c.pos).max(axis=1) < 1e-4)
            )
            if match.size != 1:
                continue  # a contact at the margin that float32 rounding leaves out
            tangent_cpu, tangent_warp = c.frame[3:6], w_frame[match[0], 3:6]
            axis = data.geom_xmat[capsule].reshape(3, 3)[:, 2]
            normal = c.frame[:3]
            projected = float(np.linalg.norm(axis - normal * (normal @ axis)))
            if projected >= 0.5:
                assert np.allclose(tangent_warp, tangent_cpu, atol=1e-4)
                seen["aligned"] += 1
            else:
                assert np.allclose(tangent_warp, [0.0, 1.0, 0.0], atol=1e-6), (
                    "MuJoCo Warp's plane-capsule frame changed: update docs/mujoco.md and "
                    "compare Ant with Gymnasium's pyramidal cones"
                )
                assert not np.allclose(tangent_cpu, [0.0, 1.0, 0.0], atol=1e-2)
                seen["near_vertical"] += 1


def test_gpu_check_stage_runs_on_warps_cpu_device(tmp_path):
    """The GPU check's MuJoCo Warp stage (throughput and step-by-step agreement on HalfCheetah and
    elliptic-cone Ant) on Warp's CPU device at small sizes: it passes and records its figures."""
    import json

    from myriad.bench import gpu

    out = tmp_path / "gpu.json"
    status = gpu.main(["--device", "cpu", "--small", "--stages", "mujoco_warp", "--out", str(out)])
    stage = json.loads(out.read_text())["stages"]["mujoco_warp"]
    assert status == 0 and stage["status"] == "ok", stage["error"]
    robots = [a["robot"] for a in stage["figures"]["agreement"]]
    assert robots == ["halfcheetah", "ant"]
    for a in stage["figures"]["agreement"]:
        assert a["share_over_tolerance"] <= 0.01 and a["max_gap"] >= 0.0
    assert all(r["steps_per_s"] > 0 for r in stage["figures"]["throughput"])

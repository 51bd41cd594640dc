"""Step-by-step agreement of the Warp backend with CPU MuJoCo.

Two runs of a contact-rich robot under random actions separate exponentially from any difference
in their states: CPU MuJoCo against itself, with its state rounded to float32 after every step,
leaves a relative gap of 1e-3 after a median of 44-59 steps, the earliest env after 11
(``benchmarks/mujoco_warp_agreement.py``). So
free-running trajectories of a float32 engine cannot agree with float64 MuJoCo over 100 steps,
whatever the engine. What can be compared is one step at a time: :func:`stepwise_gaps` puts
every Warp world in the state of the same CPU env (time, ``qpos``, ``qvel`` and the solver's warm
start), applies the same controls to both for one env step and measures the gap, then goes on
from the CPU state. The states visited are those of a real trajectory, contacts included.

The gap of an env is ``max |x_warp - x_cpu| / (1 + max |x_cpu|)`` over ``qpos`` and over ``qvel``
(the larger of the two): relative for large velocities, absolute near zero.
"""

from __future__ import annotations

from collections.abc import Callable

import mujoco
import numpy as np
import torch

from myriad.envs.mujoco.backends import CpuBackend, PhysicsBackend, WarpBackend, _state_slice

#: Relative one-step gap (see the module docstring) that Warp's float32 step stays within on all
#: but 1% of the env-steps of HalfCheetah and of elliptic-cone Ant, 99% of them within a tenth of
#: it (docs/mujoco.md gives the measured figures; the exceptions are contacts that rounding puts
#: on the other side of the contact margin).
STEP_TOLERANCE = 1e-3


def load_state(warp: WarpBackend, cpu: CpuBackend) -> None:
    """Put every Warp world in the physics state of the CPU env of the same index: time,
    ``qpos``, ``qvel`` and the warm start (``qacc_warmstart``), rounded to float32.

    The derived quantities are not copied: a step recomputes them from these.
    """
    if cpu.model.na:
        raise ValueError("load_state copies qpos, qvel and the warm start; this model has act")
    state = torch.from_numpy(cpu._arrays["state"])
    to_torch = warp.wp.to_torch
    pairs = (
        (warp.d.qpos, mujoco.mjtState.mjSTATE_QPOS),
        (warp.d.qvel, mujoco.mjtState.mjSTATE_QVEL),
        (warp.d.qacc_warmstart, mujoco.mjtState.mjSTATE_WARMSTART),
    )
    for array, bit in pairs:
        to_torch(array).copy_(state[:, _state_slice(cpu.model, bit)])
    to_torch(warp.d.time).copy_(
        state[:, _state_slice(cpu.model, mujoco.mjtState.mjSTATE_TIME)][:, 0]
    )


def relative_gap(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``max |other - reference| / (1 + max |reference|)`` per env over the trailing dimension:
    ``[E, n], [E, n] -> [E]`` (float64)."""
    ref = reference.double()
    diff = (other.to(ref.device).double() - ref).abs().amax(dim=-1)
    return diff / (1.0 + ref.abs().amax(dim=-1))


def random_controls(
    model: mujoco.MjModel, num_envs: int, generator: torch.Generator
) -> torch.Tensor:
    """Controls uniform in each actuator's control range, ``[E, nu]`` float64."""
    low = torch.as_tensor(model.actuator_ctrlrange[:, 0])
    high = torch.as_tensor(model.actuator_ctrlrange[:, 1])
    u = torch.rand(num_envs, model.nu, generator=generator, dtype=torch.float64)
    return low + u * (high - low)


def reset_pair(a: PhysicsBackend, b: PhysicsBackend, generator: torch.Generator) -> None:
    """Reset two backends of one model to the same states: Gymnasium's Ant/HalfCheetah reset
    noise (``qpos0 + U(-0.1, 0.1)``, ``0.1 N(0, 1)`` velocities), drawn in float32 so that both
    start from exactly the same numbers."""
    m, E = a.model, a.num_envs
    noise = torch.rand(E, m.nq, generator=generator) * 0.2 - 0.1
    qpos = (torch.as_tensor(m.qpos0).float() + noise).double()
    qvel = (0.1 * torch.randn(E, m.nv, generator=generator)).double()
    everyone = torch.ones(E, dtype=torch.bool)
    a.reset_envs(everyone, qpos.to(a.device), qvel.to(a.device))
    b.reset_envs(everyone.to(b.device), qpos.to(b.device), qvel.to(b.device))


def stepwise_gaps(
    cpu: CpuBackend,
    warp: WarpBackend,
    steps: int,
    seed: int = 0,
    before_step: Callable[[], None] | None = None,
) -> torch.Tensor:
    """One-step gaps of Warp against CPU MuJoCo along a CPU trajectory under random controls.

    Both backends must hold the same model and number of envs. Resets both (same states), then
    for each of ``steps`` env steps: loads the CPU state into Warp (:func:`load_state`), steps both
    with the same controls, and measures :func:`relative_gap` of ``qpos`` and of ``qvel``.
    ``before_step`` (optional) is called after each load, before the step: a hook to inspect both
    engines in the same state (Warp's state is loaded again after it).

    Returns:
        ``[steps, E]`` float64: the larger of the two gaps of each env and step.
    """
    if cpu.num_envs != warp.num_envs or cpu.frame_skip != warp.frame_skip:
        raise ValueError("the two backends must have the same number of envs and frame_skip")
    gen = torch.Generator().manual_seed(seed)
    reset_pair(cpu, warp, gen)
    gaps = torch.empty(steps, cpu.num_envs, dtype=torch.float64)
    for t in range(steps):
        load_state(warp, cpu)
        if before_step is not None:
            before_step()
            load_state(warp, cpu)  # whatever the hook ran on Warp, the step starts from the CPU's
        ctrl = random_controls(cpu.model, cpu.num_envs, gen)
        cpu.step(ctrl)
        warp.step(ctrl.to(warp.device, torch.float32))
        gaps[t] = torch.maximum(
            relative_gap(cpu.field("qpos"), warp.field("qpos")),
            relative_gap(cpu.field("qvel"), warp.field("qvel")),
        )
    return gaps


def free_running_gaps(
    reference: CpuBackend,
    other: CpuBackend | WarpBackend,
    steps: int,
    seed: int = 0,
    round32: bool = False,
) -> torch.Tensor:
    """Gaps of two backends reset to the same states and stepped with the same controls, never
    re-synchronised: ``[steps, E]`` (as in :func:`stepwise_gaps`).

    ``round32`` (``other`` a :class:`CpuBackend`): round ``other``'s ``qpos`` and ``qvel`` to
    float32 after every step, the smallest perturbation a float32 engine makes; the gap it grows
    into measures how fast the dynamics amplify differences, whatever their source.
    """
    gen = torch.Generator().manual_seed(seed)
    m = reference.model
    reset_pair(reference, other, gen)
    columns = [
        _state_slice(m, bit) for bit in (mujoco.mjtState.mjSTATE_QPOS, mujoco.mjtState.mjSTATE_QVEL)
    ]
    gaps = torch.empty(steps, reference.num_envs, dtype=torch.float64)
    for t in range(steps):
        ctrl = random_controls(m, reference.num_envs, gen)
        reference.step(ctrl)
        other.step(ctrl.to(other.device, other.dtype))
        if round32 and isinstance(other, CpuBackend):
            state = other._arrays["state"]
            for c in columns:
                state[:, c] = state[:, c].astype(np.float32)
        gaps[t] = torch.maximum(
            relative_gap(reference.field("qpos"), other.field("qpos")),
            relative_gap(reference.field("qvel"), other.field("qvel")),
        )
    return gaps


__all__ = [
    "STEP_TOLERANCE",
    "free_running_gaps",
    "load_state",
    "random_controls",
    "relative_gap",
    "reset_pair",
    "stepwise_gaps",
]

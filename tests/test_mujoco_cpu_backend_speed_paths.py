"""The CPU MuJoCo backend's speed paths change no number.

The backend keeps every env's state in a row of one shared array and steps it on one ``MjData``
per process, the workers claiming small chunks of envs; small reset batches run in the calling
process. The reference here is the plain layout: one ``MjData`` per env, stepped in order with
Gymnasium's call sequence. Every field must match it bit for bit, with any number of workers and
on both reset paths.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from myriad.envs import make
from myriad.envs.mujoco.backends import _LOCAL_RESETS, CpuBackend
from myriad.envs.mujoco.models import locomotion_model

_FIELDS = {
    "ant": ("xpos", "cfrc_ext"),
    # PGS solver, and every derived field a task reads.
    "humanoid": ("xipos", "cinert", "cvel", "qfrc_actuator", "cfrc_ext"),
}


class _OneDataPerEnv:
    """Reference: ``E`` ``MjData``, each stepped on its own (Gymnasium's ``MujocoEnv`` sequence)."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, frame_skip: int, fields):
        self.model, self.frame_skip, self.fields = model, frame_skip, ("qpos", "qvel", *fields)
        self.datas = [mujoco.MjData(model) for _ in range(num_envs)]

    def step(self, ctrl: np.ndarray) -> np.ndarray:
        """Returns ``[E]`` bool: MuJoCo reset the env's state by itself during the step."""
        bad = np.zeros(len(self.datas), dtype=bool)
        for k, d in enumerate(self.datas):
            d.ctrl[:] = ctrl[k]
            mujoco.mj_step(self.model, d, self.frame_skip)
            if "cfrc_ext" in self.fields:
                mujoco.mj_rnePostConstraint(self.model, d)
            for w in (
                mujoco.mjtWarning.mjWARN_BADQPOS,
                mujoco.mjtWarning.mjWARN_BADQVEL,
                mujoco.mjtWarning.mjWARN_BADQACC,
            ):
                bad[k] |= d.warning[w].number > 0
                d.warning[w].number = 0
        return bad

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        for i in ids.tolist():
            d = self.datas[i]
            mujoco.mj_resetData(self.model, d)
            d.qpos[:] = qpos[i]
            d.qvel[:] = qvel[i]
            mujoco.mj_forward(self.model, d)

    def field(self, name: str) -> np.ndarray:
        return np.stack([getattr(d, name) for d in self.datas])


def _assert_same(sim: CpuBackend, ref: _OneDataPerEnv) -> None:
    for name in ref.fields:
        np.testing.assert_array_equal(sim.field(name).numpy(), ref.field(name), err_msg=name)
    np.testing.assert_array_equal(sim.time().numpy(), ref.field("time"))


@pytest.mark.parametrize("robot", ["ant", "humanoid"])
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_steps_and_resets_match_one_mjdata_per_env(robot: str, workers: int, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT when it meets a bad state
    model = locomotion_model(robot, "gymnasium")
    E = 2 * _LOCAL_RESETS + 5  # not a multiple of the chunk or of the worker count
    sim = CpuBackend(model, E, 5, _FIELDS[robot], num_workers=workers)
    ref = _OneDataPerEnv(model, E, 5, _FIELDS[robot])
    rng = np.random.default_rng(0)

    def reset(ids: np.ndarray) -> None:
        qpos = model.qpos0 + rng.uniform(-0.1, 0.1, (E, model.nq))
        qvel = 0.1 * rng.standard_normal((E, model.nv))
        mask = np.zeros(E, dtype=bool)
        mask[ids] = True
        sim.reset_envs(torch.from_numpy(mask), torch.from_numpy(qpos), torch.from_numpy(qvel))
        ref.reset(ids, qpos, qvel)

    _assert_same(sim, ref)  # the state of a new MjData before the first reset
    reset(np.arange(E))  # more than _LOCAL_RESETS: the workers' reset path
    _assert_same(sim, ref)
    flagged = []
    for t in range(8):
        if t == 4:
            sim.corrupt(E - 1)
            ref.datas[E - 1].qvel[:] = float("nan")
        ctrl = rng.uniform(-1.0, 1.0, (E, model.nu))
        sim.step(torch.from_numpy(ctrl))
        bad = ref.step(ctrl)
        _assert_same(sim, ref)
        assert sim.diverged().numpy().tolist() == bad.tolist()
        flagged += [(t, int(i)) for i in np.flatnonzero(bad)]
        # A few envs (the calling process's path) or many (the workers').
        count = 3 if t % 2 == 0 else _LOCAL_RESETS + 1
        reset(np.sort(rng.choice(E, count, replace=False)))
        _assert_same(sim, ref)
    assert flagged == [(4, E - 1)]
    sim.close()


def test_ant_env_is_the_same_with_any_number_of_workers():
    """Whole env steps (observations, rewards, ends, auto-resets of many and of few envs)."""
    E, runs = 40, []
    for workers in (0, 1, 2):
        env = make("mujoco-ant", E, model="gymnasium", num_workers=workers, max_episode_steps=6)
        gen = torch.Generator().manual_seed(0)
        out = [env.reset(seed=3)]
        for _ in range(14):  # every env truncates at steps 6 and 12: a reset of all E envs
            obs, rew, term, trunc, info = env.step(torch.rand(E, 8, generator=gen) * 2 - 1)
            out += [obs, rew[:, None], term[:, None].float(), trunc[:, None].float()]
            out.append(info["final_obs"])
        runs.append(torch.cat(out, dim=1))
        env.close()
    for other in runs[1:]:
        assert torch.equal(runs[0], other)

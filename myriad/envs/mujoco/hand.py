"""In-hand cube reorientation with the Shadow Dexterous Hand, following IsaacGymEnvs' ShadowHand.

The hand (OpenAI's MJCF shipped by Gymnasium-Robotics: 24 joints, 20 position actuators) holds a
5 cm cube on its palm. Each episode draws a random initial cube orientation and a random target
orientation (uniform on SO(3)). The reward is IsaacGymEnvs' ``compute_hand_reward``:

``-10 * |p - p_goal| + 1 / (rot_dist + 0.1) - 2e-4 * |a|^2 + 250 * success``

where ``rot_dist = 2 asin(min(1, |vec(q * conj(q_target))|))`` and ``success`` means
``rot_dist <= 0.1`` rad. On success a new target is drawn and the episode goes on; the episode is
terminated when the cube falls (``|p - p_goal| >= 0.24``) or after ``max_consecutive_successes``
successes (0: no limit). ``info["successes"]`` holds each env's successes in the current episode
(before any reset at this step) and ``info["consecutive_successes"]`` IsaacGymEnvs' running
average of successes per finished episode.
"""

from __future__ import annotations

from typing import Any

import torch

from myriad.envs.base import FeatureSpec
from myriad.envs.mujoco.base import MujocoVecEnv
from myriad.envs.mujoco.models import shadow_hand_model


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product of ``[..., 4]`` quaternions in MuJoCo's ``(w, x, y, z)`` order."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


def quat_conj(q: torch.Tensor) -> torch.Tensor:
    """Conjugate (inverse of a unit quaternion), ``[..., 4]``."""
    return torch.cat([q[..., :1], -q[..., 1:]], dim=-1)


def rotation_distance(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Angle in radians ``[...]`` of the rotation taking ``target`` to ``q`` (both ``[..., 4]``)."""
    diff = quat_mul(q, quat_conj(target))
    return 2.0 * torch.asin(diff[..., 1:].norm(dim=-1).clamp(max=1.0))


class ShadowHandCubeEnv(MujocoVecEnv):
    """Reorient a cube in the Shadow hand to a random target orientation.

    Observation (89): hand joint positions scaled to ``[-1, 1]`` by their ranges (24), hand joint
    velocities x 0.2 (24), cube position relative to the goal position (3), cube quaternion (4),
    cube linear velocity (3) and angular velocity x 0.2 (3), target quaternion (4), cube-to-target
    quaternion ``q * conj(q_target)`` (4), previous actions (20).

    Actions: absolute joint position targets, ``[-1, 1]`` mapped to each actuator's range.

    Entropy features (7): the cube's quaternion with ``w >= 0`` (``q`` and ``-q`` are the same
    rotation) and its position relative to the goal position, clipped to ``+-fall_distance``.

    Args:
        model: ``"gymnasium"`` (Gymnasium-Robotics' settings: 2 ms steps, 20 per control step,
            20 solver iterations) or ``"fast"`` (5 ms steps, 8 per control step, 4 iterations);
            both control at 25 Hz.
        backend: ``"mujoco"`` or ``"warp"``.
        max_episode_steps: time limit (250 steps = 10 s).
        success_tolerance: rotation distance counted as success (radians).
        max_consecutive_successes: terminate after this many successes (0: never).
    """

    goal_pos: torch.Tensor  # the VecEnv attribute: the cube's target position [3]
    dist_reward_scale = -10.0
    rot_reward_scale = 1.0
    rot_eps = 0.1
    action_penalty_scale = -2e-4
    reach_goal_bonus = 250.0
    fall_distance = 0.24
    av_factor = 0.1
    n_hand = 24

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        model: str = "gymnasium",
        backend: str = "mujoco",
        max_episode_steps: int = 250,
        success_tolerance: float = 0.1,
        max_consecutive_successes: int = 0,
        num_workers: int | None = None,
        validate: bool = True,
    ):
        self.model_name = model
        mj_model, frame_skip = shadow_hand_model(model)
        f = self.fall_distance
        features = FeatureSpec(
            ("qw", "qx", "qy", "qz", "dx", "dy", "dz"),
            (0.0, -1.0, -1.0, -1.0, -f, -f, -f),
            (1.0, 1.0, 1.0, 1.0, f, f, f),
            (4, 8, 8, 8, 5, 5, 5),
        )
        super().__init__(
            num_envs,
            device,
            mj_model,
            frame_skip,
            89,
            (),
            backend,
            num_workers,
            nconmax=64,
            njmax=512,
            validate=validate,
            max_episode_steps=max_episode_steps,
            features=features,
        )
        self.success_tolerance = float(success_tolerance)
        self.max_consecutive_successes = int(max_consecutive_successes)
        dt, dev = self.sim.dtype, self.device
        ranges = torch.as_tensor(mj_model.jnt_range[: self.n_hand], dtype=dt, device=dev)
        self._joint_low, self._joint_high = ranges[:, 0], ranges[:, 1]
        # The cube rests on the palm here (it settles from Gymnasium-Robotics' start pose).
        self.goal_pos = torch.tensor([1.0, 0.87, 0.17], dtype=dt, device=dev)
        self.target_quat = torch.zeros(self.num_envs, 4, dtype=dt, device=dev)
        self.target_quat[:, 0] = 1.0
        self.successes = torch.zeros(self.num_envs, dtype=torch.float32, device=dev)
        self.consecutive_successes = torch.zeros((), dtype=torch.float32, device=dev)
        self._last_actions = torch.zeros(self.num_envs, mj_model.nu, dtype=dt, device=dev)
        self._hit = torch.zeros(self.num_envs, dtype=torch.bool, device=dev)
        self.reset(0)

    def _random_quat(self) -> torch.Tensor:
        q = self.normal((self.num_envs, 4))
        return q / q.norm(dim=1, keepdim=True).clamp(min=1e-9)

    def _sample_reset(self) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.mj_model
        qpos = self.qpos0.expand(self.num_envs, m.nq).clone()
        hand = qpos[:, : self.n_hand] + self.uniform((self.num_envs, self.n_hand), -0.1, 0.1)
        qpos[:, : self.n_hand] = torch.maximum(
            torch.minimum(hand, self._joint_high), self._joint_low
        )
        pos = self.goal_pos + self.uniform((self.num_envs, 3), -0.005, 0.005)
        pos[:, 2] = self.goal_pos[2]
        qpos[:, self.n_hand : self.n_hand + 3] = pos
        qpos[:, self.n_hand + 3 :] = self._random_quat()
        qvel = torch.zeros(self.num_envs, m.nv, dtype=self.sim.dtype, device=self.device)
        return qpos, qvel

    def _on_reset(self, mask: torch.Tensor) -> None:
        m = mask.view(-1, 1)
        self.target_quat = torch.where(m, self._random_quat(), self.target_quat)
        self._last_actions = torch.where(m, 0.0, self._last_actions)
        self.successes.masked_fill_(mask, 0.0)

    def _object(self) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self.sim.field("qpos")
        return qpos[:, self.n_hand : self.n_hand + 3], qpos[:, self.n_hand + 3 :]

    def _task_step(
        self, actions: torch.Tensor, ctrl: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        actions = actions.to(self.sim.dtype)
        self._last_actions = actions
        pos, quat = self._object()
        goal_dist = (pos - self.goal_pos).norm(dim=1)
        rot_dist = rotation_distance(quat, self.target_quat)
        hit = rot_dist.abs() <= self.success_tolerance
        reward = (
            self.dist_reward_scale * goal_dist
            + self.rot_reward_scale / (rot_dist.abs() + self.rot_eps)
            + self.action_penalty_scale * actions.square().sum(dim=1)
            + self.reach_goal_bonus * hit
        )
        self.successes += hit
        self._hit = hit
        self.target_quat = torch.where(hit.view(-1, 1), self._random_quat(), self.target_quat)
        terminated = goal_dist >= self.fall_distance
        if self.max_consecutive_successes > 0:
            terminated |= self.successes >= self.max_consecutive_successes
        return reward, terminated

    def _task_obs(self) -> torch.Tensor:
        qpos, qvel = self.sim.field("qpos"), self.sim.field("qvel")
        h = self.n_hand
        joints = 2.0 * (qpos[:, :h] - self._joint_low) / (self._joint_high - self._joint_low) - 1.0
        pos, quat = self._object()
        return torch.cat(
            [
                joints,
                0.2 * qvel[:, :h],
                pos - self.goal_pos,
                quat,
                qvel[:, h : h + 3],
                0.2 * qvel[:, h + 3 :],
                self.target_quat,
                quat_mul(quat, quat_conj(self.target_quat)),
                self._last_actions,
            ],
            dim=1,
        )

    def _task_features(self) -> torch.Tensor:
        pos, quat = self._object()
        quat = quat / quat.norm(dim=1, keepdim=True).clamp(min=1e-9)
        quat = torch.where(quat[:, :1] < 0, -quat, quat)
        return self.clip_features(torch.cat([quat, pos - self.goal_pos], dim=1))

    def _extra_info(self, done: torch.Tensor) -> dict[str, Any]:
        info = super()._extra_info(done)
        n_done = done.sum()
        finished = (self.successes * done).sum() / n_done.clamp(min=1)
        self.consecutive_successes = torch.where(
            n_done > 0,
            self.av_factor * finished + (1.0 - self.av_factor) * self.consecutive_successes,
            self.consecutive_successes,
        )
        info["successes"] = self.successes.clone()
        info["goal_reached"] = self._hit.clone()
        info["consecutive_successes"] = self.consecutive_successes.clone()
        return info

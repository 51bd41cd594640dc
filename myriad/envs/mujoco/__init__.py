"""MuJoCo tasks on two backends: CPU MuJoCo (threads) and MuJoCo Warp (GPU, or Warp's CPU device).

Every env takes ``backend="mujoco"|"warp"`` and ``model="gymnasium"|"fast"`` (see
:mod:`myriad.envs.mujoco.models`). Importing this package registers the envs lazily: MuJoCo
models are compiled, and Warp imported, only when an env is made.

``BENCH_CASES`` lists the configurations ``myriad bench envs`` measures.
"""

from __future__ import annotations

import importlib.util

from myriad.envs.registry import register

_LOCO = "myriad.envs.mujoco.locomotion"

register(
    "mujoco-ant",
    f"{_LOCO}:AntEnv",
    "Ant, Gymnasium Ant-v5 semantics; features: torso x-y",
    family="mujoco",
)
register(
    "mujoco-halfcheetah",
    f"{_LOCO}:HalfCheetahEnv",
    "HalfCheetah, Gymnasium HalfCheetah-v5 semantics; features: x, pitch",
    family="mujoco",
)
register(
    "mujoco-humanoid",
    f"{_LOCO}:HumanoidEnv",
    "Humanoid, Gymnasium Humanoid-v5 semantics; features: torso x-y",
    family="mujoco",
)
register(
    "mujoco-antmaze-u",
    f"{_LOCO}:AntMazeEnv",
    "Ant in the 5x5 U-maze, sparse goal reward; features: torso x-y (reachable cells)",
    family="mujoco",
    maze="u",
)
register(
    "mujoco-antmaze-medium",
    f"{_LOCO}:AntMazeEnv",
    "Ant in the 8x8 medium maze, sparse goal reward; features: torso x-y (reachable cells)",
    family="mujoco",
    maze="medium",
    max_episode_steps=1000,
)
# The hand's MJCF ships with gymnasium-robotics; without it the env would not build, so it is
# not listed (docs/mujoco.md says what to install).
HAS_HAND = importlib.util.find_spec("gymnasium_robotics") is not None
if HAS_HAND:
    register(
        "mujoco-shadowhand-cube",
        "myriad.envs.mujoco.hand:ShadowHandCubeEnv",
        "Shadow hand in-hand cube reorientation to random targets; features: cube quat + position",
        family="mujoco",
    )

_SIZES = [1, 64, 1024, 4096]


def _cases() -> list[dict]:
    cases = []
    tasks = ["mujoco-ant", "mujoco-halfcheetah", "mujoco-humanoid"]
    if HAS_HAND:
        tasks.append("mujoco-shadowhand-cube")
    for name in tasks:
        for backend in ("mujoco", "warp"):
            for model in ("gymnasium", "fast"):
                cases.append(
                    {
                        "name": name,
                        "options": {"backend": backend, "model": model},
                        "num_envs": list(_SIZES),
                    }
                )
    for name in ("mujoco-antmaze-u", "mujoco-antmaze-medium"):
        for backend in ("mujoco", "warp"):
            cases.append(
                {
                    "name": name,
                    "options": {"backend": backend, "model": "fast"},
                    "num_envs": list(_SIZES),
                }
            )
    return cases


BENCH_CASES: list[dict] = _cases()

__all__ = ["BENCH_CASES"]

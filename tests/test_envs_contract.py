"""Every registered environment honours the VecEnv contract (the env checker)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from myriad.envs import FeatureSpec, TensorVecEnv, UnknownEnvError, make, names, register
from myriad.envs.checker import ContractError, check_env
from myriad.envs.nav import PointNavEnv


@pytest.mark.parametrize("name", names())
def test_registered_env_passes_checker(name: str):
    env = make(name, 4)
    try:
        report = check_env(env, steps=32)
        assert report.ok
    finally:
        env.close()


def test_checker_catches_a_broken_env():
    class NoAutoReset(PointNavEnv):
        """Resets on reset() only: envs that end inside step keep their final state."""

        def reset(self, seed=None):
            self.in_reset = True
            obs = super().reset(seed)
            self.in_reset = False
            return obs

        def _reset_envs(self, mask: torch.Tensor) -> None:
            if getattr(self, "in_reset", False):
                super()._reset_envs(mask)

    env = NoAutoReset(4, layout="u_maze", max_episode_steps=5)
    with pytest.raises(ContractError, match="auto-reset"):
        check_env(env)


def test_checker_catches_features_out_of_bounds():
    env = make("nav-empty", 4)
    env.features = type(env.features)(("x", "y"), (0.0, 0.0), (1.0, 1.0))
    with pytest.raises(ContractError, match="outside declared bounds"):
        check_env(env)


def test_unknown_env_lists_registered_names():
    with pytest.raises(UnknownEnvError) as err:
        make("nav-mase", 1)
    text = str(err.value)
    assert "nav-maze" in text and "Did you mean" in text
    for name in names():
        assert name in text


def test_unknown_option_lists_accepted_options():
    with pytest.raises(TypeError, match=r"accepted: .*layout"):
        make("nav-empty", 1, colour="red")


def test_register_new_env_and_refuse_duplicates():
    register("test-corridor", PointNavEnv, layout="#####\n#S.G#\n#####", max_episode_steps=10)
    env = make("test-corridor", 2)
    assert env.name == "test-corridor" and env.max_episode_steps == 10
    with pytest.raises(ValueError, match="already registered"):
        register("test-corridor", PointNavEnv)


def _doc_rows(doc: str, columns: int) -> dict[str, list[str]]:
    """``name -> cells`` of the docs table rows that start with an env name in backticks."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / doc).read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([a-z0-9-]+)` \|(.*)\|\s*$", line)
        if m and m.group(1) in names():
            cells = [c.strip() for c in m.group(2).split("|")]
            if len(cells) == columns and m.group(1) not in rows:
                rows[m.group(1)] = cells
    return rows


def test_documented_spaces_and_time_limits_match_the_envs():
    """The env tables of docs/mujoco.md (obs, act) and docs/envs.md (time limit) are what the
    registered envs build."""
    mujoco_rows = _doc_rows("mujoco.md", 4)  # description | obs | act | features
    nav_rows = _doc_rows("envs.md", 2)  # description | time limit
    assert {"mujoco-ant", "mujoco-antmaze-u", "mujoco-humanoid"} <= set(mujoco_rows)
    assert {"nav-maze", "nav-empty", "nav-four-rooms"} <= set(nav_rows)
    for name, cells in mujoco_rows.items():
        env = make(name, 1)
        try:
            assert (env.obs_dim, env.action_dim) == (int(cells[1]), int(cells[2])), name
        finally:
            env.close()
    for name, cells in nav_rows.items():
        assert make(name, 1).max_episode_steps == int(cells[1]), name


class _Slider(TensorVecEnv):
    """A point on a line that always starts at 0 (a deterministic start) and stays put under
    zero actions, so its final and reset observations can be equal."""

    def __init__(self, num_envs: int, device="cpu", reset_on_end: bool = True):
        super().__init__(num_envs, device)
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.features = FeatureSpec(("x",), (-1.0,), (1.0,), (10,))
        self.max_episode_steps = 6
        self.reset_on_end = reset_on_end
        self.x = torch.zeros(num_envs, device=self.device)

    def reset(self, seed=None):
        self.x.zero_()
        return super().reset(seed)

    def _reset_envs(self, mask):
        if self.reset_on_end:
            self.x = torch.where(mask, 0.0, self.x)

    def _advance(self, actions):
        self.x = (self.x + 0.1 * actions[:, 0]).clamp(-1.0, 1.0)
        return self.x.abs(), torch.zeros_like(self.x, dtype=torch.bool)

    def _observe(self):
        return self.x[:, None].clone()

    def _features(self):
        return self.x[:, None].clone()


def test_checker_accepts_a_deterministic_start():
    """An env whose every episode starts in the same state (and stays there under zero
    actions) is valid; one that never goes back to that start is caught."""
    assert check_env(_Slider(4), steps=16).ok
    with pytest.raises(ContractError, match="auto-reset"):
        check_env(_Slider(4, reset_on_end=False), steps=16)


def test_every_family_declares_the_task_attributes_that_evaluation_and_figures_read():
    """``task``, ``layout`` and ``goal_pos`` are attributes of every VecEnv (defaults None);
    the families that have them set them, with the shared layout interface."""
    from myriad.envs.base import NO_TASK
    from myriad.envs.layout import Layout

    nav = make("nav-maze", 2, task="none")
    assert nav.task == NO_TASK and not nav.has_task_reward
    assert isinstance(nav.layout, Layout) and nav.goal_pos is None
    assert nav.layout.walls_xy().shape == (nav.layout.width, nav.layout.height)
    assert make("nav-maze", 2, task="sparse").has_task_reward
    cheetah = make("gymnasium", 2, env_id="Pendulum-v1")
    assert (cheetah.task, cheetah.layout, cheetah.goal_pos) == (None, None, None)
    assert cheetah.has_task_reward
    cheetah.close()


def test_the_ant_maze_layout_has_the_nav_layout_interface():
    """AntMaze's walls come out as the nav layout's do: ``[ix, iy]``, y upward, one per cell
    (the coverage map draws them over the features' bounds)."""
    pytest.importorskip("mujoco")
    from myriad.envs.mujoco.models import U_MAZE

    walls = U_MAZE.walls_xy()
    # Rows top to bottom: 11111 / 1r001 / 11101 / 1g001 / 11111; columns x = 2 and 3 read
    # from the bottom row (y = 0) up.
    assert walls.shape == (5, 5) and walls.dtype == np.bool_
    assert walls[:, 0].all() and walls[:, 4].all()
    assert walls[2].tolist() == [True, False, True, False, True]
    assert walls[3].tolist() == [True, False, False, False, True]
    env = make("mujoco-antmaze-u", 1)
    try:
        assert env.layout is U_MAZE and env.task is None and env.goal_pos is None
        assert report_row(env, "task attributes")
    finally:
        env.close()


def report_row(env, check: str) -> bool:
    from myriad.envs.checker import run_checks

    return dict((name, ok) for name, ok, _ in run_checks(env, steps=2).rows)[check]

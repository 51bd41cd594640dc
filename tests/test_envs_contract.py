"""Every registered environment honours the VecEnv contract (the env checker)."""

import pytest
import torch

from myriad.envs import UnknownEnvError, make, names, register
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

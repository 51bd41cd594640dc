"""Adapters both ways between myriad VecEnvs and Gymnasium (>= 1.0) vector environments.

- :class:`GymnasiumVecEnv` wraps any ``gymnasium.vector.VectorEnv`` (for example ``Ant-v5``
  vectorised with ``gymnasium.make_vec``) as a myriad VecEnv: torch tensors on a device, actions
  in ``[-1, 1]`` rescaled to the env's box, ``info["final_obs"]`` as a dense tensor.
- :class:`VecEnvToGymnasium` exposes any myriad VecEnv as a ``gymnasium.vector.VectorEnv`` with
  same-step auto-reset, so existing Gymnasium training code runs on it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from myriad.envs.base import EpisodeStats, FeatureSpec, StepResult, VecEnv, validate_actions
from myriad.envs.registry import EnvConfigError, UnknownEnvError, register
from myriad.utils.tensors import resolve_device


class GymnasiumVecEnv(VecEnv):
    """A ``gymnasium.vector.VectorEnv`` seen as a myriad VecEnv.

    The wrapped env must use ``AutoresetMode.SAME_STEP`` (what :func:`make_gymnasium` builds), so
    the final observation of an ended episode arrives in the same step as the reset observation.

    Args:
        env: the Gymnasium vector env (continuous ``Box`` actions).
        device: torch device for all returned tensors.
        feature_indices: observation entries used as entropy features (default: all).
        feature_low, feature_high: their bounds (default: the observation space's bounds).
        max_episode_steps: the env's time limit (default: read from its spec).
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        device: torch.device | str = "cpu",
        feature_indices: Sequence[int] | None = None,
        feature_low: Sequence[float] | None = None,
        feature_high: Sequence[float] | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        mode = env.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"GymnasiumVecEnv needs a vector env with autoreset_mode=SAME_STEP, got {mode}; "
                "build it with gymnasium.make_vec(..., vector_kwargs={'autoreset_mode': "
                "gymnasium.vector.AutoresetMode.SAME_STEP}) or use myriad.envs.gymnasium."
                "make_gymnasium"
            )
        obs_space, act_space = env.single_observation_space, env.single_action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(f"GymnasiumVecEnv needs a flat Box observation space, got {obs_space}")
        if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
            raise ValueError(f"GymnasiumVecEnv needs a flat Box action space, got {act_space}")
        self.env = env
        self.num_envs = env.num_envs
        self.device = resolve_device(device)
        self.single_observation_space = gym.spaces.Box(
            obs_space.low.astype(np.float32), obs_space.high.astype(np.float32), dtype=np.float32
        )
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, act_space.shape, np.float32)
        self._act_low = torch.as_tensor(act_space.low, dtype=torch.float32)
        self._act_scale = torch.as_tensor(act_space.high - act_space.low, dtype=torch.float32) / 2

        idx = list(range(obs_space.shape[0])) if feature_indices is None else list(feature_indices)
        low = obs_space.low[idx] if feature_low is None else np.asarray(feature_low)
        high = obs_space.high[idx] if feature_high is None else np.asarray(feature_high)
        self._feature_idx = torch.as_tensor(idx, dtype=torch.long, device=self.device)
        self.features = FeatureSpec(
            names=tuple(f"obs[{i}]" for i in idx),
            low=tuple(float(v) for v in low),
            high=tuple(float(v) for v in high),
        )
        if max_episode_steps is None:
            spec = getattr(env, "spec", None)
            max_episode_steps = getattr(spec, "max_episode_steps", None)
        if max_episode_steps is None:
            raise ValueError("the env has no time limit in its spec: pass max_episode_steps")
        self.max_episode_steps = int(max_episode_steps)
        self._obs = torch.zeros(self.num_envs, self.obs_dim, device=self.device)
        self.episode = EpisodeStats(self.num_envs, self.device)

    def _to_torch(self, array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.env.reset(seed=seed)
        self._obs = self._to_torch(obs)
        self.episode.clear()
        return self._obs

    def current_features(self) -> torch.Tensor:
        return self._obs.index_select(1, self._feature_idx)

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = validate_actions(actions, self.num_envs, self.action_dim, self.device)
        scaled = (actions.cpu() + 1.0) * self._act_scale + self._act_low
        obs, reward, terminated, truncated, env_info = self.env.step(scaled.numpy())
        obs_t = self._to_torch(obs)
        reward_t = self._to_torch(reward)
        term_t = self._to_torch(terminated, torch.bool)
        trunc_t = self._to_torch(truncated, torch.bool) & ~term_t
        done = term_t | trunc_t
        final_obs = obs_t.clone()
        if "_final_obs" in env_info:
            mask = np.asarray(env_info["_final_obs"], dtype=bool)
            if mask.any():
                rows = np.stack(
                    [np.asarray(o, dtype=np.float32) for o in env_info["final_obs"][mask]]
                )
                final_obs[torch.as_tensor(mask, device=self.device)] = self._to_torch(rows)
        self.episode.add(reward_t)
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "features": final_obs.index_select(1, self._feature_idx),
            "done": done,
            **self.episode.finish(done),
        }
        self._obs = obs_t
        return obs_t, reward_t, term_t, trunc_t, info

    def close(self) -> None:
        self.env.close()


def make_gymnasium(
    num_envs: int,
    device: torch.device | str = "cpu",
    env_id: str = "Pendulum-v1",
    vectorization_mode: str = "sync",
    feature_indices: Sequence[int] | None = None,
    feature_low: Sequence[float] | None = None,
    feature_high: Sequence[float] | None = None,
    max_episode_steps: int | None = None,
    coverage_cells: int | Sequence[int] | None = None,
    **env_kwargs: Any,
) -> GymnasiumVecEnv:
    """Build ``gymnasium.make_vec(env_id, num_envs, ...)`` with same-step auto-reset, wrapped.

    Args:
        env_id: any registered Gymnasium id with flat Box spaces, e.g. ``"Hopper-v5"`` (ids
            registered by a module imported first, ``env.module`` on the command line, too).
        vectorization_mode: ``"sync"`` (one process) or ``"async"`` (one process per env).
        feature_indices: observation entries used as entropy features (None: all of them).
        feature_low, feature_high: the features' bounds (None: the observation space's).
        max_episode_steps: time limit (None: the one in the env's spec).
        coverage_cells: coverage grid cells per feature (an int for all, or one per feature);
            None: a grid when every feature bound is finite and there are at most 3 features
            (:func:`auto_cells`), else no coverage; 0: no coverage.
        **env_kwargs: passed to the Gymnasium env constructor.

    Raises:
        UnknownEnvError: ``env_id`` is not registered with Gymnasium.
        EnvConfigError: a feature index is outside the observation, the spaces are not flat
            Boxes, the env has no time limit, or the coverage grid is unusable.
    """
    spec = gymnasium_spec(env_id)
    if max_episode_steps is None and spec.max_episode_steps is None:
        raise EnvConfigError(
            f"Gymnasium env {env_id!r} has no time limit in its spec: give one with "
            "env.options.max_episode_steps=N (Python: max_episode_steps=N)"
        )
    kwargs: dict[str, Any] = dict(env_kwargs)
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    env = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode=vectorization_mode,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **kwargs,
    )
    try:
        _check_features(env_id, env.single_observation_space, feature_indices)
        wrapped = GymnasiumVecEnv(
            env, device, feature_indices, feature_low, feature_high, max_episode_steps
        )
        cells = _coverage_cells(env_id, wrapped.features, coverage_cells)
    except ValueError as exc:
        env.close()
        if isinstance(exc, EnvConfigError):
            raise
        raise EnvConfigError(f"Gymnasium env {env_id!r}: {exc}") from exc
    if cells:
        wrapped.features = replace(wrapped.features, cells=cells)
    return wrapped


def gymnasium_spec(env_id: str) -> Any:
    """``gymnasium.spec(env_id)``; an unknown id raises :class:`UnknownEnvError` with
    Gymnasium's suggestion and how to register one."""
    try:
        return gym.spec(env_id)
    except gym.error.Error as exc:
        raise UnknownEnvError(
            f"unknown Gymnasium env id {env_id!r}: {exc} Give env.id=<a registered id> (see "
            "gymnasium.pprint_registry()), or env.module=<your package> to import the module "
            "that registers it"
        ) from exc


def _check_features(env_id: str, space: gym.Space, indices: Sequence[int] | None) -> None:
    if indices is None or not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        return
    size = int(space.shape[0])
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < size]
    if not list(indices) or bad:
        what = f"indices {bad} are" if bad else "an empty list is"
        raise EnvConfigError(
            f"entropy features of {env_id!r}: {what} not observation indices; its observation "
            f"has {size} entries, give env.features=[i, ...] with each i in 0..{size - 1} "
            "(or null for the whole observation)"
        )
    if len(set(indices)) != len(list(indices)):
        raise EnvConfigError(
            f"entropy features of {env_id!r}: {list(indices)} names an index twice; give each "
            "observation index once"
        )


#: Most cells a coverage grid may have (its visited mask is kept per member).
MAX_COVERAGE_CELLS = 1 << 20


def auto_cells(features: FeatureSpec) -> tuple[int, ...]:
    """The default coverage grid: 32 cells per feature for 1-2 features, 16 for 3, none for
    more features or any infinite bound (coverage is then not reported)."""
    bounded = all(np.isfinite(v) for v in (*features.low, *features.high))
    if not bounded or features.dim > 3:
        return ()
    return (32 if features.dim <= 2 else 16,) * features.dim


def _coverage_cells(
    env_id: str, features: FeatureSpec, cells: int | Sequence[int] | None
) -> tuple[int, ...]:
    if cells is None:
        return auto_cells(features)
    per = (int(cells),) * features.dim if isinstance(cells, int) else tuple(int(c) for c in cells)
    if per == (0,) * features.dim:
        return ()
    if len(per) != features.dim or min(per) < 1:
        raise EnvConfigError(
            f"coverage_cells of {env_id!r} must be 0, one int, or {features.dim} positive ints "
            f"(one per feature), got {cells}"
        )
    if not all(np.isfinite(v) for v in (*features.low, *features.high)):
        raise EnvConfigError(
            f"coverage of {env_id!r} needs finite feature bounds, got low={features.low} "
            f"high={features.high}: give env.options.feature_low=[...] and feature_high=[...]"
        )
    if int(np.prod(per)) > MAX_COVERAGE_CELLS:
        raise EnvConfigError(
            f"coverage_cells {list(per)} make {int(np.prod(per)):,} cells (at most "
            f"{MAX_COVERAGE_CELLS:,}): use fewer cells or fewer features"
        )
    return per


class VecEnvToGymnasium(gym.vector.VectorEnv):
    """A myriad VecEnv exposed as a ``gymnasium.vector.VectorEnv`` (same-step auto-reset).

    Steps return NumPy arrays by default (``as_numpy=False`` keeps torch tensors on the env's
    device). Ended episodes report ``info["final_obs"]`` as an object array with the mask
    ``info["_final_obs"]``, the Gymnasium 1.x convention.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012

    def __init__(self, env: VecEnv, as_numpy: bool = True) -> None:
        self.venv = env
        self.as_numpy = as_numpy
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = batch_space(env.single_observation_space, env.num_envs)
        self.action_space = batch_space(env.single_action_space, env.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def _out(self, value: torch.Tensor) -> Any:
        return value.cpu().numpy() if self.as_numpy else value

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if isinstance(seed, list):
            seed = seed[0]
        return self._out(self.venv.reset(seed=seed)), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        act = torch.as_tensor(actions, dtype=torch.float32, device=self.venv.device)
        obs, reward, terminated, truncated, info = self.venv.step(act)
        done = info["done"]
        out_info: dict[str, Any] = {}
        done_np = done.cpu().numpy()
        if done_np.any():
            final = np.empty(self.num_envs, dtype=object)
            final_obs = info["final_obs"].cpu().numpy()
            for i in np.flatnonzero(done_np):  # only the envs that ended, as Gymnasium does
                final[i] = final_obs[i]
            out_info["final_obs"] = final
            out_info["_final_obs"] = done_np
        return (
            self._out(obs),
            self._out(reward),
            self._out(terminated),
            self._out(truncated),
            out_info,
        )

    def close_extras(self, **kwargs: Any) -> None:
        self.venv.close()


register(
    "gymnasium",
    make_gymnasium,
    description="any Gymnasium env with Box spaces via gymnasium.make_vec (option env_id, "
    "default Pendulum-v1; CLI: env=gymnasium env.id=...)",
    family="gymnasium",
)


class MyriadEnv(gym.Env):
    """One myriad env as a single ``gymnasium.Env`` (NumPy in and out): the Gymnasium entry
    point of myriad's own envs, so a Minari dataset's ``recover_environment()`` rebuilds them.

    ``gymnasium.make(myriad_env_spec({"name": "nav-maze", "options": {...}}))`` builds it.
    An episode that ends inside the wrapped env is reset there; ``step`` returns the episode's
    final observation and the next :meth:`reset` starts a fresh one.

    Args:
        env: the registry name (``myriad envs``).
        options: the env's options.
        module: a module to import first (the one that registers ``env``).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012

    def __init__(
        self, env: str, options: dict[str, Any] | None = None, module: str | None = None
    ) -> None:
        from myriad.envs.registry import import_env_modules, make

        import_env_modules(module)
        self.venv = make(env, 1, "cpu", **dict(options or {}))
        self.observation_space = self.venv.single_observation_space
        self.action_space = self.venv.single_action_space

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:  # Gymnasium's np_random, seeded once, drives the unseeded resets
            seed = int(self.np_random.integers(2**31))
        obs = self.venv.reset(seed=seed)
        return obs[0].numpy(), {"features": self.venv.current_features()[0].numpy()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        act = torch.as_tensor(np.asarray(action, dtype=np.float32)).reshape(1, -1)
        _, reward, terminated, truncated, info = self.venv.step(act)
        return (
            info["final_obs"][0].numpy(),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            {"features": info["features"][0].numpy()},
        )

    def close(self) -> None:
        self.venv.close()


#: Options of the ``gymnasium`` env that myriad reads (the others go to the env's constructor).
_ADAPTER_OPTIONS = (
    "env_id",
    "vectorization_mode",
    "feature_indices",
    "feature_low",
    "feature_high",
    "coverage_cells",
    "max_episode_steps",
)


def myriad_env_spec(env_cfg: dict[str, Any]) -> gym.envs.registration.EnvSpec:
    """The ``gymnasium.envs.registration.EnvSpec`` that rebuilds the env of a run config
    (``{"name", "options", "module"}``) as a single Gymnasium env acting as myriad's does.

    - ``gymnasium``: the env's own spec (its kwargs, the run's time limit) with actions rescaled
      from ``[-1, 1]`` (``RescaleAction``) and float32 observations (``DtypeObservation``),
      myriad's view of it.
    - any other env: :class:`MyriadEnv` (id ``myriad/<name>-v0``).

    Raises:
        UnknownEnvError: the env or the Gymnasium id is not registered.
    """
    from gymnasium.envs.registration import EnvSpec, WrapperSpec

    from myriad.envs.registry import entry, import_env_modules, make

    name = str(env_cfg["name"])
    options = dict(env_cfg.get("options") or {})
    module = env_cfg.get("module") or None
    import_env_modules(module)
    if name != "gymnasium":
        entry(name)  # an unknown name fails here, not when the spec is used
        limit = make(name, 1, "cpu", **options).max_episode_steps
        return EnvSpec(
            id=f"myriad/{name}-v0",
            entry_point="myriad.envs.gymnasium:MyriadEnv",
            max_episode_steps=limit,
            kwargs={"env": name, "options": options, "module": module},
            disable_env_checker=True,
        )
    env_id = str(options.get("env_id", "Pendulum-v1"))
    spec = gymnasium_spec(env_id)
    env_kwargs = {k: v for k, v in options.items() if k not in _ADAPTER_OPTIONS}
    wrappers = (
        WrapperSpec(
            "RescaleAction",
            "gymnasium.wrappers:RescaleAction",
            {"min_action": -1.0, "max_action": 1.0},
        ),
        WrapperSpec(
            "DtypeObservation", "gymnasium.wrappers:DtypeObservation", {"dtype": "float32"}
        ),
    )
    return replace(
        spec,
        kwargs={**spec.kwargs, **env_kwargs},
        max_episode_steps=options.get("max_episode_steps") or spec.max_episode_steps,
        additional_wrappers=(*spec.additional_wrappers, *wrappers),
    )
